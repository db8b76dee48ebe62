"""The wrappers of `fflow.lax` over the primitives (JAX's `jax.lax` names), for use
inside fflow: primitives' rules and the transforms import this module, which sits
below them (it finds primitives in fflow.core's registry). The public namespace is
`fflow.lax` (fflow/lax.py), which adds the control-flow and extra wrappers.

Binary ops take operands of one shape and dtype; a Python scalar operand is
converted to the other operand's dtype and broadcast, as `jax.lax` allows.

Example:
    >>> import fflow.numpy as jnp
    >>> from fflow import lax
    >>> lax.add(jnp.ones(2), 1.0).tolist()
    [2.0, 2.0]
"""

import builtins

import numpy as np

from fflow import dtypes
from fflow.array import Array
from fflow.core import aval_of_value, primitives
from fflow.errors import ShapeError, user_error
from fflow.tree_util import tree_map


class _Primitives:
    """`_p.sin_p` is the primitive named "sin" from fflow.core's registry, looked up on
    first use and kept: the primitive modules sit above this one (their rules use these
    wrappers), so they cannot be imported here."""

    def __getattr__(self, attr):
        prim = primitives.get(attr.removesuffix("_p")) if attr.endswith("_p") else None
        if prim is None:
            raise AttributeError(f"no primitive for {attr!r}")
        setattr(self, attr, prim)
        return prim


_p = _Primitives()


def _is_scalar(x):
    return isinstance(x, (bool, int, float, complex))


def _match(x, y):
    """Convert a Python scalar operand to the other operand's aval."""
    if _is_scalar(y) and not _is_scalar(x):
        a = aval_of_value(x)
        return x, full(a.shape, y, a.dtype)
    if _is_scalar(x) and not _is_scalar(y):
        a = aval_of_value(y)
        return full(a.shape, x, a.dtype), y
    if _is_scalar(x) and _is_scalar(y):
        dt, _ = dtypes.promote_pairs((aval_of_value(x).dtype, True), (aval_of_value(y).dtype, True))
        return _weak_scalar(x, dt), _weak_scalar(y, dt)
    return x, y


def _weak_scalar(x, dtype=None):
    """A Python scalar as a weakly typed array of JAX's default dtype (not float64)."""
    return Array(np.asarray(x, dtype or dtypes.python_scalar_dtype(x)), weak_type=True)


def _unary(name):
    def op(x):
        if _is_scalar(x):
            x = _weak_scalar(x)
        return getattr(_p, name + "_p").bind(x)

    op.__name__ = name
    op.__doc__ = f"Elementwise `{name}` (the `{name}` primitive)."
    return op


def _binary(name):
    def op(x, y):
        x, y = _match(x, y)
        return getattr(_p, name + "_p").bind(x, y)

    op.__name__ = name
    op.__doc__ = f"Elementwise `{name}` of two operands of one shape and dtype."
    return op


neg = _unary("neg")
sin = _unary("sin")
cos = _unary("cos")
tan = _unary("tan")
asin = _unary("asin")
acos = _unary("acos")
atan = _unary("atan")
sinh = _unary("sinh")
cosh = _unary("cosh")
tanh = _unary("tanh")
asinh = _unary("asinh")
acosh = _unary("acosh")
atanh = _unary("atanh")
exp = _unary("exp")
exp2 = _unary("exp2")
expm1 = _unary("expm1")
log = _unary("log")
log1p = _unary("log1p")
sqrt = _unary("sqrt")
rsqrt = _unary("rsqrt")
cbrt = _unary("cbrt")
logistic = _unary("logistic")
erf = _unary("erf")
erf_inv = _unary("erf_inv")
abs = _unary("abs")  # noqa: A001
sign = _unary("sign")
floor = _unary("floor")
ceil = _unary("ceil")
is_finite = _unary("is_finite")
bitwise_not = _unary("not")
square = _unary("square")
population_count = _unary("population_count")
stop_gradient_ = _unary("stop_gradient")

add = _binary("add")
sub = _binary("sub")
mul = _binary("mul")
div = _binary("div")
rem = _binary("rem")
pow = _binary("pow")  # noqa: A001
max = _binary("max")  # noqa: A001
min = _binary("min")  # noqa: A001
atan2 = _binary("atan2")
nextafter = _binary("nextafter")
eq = _binary("eq")
ne = _binary("ne")
lt = _binary("lt")
le = _binary("le")
gt = _binary("gt")
ge = _binary("ge")
bitwise_and = _binary("and")
bitwise_or = _binary("or")
bitwise_xor = _binary("xor")
shift_left = _binary("shift_left")
shift_right_logical = _binary("shift_right_logical")
shift_right_arithmetic = _binary("shift_right_arithmetic")


def round(x, rounding_method=0):  # noqa: A001
    """Round half away from zero (method 0) or half to even (method 1)."""
    p = _p
    return (p.round_even_p if rounding_method == 1 else p.round_p).bind(x)


def integer_pow(x, y):
    """x ** y for a static Python int `y`."""
    return _p.integer_pow_p.bind(x, y=int(y))


def stop_gradient(x):
    """The identity whose derivative is zero (on every leaf of a pytree)."""
    return tree_map(stop_gradient_, x)


def select_n(which, *cases):
    """cases[which] elementwise; a bool `which` picks cases[1] where True."""
    return _p.select_n_p.bind(which, *cases)


def select(pred, on_true, on_false):
    """JAX's lax.select: on_true where pred else on_false."""
    return select_n(pred, on_false, on_true)


def bitcast_convert_type(operand, new_dtype):
    """Reinterpret the bits of `operand` as `new_dtype` (of the same width)."""
    if _is_scalar(operand):
        operand = _weak_scalar(operand)
    return _p.bitcast_convert_type_p.bind(operand, new_dtype=dtypes.canonicalize(new_dtype))


def convert_element_type(x, new_dtype, weak_type=False):
    """Cast to `new_dtype`."""
    new_dtype = dtypes.canonicalize(new_dtype)
    if _is_scalar(x):
        return np.asarray(x, new_dtype)
    if aval_of_value(x).dtype == new_dtype and not aval_of_value(x).weak_type:
        return x
    return _p.convert_element_type_p.bind(x, new_dtype=new_dtype, weak_type=weak_type)


def full(shape, fill_value, dtype=None):
    """An array of `shape` filled with `fill_value` (a scalar, possibly traced)."""
    shape = tuple(int(d) for d in (shape if isinstance(shape, (tuple, list)) else (shape,)))
    if _is_scalar(fill_value) or isinstance(fill_value, (np.ndarray, np.generic)):
        if dtype is None:
            dtype = (
                dtypes.python_scalar_dtype(fill_value)
                if _is_scalar(fill_value)
                else np.asarray(fill_value).dtype
            )
        value = dtypes.scalar_to(fill_value, dtypes.canonicalize(dtype))
    else:
        value = fill_value
        if dtype is not None:
            value = convert_element_type(value, dtype)
    return broadcast_in_dim(value, shape, ())


def full_like(x, fill_value, dtype=None, shape=None):
    aval = aval_of_value(x)
    out = full(
        aval.shape if shape is None else shape, fill_value, aval.dtype if dtype is None else dtype
    )
    if dtype is None and aval.weak_type:  # JAX: a weakly typed x gives a weak result
        if isinstance(out, np.ndarray):
            return Array(out, weak_type=True)
        if not aval_of_value(out).weak_type:
            return _p.convert_element_type_p.bind(out, new_dtype=aval.dtype, weak_type=True)
    return out


def zeros_like(x):
    return full_like(x, 0)


def broadcast_in_dim(x, shape, broadcast_dimensions):
    shape = tuple(int(d) for d in shape)
    broadcast_dimensions = tuple(int(d) for d in broadcast_dimensions)
    aval = aval_of_value(x)
    if aval.shape == shape and broadcast_dimensions == tuple(range(len(shape))):
        return x
    return _p.broadcast_in_dim_p.bind(x, shape=shape, broadcast_dimensions=broadcast_dimensions)


def broadcast(x, sizes):
    """Add leading dimensions `sizes`."""
    aval = aval_of_value(x)
    n = len(sizes)
    return broadcast_in_dim(x, tuple(sizes) + aval.shape, tuple(range(n, n + aval.ndim)))


def reshape(x, new_sizes, dimensions=None):
    new_sizes = tuple(int(d) for d in new_sizes)
    if dimensions is not None:
        x = transpose(x, dimensions)
    if aval_of_value(x).shape == new_sizes:
        return x
    return _p.reshape_p.bind(x, new_sizes=new_sizes)


def transpose(x, permutation):
    permutation = tuple(int(p) for p in permutation)
    if permutation == tuple(range(len(permutation))):
        return x
    return _p.transpose_p.bind(x, permutation=permutation)


def squeeze(x, dimensions):
    dimensions = tuple(sorted(int(d) for d in dimensions))
    return _p.squeeze_p.bind(x, dimensions=dimensions)


def expand_dims(x, dimensions):
    aval = aval_of_value(x)
    ndim = aval.ndim + len(dimensions)
    dims = sorted(d % ndim for d in dimensions)
    shape = list(aval.shape)
    for d in dims:
        shape.insert(d, 1)
    return reshape(x, shape)


def slice(x, start_indices, limit_indices, strides=None):  # noqa: A001
    start_indices = tuple(int(i) for i in start_indices)
    limit_indices = tuple(int(i) for i in limit_indices)
    strides = None if strides is None else tuple(int(s) for s in strides)
    if strides is not None and all(s == 1 for s in strides):
        strides = None
    aval = aval_of_value(x)
    if strides is None and start_indices == (0,) * aval.ndim and limit_indices == aval.shape:
        return x
    return _p.slice_p.bind(
        x, start_indices=start_indices, limit_indices=limit_indices, strides=strides
    )


def slice_in_dim(x, start, limit, stride=1, axis=0):
    aval = aval_of_value(x)
    starts = [0] * aval.ndim
    limits = list(aval.shape)
    strides = [1] * aval.ndim
    starts[axis], limits[axis], strides[axis] = start, limit, stride
    return slice(x, starts, limits, strides)


def index_in_dim(x, index, axis=0, keepdims=True):
    out = slice_in_dim(x, index, index + 1, 1, axis)
    return out if keepdims else squeeze(out, (axis,))


def pad(x, padding_value, padding_config):
    padding_config = tuple(tuple(int(v) for v in c) for c in padding_config)
    dtype = aval_of_value(x).dtype
    if _is_scalar(padding_value):
        padding_value = np.asarray(padding_value, dtype)
    return _p.pad_p.bind(x, padding_value, padding_config=padding_config)


def concatenate(operands, dimension):
    operands = list(operands)
    if len(operands) == 1:
        return operands[0]
    return _p.concatenate_p.bind(*operands, dimension=int(dimension))


def rev(x, dimensions):
    return _p.rev_p.bind(x, dimensions=tuple(int(d) for d in dimensions))


def iota(dtype, size):
    return broadcasted_iota(dtype, (size,), 0)


def broadcasted_iota(dtype, shape, dimension):
    return _p.iota_p.bind(
        dtype=dtypes.canonicalize(dtype),
        shape=tuple(int(s) for s in shape),
        dimension=int(dimension),
    )


def _index_scalar(i):
    if _is_scalar(i):
        return np.asarray(i, np.int32)
    aval = aval_of_value(i)
    if aval.shape != ():
        raise user_error(ShapeError, f"start indices must be scalars, got shape {aval.shape}")
    return i


def _wrap_starts(x, start_indices):
    """JAX's index normalisation: a negative start counts from the end (i + dim);
    the primitive then clamps the window into bounds."""
    shape = aval_of_value(x).shape
    if len(start_indices) != len(shape):
        return [_index_scalar(i) for i in start_indices]  # the shape rule says why
    out = []
    for i, d in zip(start_indices, shape):
        i = _index_scalar(i)
        if isinstance(i, (np.ndarray, np.generic)):
            if i.dtype.kind == "i" and i < 0:
                i = np.asarray(i + d, i.dtype)
        elif aval_of_value(i).dtype.kind == "i":
            i = select(lt(i, full((), 0, i.dtype)), add(i, full((), d, i.dtype)), i)
        out.append(i)
    return out


def dynamic_slice(x, start_indices, slice_sizes):
    """The window of `slice_sizes` at `start_indices` (negative starts count from the
    end; the window is clamped into bounds, as in JAX).

    Example:
        >>> import fflow.numpy as jnp
        >>> from fflow import lax
        >>> lax.dynamic_slice(jnp.arange(5.0), (-2,), (2,)).tolist()
        [3.0, 4.0]
    """
    starts = _wrap_starts(x, list(start_indices))
    return _p.dynamic_slice_p.bind(x, *starts, slice_sizes=tuple(int(s) for s in slice_sizes))


def dynamic_update_slice(x, update, start_indices):
    """`x` with `update` written at `start_indices` (negative starts count from the
    end; the window is clamped into bounds, as in JAX)."""
    starts = _wrap_starts(x, list(start_indices))
    return _p.dynamic_update_slice_p.bind(x, update, *starts)


def dynamic_slice_in_dim(x, start_index, slice_size, axis=0):
    aval = aval_of_value(x)
    starts = [0] * aval.ndim
    sizes = list(aval.shape)
    starts[axis] = start_index
    sizes[axis] = slice_size
    return dynamic_slice(x, starts, sizes)


def dynamic_index_in_dim(x, index, axis=0, keepdims=True):
    out = dynamic_slice_in_dim(x, index, 1, axis)
    return out if keepdims else squeeze(out, (axis,))


def dynamic_update_slice_in_dim(x, update, start_index, axis):
    starts = [0] * aval_of_value(x).ndim
    starts[axis] = start_index
    return dynamic_update_slice(x, update, starts)


def gather(x, indices, axes):
    """x indexed on `axes` by `indices` (shape batch + (len(axes),)); OOB clamps."""
    return _p.gather_p.bind(x, indices, axes=tuple(int(a) for a in axes))


def scatter_add(x, indices, updates, axes):
    return _p.scatter_add_p.bind(x, indices, updates, axes=tuple(int(a) for a in axes))


def scatter(x, indices, updates, axes):
    return _p.scatter_p.bind(x, indices, updates, axes=tuple(int(a) for a in axes))


def scatter_mul(x, indices, updates, axes):
    return _p.scatter_mul_p.bind(x, indices, updates, axes=tuple(int(a) for a in axes))


def scatter_min(x, indices, updates, axes):
    return _p.scatter_min_p.bind(x, indices, updates, axes=tuple(int(a) for a in axes))


def scatter_max(x, indices, updates, axes):
    return _p.scatter_max_p.bind(x, indices, updates, axes=tuple(int(a) for a in axes))


def take_along_axis(x, indices, axis):
    """x[..., indices, ...] along `axis` (NumPy's take_along_axis; out-of-range indices
    clamp): `indices` has x's shape except along `axis` (negative counts from the end)."""
    axis = canonical_axis(int(axis), aval_of_value(x).ndim)
    return _p.take_along_axis_p.bind(x, indices, axis=axis)


def scatter_add_along_axis(x, indices, updates, axis):
    """x with `updates` added at `indices` along `axis` (repeats accumulate; out-of-range
    indices clamp): take_along_axis's transpose; `updates` is shaped like `indices`."""
    axis = canonical_axis(int(axis), aval_of_value(x).ndim)
    return _p.scatter_add_along_axis_p.bind(x, indices, updates, axis=axis)


def canonical_axis(axis, ndim, what="axis"):
    """`axis` in [0, ndim) (negative counts from the end); a clear error outside."""
    n = builtins.max(ndim, 1)
    if not -ndim <= axis < n:
        raise user_error(
            ShapeError,
            f"{what} {axis} is out of bounds for an array of dimension {ndim}. Fix: an "
            f"{what} in [{-n}, {n}) (negative counts from the end).",
        )
    return axis % n


def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
    (lc, rc), (lb, rb) = dimension_numbers
    dn = (
        (tuple(int(i) for i in lc), tuple(int(i) for i in rc)),
        (tuple(int(i) for i in lb), tuple(int(i) for i in rb)),
    )
    if preferred_element_type is not None:
        preferred_element_type = dtypes.canonicalize(preferred_element_type)
    return _p.dot_general_p.bind(
        lhs, rhs, dimension_numbers=dn, preferred_element_type=preferred_element_type
    )


def dot(lhs, rhs, precision=None, preferred_element_type=None):
    """Matrix/vector product contracting lhs's last and rhs's first dimension."""
    la, ra = aval_of_value(lhs), aval_of_value(rhs)
    return dot_general(
        lhs,
        rhs,
        (((la.ndim - 1,), (0 if ra.ndim == 1 else ra.ndim - 2,)), ((), ())),
        preferred_element_type=preferred_element_type,
    )


def _axes(axes):
    return tuple(sorted(int(a) for a in axes))


def reduce_sum(x, axes):
    return _p.reduce_sum_p.bind(x, axes=_axes(axes))


def reduce_max(x, axes):
    return _p.reduce_max_p.bind(x, axes=_axes(axes))


def reduce_min(x, axes):
    return _p.reduce_min_p.bind(x, axes=_axes(axes))


def reduce_prod(x, axes):
    return _p.reduce_prod_p.bind(x, axes=_axes(axes))


def reduce_or(x, axes):
    return _p.reduce_or_p.bind(x, axes=_axes(axes))


def reduce_and(x, axes):
    return _p.reduce_and_p.bind(x, axes=_axes(axes))


def argmax(x, axis, index_dtype=np.int32):
    return _p.argmax_p.bind(x, axes=(int(axis),), index_dtype=np.dtype(index_dtype))


def argmin(x, axis, index_dtype=np.int32):
    return _p.argmin_p.bind(x, axes=(int(axis),), index_dtype=np.dtype(index_dtype))


def cumsum(x, axis=0, reverse=False):
    return _p.cumsum_p.bind(x, axis=int(axis), reverse=bool(reverse))


def cumprod(x, axis=0, reverse=False):
    return _p.cumprod_p.bind(x, axis=int(axis), reverse=bool(reverse))


def cummax(x, axis=0, reverse=False):
    return _p.cummax_p.bind(x, axis=int(axis), reverse=bool(reverse))


def cummin(x, axis=0, reverse=False):
    return _p.cummin_p.bind(x, axis=int(axis), reverse=bool(reverse))


def sort(operand, dimension=-1, is_stable=True, num_keys=1):
    """Sort one array, or a sequence of arrays by the first `num_keys` of them."""
    if isinstance(operand, (list, tuple)):
        ndim = aval_of_value(operand[0]).ndim
        return _p.sort_p.bind(
            *operand, dimension=int(dimension) % builtins.max(ndim, 1), num_keys=num_keys
        )
    ndim = aval_of_value(operand).ndim
    return _p.sort_p.bind(operand, dimension=int(dimension) % builtins.max(ndim, 1), num_keys=1)[0]


def clamp(min, x, max):  # noqa: A002
    """JAX's lax.clamp(min, x, max)."""
    return globals()["min"](globals()["max"](x, min), max)


__all__ = [
    "abs",
    "acos",
    "acosh",
    "add",
    "argmax",
    "argmin",
    "asin",
    "asinh",
    "atan",
    "atan2",
    "atanh",
    "bitwise_and",
    "bitwise_not",
    "bitwise_or",
    "bitwise_xor",
    "broadcast",
    "broadcast_in_dim",
    "broadcasted_iota",
    "cbrt",
    "ceil",
    "clamp",
    "concatenate",
    "bitcast_convert_type",
    "convert_element_type",
    "population_count",
    "cos",
    "cosh",
    "cummax",
    "cummin",
    "cumprod",
    "cumsum",
    "div",
    "dot",
    "dot_general",
    "dynamic_index_in_dim",
    "dynamic_slice",
    "dynamic_slice_in_dim",
    "dynamic_update_slice",
    "dynamic_update_slice_in_dim",
    "eq",
    "erf",
    "erf_inv",
    "exp",
    "exp2",
    "expand_dims",
    "expm1",
    "floor",
    "full",
    "full_like",
    "gather",
    "ge",
    "gt",
    "index_in_dim",
    "integer_pow",
    "iota",
    "is_finite",
    "le",
    "log",
    "log1p",
    "logistic",
    "lt",
    "max",
    "min",
    "mul",
    "ne",
    "neg",
    "nextafter",
    "pad",
    "pow",
    "reduce_and",
    "reduce_max",
    "reduce_min",
    "reduce_or",
    "reduce_prod",
    "reduce_sum",
    "rem",
    "reshape",
    "rev",
    "round",
    "rsqrt",
    "scatter",
    "scatter_add",
    "scatter_add_along_axis",
    "scatter_max",
    "scatter_min",
    "scatter_mul",
    "select",
    "select_n",
    "shift_left",
    "shift_right_arithmetic",
    "shift_right_logical",
    "sign",
    "sin",
    "sinh",
    "slice",
    "slice_in_dim",
    "sort",
    "sqrt",
    "square",
    "squeeze",
    "stop_gradient",
    "stop_gradient_",
    "sub",
    "take_along_axis",
    "tan",
    "tanh",
    "transpose",
    "zeros_like",
]
