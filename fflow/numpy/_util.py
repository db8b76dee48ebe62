"""Operand handling for fflow.numpy: dtype promotion (JAX's lattice, weak Python
scalars) and NumPy broadcasting made explicit with `broadcast_in_dim`."""

import numpy as np

from fflow import core, dtypes
from fflow import lax_ops as lax
from fflow.api_util import asarray_value
from fflow.array import Array, root_trace
from fflow.core import Tracer
from fflow.errors import ShapeError, user_error
from fflow.primitives.convert import convert_element_type_p

_SCALARS = (int, float, bool, complex)


def info(x):
    """(dtype, weak, shape) of an operand without converting it."""
    t = type(x)
    if t is Array:
        v = x._value
        return v.dtype, x._weak, v.shape
    if isinstance(x, Tracer):
        a = x.aval
        return a.dtype, a.weak_type, a.shape
    if t in _SCALARS:
        return dtypes.python_scalar_dtype(x), True, ()
    if t is np.ndarray:
        return dtypes.canonical(x.dtype), False, x.shape
    if isinstance(x, np.generic):
        return dtypes.canonical(x.dtype), False, ()
    if isinstance(x, Array):
        return x.dtype, x._weak, x.shape
    arr = asarray_value(x)
    return arr.dtype, False, arr.shape


def default_dtype_array(arr):
    """`arr` in its canonical dtype (64-bit -> 32-bit unless x64 is on, as in JAX)."""
    return dtypes.canonical_array(arr)


def operand(x):
    """Make `x` an fflow value (Array or Tracer): functions that compute nothing (a
    no-op transpose, a sum over no axes) still return an fflow Array, never a view of
    the caller's NumPy buffer."""
    t = type(x)
    if t is Array or isinstance(x, Tracer):
        return x
    if t is np.ndarray:
        return Array(_own_canonical(x))
    if t in _SCALARS:
        return Array(np.asarray(x, dtypes.python_scalar_dtype(x)), weak_type=True)
    if isinstance(x, np.generic):
        return Array(dtypes.canonical_array(np.asarray(x)))
    if isinstance(x, Array):
        return x
    if t is list or t is tuple:
        raise user_error(
            TypeError,
            f"jax.numpy functions take arrays or scalars, not a Python {t.__name__} (as JAX: "
            f"a list would be traced element by element). Fix: jnp.asarray(...) it first.",
        )
    return Array(asarray_value(x))


def _own_canonical(x):
    """A NumPy array in its canonical dtype that does not alias the caller's buffer."""
    narrow = dtypes.canonical_array(x)
    return narrow if narrow is not x else x.copy()


def convert(x, dtype):
    """`x` as `dtype` (a cast primitive for traced/array values)."""
    t = type(x)
    if t in _SCALARS:
        return dtypes.scalar_to(x, dtype)
    if t is np.ndarray or isinstance(x, np.generic):
        return x if x.dtype == dtype else np.asarray(x, dtype)
    x = operand(x)
    if info(x)[0] == dtype:
        return x
    return lax.convert_element_type(x, dtype)


def broadcast_shapes(*shapes):
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise user_error(
            ShapeError,
            "operands could not be broadcast together with shapes "
            + " ".join(str(tuple(s)) for s in shapes)
            + ". Fix: reshape or transpose one operand so trailing dimensions match.",
        ) from None


def broadcast_to_shape(x, shape):
    """NumPy-broadcast `x` (already converted) to `shape` with broadcast_in_dim."""
    _, _, xs = info(x)
    if tuple(xs) == tuple(shape):
        return x
    nd = len(shape)
    dims = tuple(range(nd - len(xs), nd))
    if isinstance(x, np.ndarray) and (x.ndim > 0 or core._state.trace is root_trace):
        # a constant: broadcasting it now keeps programs small (a view, no copy); a
        # scalar is staged as a broadcast under tracing but is just a view eagerly
        return np.broadcast_to(x, shape)
    return lax.broadcast_in_dim(x, shape, dims)


def promote_dtypes(*args):
    """The common (dtype, weak) of operands under JAX's promotion rules."""
    infos = [info(a) for a in args]
    first = infos[0][0]
    if all(i[0] == first for i in infos):
        return first, all(i[1] for i in infos)
    return dtypes.promote_pairs(*[(i[0], i[1]) for i in infos])


def promote_inexact(*args):
    """JAX's promote_dtypes_inexact: the operands cast (not broadcast) to their common
    inexact dtype (ints -> the default float); weakly typed when every operand is."""
    dtype, weak = promote_dtypes(*args)
    if not dtypes.is_inexact(dtype):
        dtype = dtypes.float_
    out = []
    for a in args:
        a = operand(a)
        if info(a)[0] != dtype or info(a)[1] != weak:
            a = lax.convert_element_type(a, dtype, weak_type=weak)
        out.append(a)
    return out


def promote(*args, to_inexact=False):
    """Convert operands to their common dtype and broadcast them to one shape."""
    infos = [info(a) for a in args]
    first = infos[0][0]
    if all(i[0] == first for i in infos):
        dtype = first
    else:
        dtype, _ = dtypes.promote_pairs(*[(i[0], i[1]) for i in infos])
    all_weak = all(i[1] for i in infos)
    weak = False
    if to_inexact and not dtypes.is_inexact(dtype):
        dtype = dtypes.float_
        weak = all_weak  # JAX: weak ints promote to a weak float
    shapes = [i[2] for i in infos]
    shape = shapes[0]
    if any(s != shape for s in shapes[1:]):
        shape = broadcast_shapes(*shapes)
    out = []
    for a, (d, _, s) in zip(args, infos):
        t = type(a)
        if weak and d != dtype:
            a = lax.convert_element_type(operand(a), dtype, weak_type=True)
        elif d != dtype or t in _SCALARS or (t is np.ndarray and a.dtype != dtype):
            a = convert(a, dtype)
            if all_weak and t in _SCALARS:  # a Python scalar among weak operands stays weak
                a = Array(a, True)
        if s != shape:
            a = broadcast_to_shape(a, shape)
        out.append(a)
    return out


def strong(x):
    """`x` not weakly typed (JAX's reductions and some composites drop the weak type)."""
    if info(x)[1]:
        return lax.convert_element_type(operand(x), info(x)[0], weak_type=False)
    return x


def mark_weak(x):
    """`x` marked weakly typed (x is a fresh result: an eager Array or a tracer)."""
    if type(x) is Array:
        x._weak = True
        return x
    if type(x) is np.ndarray:
        return Array(x, weak_type=True)
    if isinstance(x, Tracer) and not x.aval.weak_type:
        return convert_element_type_p.bind(x, new_dtype=x.aval.dtype, weak_type=True)
    return x


def weak_for_scalars(fn):
    """JAX's rule: a function of Python scalars only gives a weakly typed result
    (jnp.sqrt(2.0) * bf16 stays bf16). Such calls are computed right away."""
    import functools

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        if args and all(type(a) in _SCALARS for a in args):
            with core.set_current_trace(root_trace):
                out = fn(*args, **kwargs)
            if type(out) is Array:
                out._weak = True
            return out
        return fn(*args, **kwargs)

    return wrapped


def weak_result(x, weak):
    """Mark an eager result weakly typed (results of Python-scalar-only ops)."""
    if weak and type(x) is Array:
        x._weak = True
    return x


canonical_axis = lax.canonical_axis


def canonical_axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (tuple, list)):
        return tuple(sorted(canonical_axis(int(a), ndim) for a in axis))
    return (canonical_axis(int(axis), ndim),)


def shape_of(x):
    return info(x)[2]


def dtype_of(x):
    return info(x)[0]
