"""NumPy indexing on fflow arrays (`x[idx]`) and functional updates (`x.at[idx].set(v)`).

Basic indices (ints, slices, None, Ellipsis) become slices and reshapes; integer
array indices become one `gather` (NumPy's placement of the advanced dimensions), or
one `take_along_axis` when constant iotas index the leading dims
(logp[jnp.arange(n), labels]: batch dims that stay split under shard); boolean masks
work eagerly. Out-of-bounds gathers clamp; out-of-bounds updates
are dropped, as in JAX.
"""

import numpy as np

from fflow import dtypes
from fflow import lax_ops as lax
from fflow.array import Array
from fflow.core import Tracer
from fflow.errors import ConcretizationError, user_error
from fflow.numpy._util import broadcast_shapes, broadcast_to_shape, convert, info, operand
from fflow.numpy.elementwise import negative, power, reciprocal


def _is_advanced(e):
    if isinstance(e, (list, np.ndarray, Array)) or isinstance(e, Tracer):
        return info(e)[2] != () or info(e)[0] == np.bool_
    return False


def _expand_bool_masks(idx):
    out = []
    for e in idx:
        if (
            isinstance(e, (np.ndarray, Array, Tracer, list))
            and info(e)[0] == np.bool_
            and not isinstance(e, bool)
        ):
            if isinstance(e, Tracer) and e.concrete_value() is None:
                raise ConcretizationError(e, "index")
            mask = np.asarray(e)
            out.extend(np.nonzero(mask))
        else:
            out.append(e)
    return out


def _normalize(idx, ndim):
    if isinstance(idx, list):
        raise user_error(
            TypeError,
            "Using a non-tuple sequence for multidimensional indexing is not allowed (as in "
            "JAX). Fix: x[jnp.array(seq)] for an index array, x[tuple(seq)] for one index "
            "per dimension.",
        )
    if not isinstance(idx, tuple):
        idx = (idx,)
    # a list inside the index tuple is an index array (x[:, [0, 2]]), as in JAX
    idx = _expand_bool_masks([np.asarray(e) if type(e) is list else e for e in idx])
    n_ell = sum(1 for e in idx if e is Ellipsis)
    if n_ell > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    used = sum(1 for e in idx if e is not None and e is not Ellipsis)
    if used > ndim:
        raise user_error(
            IndexError,
            f"too many indices for array: array is {ndim}-dimensional, but {used} were indexed. "
            f"Fix: at most {ndim} indices (check the array's shape; None adds an axis).",
        )
    if n_ell:
        i = idx.index(Ellipsis)
        idx = idx[:i] + [slice(None)] * (ndim - used) + idx[i + 1 :]
    else:
        idx = idx + [slice(None)] * (ndim - used)
    return idx


def _is_static_int(e):
    return isinstance(e, (int, np.integer)) and not isinstance(e, bool)


def _scalar_index(e, n):
    """A traced/array scalar index, negative wrapped (static ints handled by the caller)."""
    e = operand(e)
    if info(e)[0].kind not in "iu":
        raise user_error(TypeError, f"indices must be integers, got {info(e)[0]}")
    e = convert(e, dtypes.int_) if info(e)[0] != dtypes.int_ else e
    zero = lax.full_like(e, 0)
    return lax.select_n(lax.lt(e, zero), e, lax.add(e, lax.full_like(e, n)))


def getitem(x, idx):
    x = operand(x)
    shape = info(x)[2]
    idx = _normalize(idx, len(shape))
    has_adv = any(_is_advanced(e) for e in idx)
    out = x
    dim = 0
    advanced = []  # (dim in `out`, index array)
    for e in idx:
        cur = info(out)[2]
        if e is None:
            out = lax.expand_dims(out, (dim,))
            dim += 1
        elif isinstance(e, slice):
            n = cur[dim]
            start, stop, step = e.indices(n) if not _traced_slice(e) else _bad_slice(e)
            if step < 0:
                out = lax.rev(out, (dim,))
                start, stop = n - 1 - start, n - 1 - stop
                step = -step
            stop = max(stop, start)
            if (start, stop, step) != (0, n, 1):
                out = lax.slice_in_dim(out, start, stop, step, axis=dim)
            dim += 1
        elif _is_static_int(e) and not has_adv:
            n = cur[dim]
            i = int(e)
            if n == 0:
                raise user_error(
                    IndexError, f"index {i} is out of bounds for axis {dim} with size 0"
                )
            # JAX clamps an out-of-range index (x[11] of 10 values is x[9], x[-11] is x[0])
            i = min(max(i + n if i < 0 else i, 0), n - 1)
            out = lax.index_in_dim(out, i, axis=dim, keepdims=False)
        elif not has_adv:
            i = _scalar_index(e, cur[dim])
            out = lax.dynamic_index_in_dim(out, i, axis=dim, keepdims=False)
        else:
            advanced.append((dim, e))
            dim += 1
    if advanced:
        out = _gather_advanced(out, advanced)
    return out


def _traced_slice(e):
    return any(isinstance(v, Tracer) for v in (e.start, e.stop, e.step))


def _bad_slice(e):
    v = next(v for v in (e.start, e.stop, e.step) if isinstance(v, Tracer))
    if v.concrete_value() is not None:
        return slice(*(None if s is None else int(s) for s in (e.start, e.stop, e.step)))
    raise user_error(
        IndexError,
        "slice bounds must be static under jit. Fix: use fflow.lax.dynamic_slice(x, "
        "start, size) for a traced start with a static size.",
    )


def _gather_advanced(x, advanced):
    shape = info(x)[2]
    axes = [d for d, _ in advanced]
    raw = []
    for _, e in advanced:
        e = operand(e) if not _is_static_int(e) else np.asarray(e, np.int32)
        if info(e)[0].kind not in "iu":
            raise user_error(TypeError, f"array indices must be integers, got {info(e)[0]}")
        raw.append(e)
    bshape = broadcast_shapes(*[info(a)[2] for a in raw])
    out = _take_along_iotas(x, axes, raw, bshape)
    if out is None:
        arrays = [_wrap_negative(e, shape[d]) for d, e in zip(axes, raw)]
        cols = [
            lax.reshape(broadcast_to_shape(convert(a, dtypes.int_), bshape), bshape + (1,))
            for a in arrays
        ]
        indices = lax.concatenate(cols, len(bshape)) if len(cols) > 1 else cols[0]
        if isinstance(indices, np.ndarray):
            indices = np.ascontiguousarray(indices)
        out = lax.gather(x, indices, tuple(axes))
    # NumPy: adjacent advanced indices keep their place; otherwise they go first
    if axes == list(range(axes[0], axes[0] + len(axes))) and axes[0] != 0:
        nb = len(bshape)
        rest = len(shape) - len(axes)
        perm = (
            list(range(nb, nb + axes[0])) + list(range(nb)) + list(range(nb + axes[0], nb + rest))
        )
        out = lax.transpose(out, perm)
    return out


def _is_iota(e, bshape, k):
    """True when the constant index `e`, broadcast to `bshape`, is the position along
    dim k (jnp.arange(n), jnp.arange(n)[:, None] and the like)."""
    if isinstance(e, Tracer):
        return False
    v = np.asarray(e._value if type(e) is Array else e)
    if v.size and v.flat[0] != 0:  # (cheap: most index arrays are not iotas)
        return False
    ramp = np.arange(bshape[k]).reshape((-1,) + (1,) * (len(bshape) - 1 - k))
    return np.array_equal(np.broadcast_to(v, bshape), np.broadcast_to(ramp, bshape))


def _take_along_iotas(x, axes, raw, bshape):
    """`x` indexed by the arrays `raw` on `axes`, in gather's layout (bshape, then x's
    other dims), as one take_along_axis; None where that does not apply. It applies when
    x's leading dims are indexed by constant iotas along the dims of `bshape` in order
    and the next dim by any array, as in logp[jnp.arange(n), labels]: those dims are
    then batch dims shared by x and the indices, which take_along_axis keeps split
    under shard where a gather cannot."""
    m, shape = len(bshape), info(x)[2]
    if list(axes) != list(range(m + 1)) or tuple(shape[:m]) != tuple(bshape):
        return None
    if not all(_is_iota(e, bshape, k) for k, e in enumerate(raw[:m])):
        return None
    sizes = tuple(shape[m + 1 :])
    idx = convert(_wrap_negative(raw[m], shape[m]), dtypes.int_)
    idx = lax.reshape(broadcast_to_shape(idx, bshape), bshape + (1,) * (1 + len(sizes)))
    idx = broadcast_to_shape(idx, bshape + (1,) + sizes)
    return lax.reshape(lax.take_along_axis(x, idx, m), bshape + sizes)


def _wrap_negative(e, n):
    if isinstance(e, np.ndarray):
        return np.where(e < 0, e + n, e).astype(np.int32)
    zero = lax.full_like(e, 0)
    return lax.select_n(lax.lt(e, zero), e, lax.add(e, lax.full_like(e, n)))


# -- x.at[idx] -------------------------------------------------------------------------------


class _IndexUpdateHelper:
    __slots__ = ("array",)

    def __init__(self, array):
        self.array = array

    def __getitem__(self, idx):
        return _IndexUpdateRef(self.array, idx)


class _IndexUpdateRef:
    """`x.at[idx]`: functional updates returning a new array."""

    __slots__ = ("array", "idx")

    def __init__(self, array, idx):
        self.array = array
        self.idx = idx

    def get(self, *, mode=None, fill_value=None, **kwargs):
        if mode != "fill":
            return getitem(self.array, self.idx)
        return _get_fill(self.array, self.idx, fill_value)

    def set(self, values, *, mode=None, **kwargs):
        return _update(self.array, self.idx, values, "set", mode)

    def add(self, values, *, mode=None, **kwargs):
        return _update(self.array, self.idx, values, "add", mode)

    def subtract(self, values, **kwargs):

        return _update(self.array, self.idx, negative(values), "add")

    def mul(self, values, *, mode=None, **kwargs):
        return _update(self.array, self.idx, values, "mul", mode)

    multiply = mul

    def divide(self, values, **kwargs):

        return _update(self.array, self.idx, reciprocal(values), "mul")

    def min(self, values, *, mode=None, **kwargs):
        return _update(self.array, self.idx, values, "min", mode)

    def max(self, values, *, mode=None, **kwargs):
        return _update(self.array, self.idx, values, "max", mode)

    def power(self, values, **kwargs):

        return self.set(power(self.get(), values))

    def apply(self, func, **kwargs):
        return self.set(func(self.get()))


_SCATTER = {
    "set": lax.scatter,
    "add": lax.scatter_add,
    "mul": lax.scatter_mul,
    "min": lax.scatter_min,
    "max": lax.scatter_max,
}


def _update(x, idx, values, mode, index_mode=None):
    x = operand(x)
    dtype, _, shape = info(x)
    values = convert(operand(values), dtype)
    if index_mode == "clip":
        idx = _clip_index(idx, shape)
    if _static_out_of_bounds(idx, shape):
        return x  # JAX drops out-of-bounds updates
    fast = _static_box(idx, shape) if mode == "set" else None
    if fast is not None:
        starts, sizes, squeezed = fast
        target = tuple(sizes[i] for i in range(len(sizes)) if i not in squeezed)
        upd = broadcast_to_shape(values, target) if info(values)[2] != target else values
        upd = lax.reshape(upd, sizes)
        return lax.dynamic_update_slice(x, upd, [np.int32(s) for s in starts])
    # general case: the flat positions of the selected elements, found by indexing
    # an iota the same way, then one scatter on the flattened array
    size = int(np.prod(shape, dtype=np.int64))
    # each dim gets one extra slot holding `size`: out-of-bounds array indices are sent
    # there, so their updates land past the end and the scatter drops them (as in JAX)
    positions = np.full(tuple(d + 1 for d in shape), size, np.int32)
    positions[tuple(slice(0, d) for d in shape)] = np.arange(size, dtype=np.int32).reshape(shape)
    selected = getitem(Array(positions), _to_sentinel_index(idx, shape))
    sel_shape = info(selected)[2]
    upd = broadcast_to_shape(values, sel_shape) if info(values)[2] != sel_shape else values
    flat = lax.reshape(x, (size,))
    n = int(np.prod(sel_shape, dtype=np.int64))
    out = _SCATTER[mode](flat, lax.reshape(selected, (n, 1)), lax.reshape(upd, (n,)), (0,))
    return lax.reshape(out, shape)


def _get_fill(x, idx, fill_value):
    """`x.at[idx].get(mode="fill")`: out-of-range array indices read `fill_value`
    (JAX's default: NaN for inexact dtypes, the extreme value for integers)."""
    x = operand(x)
    dtype, _, shape = info(x)
    if fill_value is None:
        if dtypes.is_inexact(dtype):
            fill_value = np.nan
        elif dtype.kind == "b":
            fill_value = True
        else:
            fill_value = np.iinfo(dtype).min if dtype.kind == "i" else np.iinfo(dtype).max
    size = int(np.prod(shape, dtype=np.int64))
    positions = np.full(tuple(d + 1 for d in shape), size, np.int32)
    positions[tuple(slice(0, d) for d in shape)] = np.arange(size, dtype=np.int32).reshape(shape)
    selected = getitem(Array(positions), _to_sentinel_index(idx, shape))
    padded = lax.concatenate([lax.reshape(x, (size,)), lax.full((1,), fill_value, dtype)], 0)
    return getitem(padded, selected)


def _clip_index(idx, shape):
    """Integer and array entries of `idx` clamped into range (mode="clip")."""
    entries = _normalize(idx, len(shape))
    out = []
    d = 0
    for e in entries:
        if e is None:
            out.append(e)
            continue
        n = shape[d]
        d += 1
        if isinstance(e, slice):
            out.append(e)
        elif _is_static_int(e):
            out.append(min(max(int(e), 0), n - 1))
        else:
            out.append(lax.clamp(0, convert(operand(e), dtypes.int_), n - 1))
    return tuple(out)


def _to_sentinel_index(idx, shape):
    """`idx` for the padded positions array: slices made explicit (so they skip the
    extra slot) and out-of-range array/traced indices mapped to the extra slot."""
    entries = _normalize(idx, len(shape))
    out = []
    d = 0
    for e in entries:
        if e is None:
            out.append(e)
            continue
        n = shape[d]
        d += 1
        if isinstance(e, slice):
            if _traced_slice(e):
                e = _bad_slice(e)
            start, stop, step = e.indices(n)
            out.append(slice(start, None if stop < 0 else stop, step))
        elif _is_static_int(e):
            i = int(e)
            out.append(i % n if -n <= i < n else n)  # out of range: the fill slot
        else:
            e = operand(e)
            if info(e)[0].kind not in "iu":
                raise user_error(TypeError, f"array indices must be integers, got {info(e)[0]}")
            e = convert(e, dtypes.int_) if info(e)[0] != dtypes.int_ else e
            if isinstance(e, np.ndarray):
                valid = (e >= -n) & (e < n)
                out.append(np.where(valid, np.where(e < 0, e + n, e), n).astype(np.int32))
            else:
                zero, big = lax.full_like(e, 0), lax.full_like(e, n)
                wrapped = lax.select_n(lax.lt(e, zero), e, lax.add(e, big))
                valid = lax.bitwise_and(lax.ge(e, lax.neg(big)), lax.lt(e, big))
                out.append(lax.select_n(valid, big, wrapped))
    return tuple(out)


def _static_out_of_bounds(idx, shape):
    """Whether a static int index (before any None/Ellipsis) is out of its dim's range."""
    if not isinstance(idx, tuple):
        idx = (idx,)
    for d, e in enumerate(idx):
        if e is None or e is Ellipsis or d >= len(shape):
            return False
        if _is_static_int(e) and not -shape[d] <= int(e) < shape[d]:
            return True
    return False


def _static_box(idx, shape):
    """(starts, sizes, squeezed dims) if `idx` is static ints and unit-step slices."""
    if not isinstance(idx, tuple):
        idx = (idx,)
    if any(e is None or e is Ellipsis for e in idx) or len(idx) > len(shape):
        return None
    starts, sizes, squeezed = [], [], []
    for d, n in enumerate(shape):
        e = idx[d] if d < len(idx) else slice(None)
        if _is_static_int(e):
            i = int(e)
            if not -n <= i < n:
                return None
            starts.append(i % n)
            sizes.append(1)
            squeezed.append(d)
        elif isinstance(e, slice) and not _traced_slice(e):
            start, stop, step = e.indices(n)
            if step != 1:
                return None
            starts.append(start)
            sizes.append(max(stop - start, 0))
        else:
            return None
    return starts, sizes, squeezed
