"""Shape manipulation: reshape, transpose, concatenate, stack, split, tile, pad, sort..."""

import builtins

import numpy as np

from fflow import dtypes
from fflow import lax_ops as lax
from fflow.array import Array
from fflow.core import Tracer
from fflow.errors import ConcretizationError, ShapeError, user_error
from fflow.numpy._util import (
    broadcast_shapes,
    broadcast_to_shape,
    canonical_axis,
    convert,
    info,
    mark_weak,
    operand,
    promote_dtypes,
)
from fflow.numpy.elementwise import _bool, greater, greater_equal, logical_and, remainder, subtract
from fflow.numpy.elementwise import where as _elementwise_where
from fflow.numpy.reductions import cumsum
from fflow.numpy.reductions import sum as _sum


def shape(a):
    return tuple(info(a)[2])


def ndim(a):
    return len(info(a)[2])


def size(a, axis=None):
    s = info(a)[2]
    return int(np.prod(s, dtype=np.int64)) if axis is None else s[axis]


def reshape(a, shape=None, order="C", *, newshape=None):
    """Reshape (one -1 entry allowed)."""
    if shape is None:
        shape = newshape
    a = operand(a)
    old = info(a)[2]
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    shape = [int(s) for s in shape]
    if shape.count(-1) > 1:
        raise user_error(
            ShapeError,
            f"reshape to {tuple(shape)}: only one dimension may be -1. Fix: give "
            "every other size explicitly.",
        )
    total = int(np.prod(old, dtype=np.int64))
    if -1 in shape:
        known = int(np.prod([s for s in shape if s != -1], dtype=np.int64))
        if known == 0 or total % known:
            raise user_error(
                ShapeError,
                f"cannot reshape array of shape {old} ({total} elements) into {tuple(shape)}. "
                f"Fix: the sizes must multiply to {total}.",
            )
        shape[shape.index(-1)] = total // known
    if order == "F":
        a = transpose(a)
        out = lax.reshape(a, tuple(reversed(shape)))
        return transpose(out)
    return lax.reshape(a, tuple(shape))


def ravel(a, order="C"):
    return reshape(a, (-1,), order)


def transpose(a, axes=None):
    a = operand(a)
    nd = len(info(a)[2])
    if axes is None:
        axes = tuple(reversed(range(nd)))
    axes = tuple(canonical_axis(int(x), nd) for x in axes)
    return lax.transpose(a, axes)


permute_dims = transpose


def matrix_transpose(x):
    nd = ndim(x)
    return swapaxes(x, nd - 2, nd - 1)


def swapaxes(a, axis1, axis2):
    nd = ndim(a)
    perm = list(range(nd))
    i, j = canonical_axis(axis1, nd), canonical_axis(axis2, nd)
    perm[i], perm[j] = perm[j], perm[i]
    return lax.transpose(operand(a), perm)


def moveaxis(a, source, destination):
    nd = ndim(a)
    src = [canonical_axis(s, nd) for s in np.atleast_1d(source)]
    dst = [canonical_axis(d, nd) for d in np.atleast_1d(destination)]
    order = [i for i in range(nd) if i not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return lax.transpose(operand(a), order)


def expand_dims(a, axis):
    a = operand(a)
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    out_nd = len(info(a)[2]) + len(axes)
    axes = tuple(canonical_axis(int(x), out_nd) for x in axes)  # JAX: in [-nd-1, nd]
    return lax.expand_dims(a, axes)


def squeeze(a, axis=None):
    a = operand(a)
    s = info(a)[2]
    if axis is None:
        dims = tuple(i for i, d in enumerate(s) if d == 1)
    else:
        axes = axis if isinstance(axis, (tuple, list)) else (axis,)
        dims = tuple(canonical_axis(x, len(s)) for x in axes)
    if not dims:
        return a
    return lax.squeeze(a, dims)


def broadcast_to(a, shape):
    a = operand(a)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    s = info(a)[2]
    if len(s) > len(shape) or broadcast_shapes(s, shape) != tuple(shape):
        raise user_error(ShapeError, f"cannot broadcast shape {s} to {tuple(shape)}")
    if isinstance(a, np.ndarray):
        return Array(np.broadcast_to(a, shape))
    return broadcast_to_shape(a, tuple(shape))


def broadcast_arrays(*args):
    s = broadcast_shapes(*[info(a)[2] for a in args])
    return [broadcast_to(a, s) for a in args]


def atleast_1d(*arys):
    out = [reshape(a, (1,)) if ndim(a) == 0 else operand(a) for a in arys]
    return out[0] if len(out) == 1 else out


def atleast_2d(*arys):
    out = []
    for a in arys:
        n = ndim(a)
        out.append(reshape(a, (1, 1)) if n == 0 else reshape(a, (1, -1)) if n == 1 else operand(a))
    return out[0] if len(out) == 1 else out


def atleast_3d(*arys):
    out = []
    for a in arys:
        n = ndim(a)
        if n == 0:
            out.append(reshape(a, (1, 1, 1)))
        elif n == 1:
            out.append(reshape(a, (1, -1, 1)))
        elif n == 2:
            out.append(expand_dims(a, 2))
        else:
            out.append(operand(a))
    return out[0] if len(out) == 1 else out


def concatenate(arrays, axis=0, dtype=None):
    arrays = list(arrays)
    if not arrays:
        raise ValueError("need at least one array to concatenate")
    if axis is None:
        arrays = [ravel(a) for a in arrays]
        axis = 0
    arrays = promote_dtypes_only(*arrays)
    if dtype is not None:
        arrays = [lax.convert_element_type(a, dtype) for a in arrays]
    nd = ndim(arrays[0])
    if nd == 0:
        raise user_error(ShapeError, "zero-dimensional arrays cannot be concatenated")
    return lax.concatenate(arrays, canonical_axis(axis, nd))


concat = concatenate


def promote_dtypes_only(*arrays):
    dtype, weak = promote_dtypes(*arrays)
    out = [convert(operand(a), dtype) for a in arrays]
    if weak:  # all operands were weak: the converted (fresh) ones stay weak, as in JAX
        out = [a if info(a)[1] else mark_weak(a) for a in out]
    return out


def stack(arrays, axis=0, dtype=None):
    arrays = list(arrays)
    if not arrays:
        raise ValueError("need at least one array to stack")
    shapes = {tuple(info(a)[2]) for a in arrays}
    if len(shapes) != 1:
        raise user_error(
            ShapeError,
            f"all input arrays must have the same shape, got {sorted(shapes)}. Fix: pad or "
            f"slice them to one shape, or use jnp.concatenate along an existing axis.",
        )
    nd = ndim(arrays[0]) + 1
    ax = canonical_axis(axis, nd)
    return concatenate([expand_dims(a, ax) for a in arrays], axis=ax, dtype=dtype)


def vstack(tup):
    return concatenate([atleast_2d(a) for a in tup], axis=0)


row_stack = vstack


def hstack(tup):
    arrs = [atleast_1d(a) for a in tup]
    return concatenate(arrs, axis=0 if ndim(arrs[0]) == 1 else 1)


def dstack(tup):
    return concatenate([atleast_3d(a) for a in tup], axis=2)


def column_stack(tup):
    arrs = [reshape(a, (-1, 1)) if ndim(a) == 1 else operand(a) for a in tup]
    return concatenate(arrs, axis=1)


def split(ary, indices_or_sections, axis=0):
    ary = operand(ary)
    s = info(ary)[2]
    axis = canonical_axis(axis, len(s))
    n = s[axis]
    if isinstance(indices_or_sections, (int, np.integer)):
        k = int(indices_or_sections)
        if n % k:
            raise user_error(
                ShapeError,
                f"array split does not result in an equal division ({n} by {k}). Fix: use "
                f"jnp.array_split for unequal pieces, or split points (a list of indices).",
            )
        bounds = [i * (n // k) for i in range(k + 1)]
    else:
        bounds = [0] + [int(i) for i in indices_or_sections] + [n]
    return [
        lax.slice_in_dim(ary, builtins.min(lo, n), builtins.min(builtins.max(hi, lo), n), axis=axis)
        for lo, hi in zip(bounds[:-1], bounds[1:])
    ]


def array_split(ary, indices_or_sections, axis=0):
    if isinstance(indices_or_sections, (int, np.integer)):
        n = info(ary)[2][axis]
        k = int(indices_or_sections)
        sizes = [n // k + (1 if i < n % k else 0) for i in range(k)]
        bounds = np.cumsum(sizes)[:-1].tolist()
        return split(ary, bounds, axis)
    return split(ary, indices_or_sections, axis)


def hsplit(ary, indices_or_sections):
    return split(ary, indices_or_sections, axis=1 if ndim(ary) > 1 else 0)


def vsplit(ary, indices_or_sections):
    return split(ary, indices_or_sections, axis=0)


def tile(A, reps):
    A = operand(A)
    reps = (reps,) if isinstance(reps, int) else tuple(reps)
    s = info(A)[2]
    nd = builtins.max(len(s), len(reps))
    s = (1,) * (nd - len(s)) + tuple(s)
    reps = (1,) * (nd - len(reps)) + reps
    A = lax.reshape(A, s)
    # broadcast to (r0, s0, r1, s1, ...) then merge pairs
    expanded = []
    dims = []
    for i, (r, d) in enumerate(zip(reps, s)):
        expanded += [r, d]
        dims.append(2 * i + 1)
    out = lax.broadcast_in_dim(A, expanded, dims)
    return lax.reshape(out, [r * d for r, d in zip(reps, s)])


def repeat(a, repeats, axis=None, total_repeat_length=None):
    a = operand(a)
    if axis is None:
        a = ravel(a)
        axis = 0
    s = info(a)[2]
    axis = canonical_axis(axis, len(s))
    if isinstance(repeats, (int, np.integer)):
        r = int(repeats)
        expanded = list(s[: axis + 1]) + [r] + list(s[axis + 1 :])
        dims = [i for i in range(len(s) + 1) if i != axis + 1]
        out = lax.broadcast_in_dim(a, expanded, dims)
        new = list(s)
        new[axis] *= r
        return lax.reshape(out, new)
    reps = np.asarray(repeats)
    if isinstance(repeats, Tracer):
        raise user_error(TypeError, "repeat with traced repeats needs total_repeat_length")
    idx = np.repeat(np.arange(s[axis]), reps)
    return take(a, idx, axis=axis)


def flip(m, axis=None):
    m = operand(m)
    nd = ndim(m)
    if axis is None:
        axes = tuple(range(nd))
    else:
        axes = tuple(
            canonical_axis(x, nd) for x in (axis if isinstance(axis, (tuple, list)) else (axis,))
        )
    return lax.rev(m, axes)


def fliplr(m):
    return flip(m, 1)


def flipud(m):
    return flip(m, 0)


def roll(a, shift, axis=None):
    a = operand(a)
    if axis is None:
        s = info(a)[2]
        return reshape(roll(ravel(a), shift, 0), s)
    shifts = shift if isinstance(shift, (tuple, list)) else (shift,)
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    for sh, ax in zip(shifts, axes):
        n = info(a)[2][ax]
        if n == 0:
            continue
        if isinstance(sh, Tracer):
            # traced shift: gather with (i - shift) mod n

            idx = remainder(subtract(lax.iota(np.int32, n), sh), n)
            a = take(a, idx, axis=ax)
            continue
        k = int(sh) % n
        if k:
            a = concatenate(
                [lax.slice_in_dim(a, n - k, n, axis=ax), lax.slice_in_dim(a, 0, n - k, axis=ax)],
                axis=ax,
            )
    return a


def rot90(m, k=1, axes=(0, 1)):
    k %= 4
    m = operand(m)
    for _ in range(k):
        m = flip(swapaxes(m, axes[0], axes[1]), axes[0])
    return m


def pad(array, pad_width, mode="constant", constant_values=0):
    """NumPy's pad for modes constant, edge, reflect, symmetric, wrap."""
    array = operand(array)
    s = info(array)[2]
    nd = len(s)
    pw = (
        np.broadcast_to(
            np.asarray(pad_width, dtype=np.int64).reshape(-1, 2)
            if np.ndim(pad_width)
            else np.asarray([[pad_width, pad_width]]),
            (nd, 2),
        )
        if nd
        else np.zeros((0, 2), np.int64)
    )
    if mode == "constant":
        cv = np.asarray(constant_values)
        if cv.ndim == 0:
            pv = np.asarray(constant_values, dtype=info(array)[0])
            return lax.pad(array, pv, [(int(lo), int(hi), 0) for lo, hi in pw])
        out = array
        cvb = np.broadcast_to(cv.reshape(-1, 2) if cv.ndim else cv, (nd, 2))
        for ax in range(nd):
            cfg = [(0, 0, 0)] * nd
            cfg[ax] = (int(pw[ax][0]), 0, 0)
            out = lax.pad(out, np.asarray(cvb[ax][0], info(array)[0]), cfg)
            cfg[ax] = (0, int(pw[ax][1]), 0)
            out = lax.pad(out, np.asarray(cvb[ax][1], info(array)[0]), cfg)
        return out
    out = array
    for ax in range(nd):
        lo, hi = int(pw[ax][0]), int(pw[ax][1])
        n = info(out)[2][ax]
        idx = np.pad(np.arange(n), (lo, hi), mode=mode)
        if lo or hi:
            out = take(out, idx, axis=ax)
    return out


def sort(a, axis=-1, kind=None, order=None, stable=True, descending=False):
    a = operand(a)
    if axis is None:
        a = ravel(a)
        axis = 0
    axis = canonical_axis(axis, ndim(a))
    out = lax.sort(a, dimension=axis)
    return flip(out, axis) if descending else out


def argsort(a, axis=-1, kind=None, order=None, stable=True, descending=False):
    a = operand(a)
    if axis is None:
        a = ravel(a)
        axis = 0
    axis = canonical_axis(axis, ndim(a))
    iota = lax.broadcasted_iota(dtypes.int_, info(a)[2], axis)
    if descending:
        # as JAX: sort the reversed array, then reverse, so ties keep their order
        a, iota = lax.rev(a, (axis,)), lax.rev(iota, (axis,))
    _, perm = lax.sort([a, iota], dimension=axis, num_keys=1)
    return lax.rev(perm, (axis,)) if descending else perm


def take(a, indices, axis=None, mode=None, fill_value=None):
    a = operand(a)
    if axis is None:
        a = ravel(a)
        axis = 0
    s = info(a)[2]
    axis = canonical_axis(axis, len(s))
    idx = operand(indices)
    idx_shape = info(idx)[2]
    if info(idx)[0].kind not in "iu":
        raise user_error(TypeError, "take: indices must be integers")
    n = s[axis]
    valid = None
    if mode == "clip":
        idx = lax.clamp(0, convert(idx, dtypes.int_), n - 1)
    elif mode == "wrap":
        idx = remainder(convert(idx, dtypes.int_), n)
    else:
        if mode in (None, "fill"):  # JAX's default: out-of-range entries get fill_value
            idx = convert(idx, dtypes.int_)
            valid = logical_and(idx >= -n, idx < n)
        idx = _normalize_index(idx, n)
    gathered = lax.gather(a, lax.reshape(idx, tuple(idx_shape) + (1,)), (axis,))
    if valid is not None:
        fill = _default_fill(info(a)[0]) if fill_value is None else fill_value
        mask = lax.reshape(valid, tuple(idx_shape) + (1,) * (len(s) - 1))
        gathered = where(mask, gathered, np.asarray(fill, info(a)[0]))
    # gather puts the index dims first; move them to `axis`
    nb = len(idx_shape)
    perm = list(range(nb, nb + axis)) + list(range(nb)) + list(range(nb + axis, nb + len(s) - 1))
    return lax.transpose(gathered, perm)


def _default_fill(dtype):
    """JAX's fill for out-of-range gathers: NaN, or the extreme integer."""
    if dtypes.is_inexact(dtype):
        return np.nan
    if dtype == np.bool_:
        return True
    info_ = np.iinfo(dtype)
    return info_.min if dtype.kind == "i" else info_.max


def _normalize_index(idx, n):
    d = info(idx)[0]
    if isinstance(idx, np.ndarray):
        return np.where(idx < 0, idx + n, idx).astype(np.int32 if d.itemsize <= 4 else d)
    zero = lax.full_like(idx, 0)
    return lax.select_n(lax.lt(idx, zero), idx, lax.add(idx, lax.full_like(idx, n)))


def take_along_axis(
    arr, indices, axis=-1, mode=None, fill_value=None, *, wrap_negative_indices=True
):
    """`arr`'s elements at `indices` along `axis` (JAX's jnp.take_along_axis): indices
    broadcast against `arr` in the other dims; negative ones count from the end.

    Out-of-range indices follow `mode`: "fill" (the default, as in JAX) reads
    `fill_value` (NaN for inexact dtypes, the extreme integer, True), "clip" clamps
    ("promise_in_bounds" clamps too). Under `shard` every dim but `axis` is a batch
    dim: a split of it stays a split with no communication.

    Example:
        >>> import fflow.numpy as jnp
        >>> x = jnp.array([[10.0, 11.0, 12.0], [20.0, 21.0, 22.0]])
        >>> jnp.take_along_axis(x, jnp.array([[2], [-1]]), axis=1).tolist()
        [[12.0], [22.0]]
        >>> jnp.take_along_axis(x, jnp.array([[3], [0]]), axis=1).tolist()
        [[nan], [20.0]]
    """
    if mode not in (None, "fill", "clip", "promise_in_bounds"):
        raise user_error(
            ValueError,
            f"take_along_axis: mode {mode!r} is not supported. Fix: mode='fill' (the default), "
            "'clip' or 'promise_in_bounds'.",
        )
    arr = operand(arr)
    if axis is None:
        arr = ravel(arr)
        axis = 0
    s = info(arr)[2]
    axis = canonical_axis(axis, len(s))
    idx = operand(indices)
    if info(idx)[0].kind not in "iu":
        raise user_error(
            TypeError, f"take_along_axis: indices must be integers, got {info(idx)[0]}"
        )
    ishape = info(idx)[2]
    if len(ishape) != len(s):
        raise user_error(
            ShapeError,
            f"take_along_axis: indices of rank {len(ishape)} for an array of rank {len(s)}. "
            "Fix: give the indices the array's rank (e.g. labels[..., None]).",
        )
    bshape = tuple(
        builtins.max(a, b) if i != axis else b for i, (a, b) in enumerate(zip(s, ishape))
    )
    idx = broadcast_to(idx, bshape)
    arr_shape = tuple(d if i == axis else bshape[i] for i, d in enumerate(s))
    arr = broadcast_to(arr, arr_shape)
    n = s[axis]
    if wrap_negative_indices:
        idx = _normalize_index(idx, n)
    out = lax.take_along_axis(arr, idx, axis)
    if mode not in (None, "fill"):
        return out
    if isinstance(idx, np.ndarray):  # constant indices: only pay for the mask when needed
        inside = (idx >= 0) & (idx < n)
        if inside.all():
            return out
    else:
        zero = lax.full_like(idx, 0)
        inside = lax.bitwise_and(lax.ge(idx, zero), lax.lt(idx, lax.full_like(idx, n)))
    dtype = info(arr)[0]
    fill = _default_fill(dtype) if fill_value is None else fill_value
    return lax.select_n(inside, lax.full(bshape, np.array(fill).astype(dtype), dtype), out)


def nonzero(a, size=None, fill_value=None):
    """Indices of nonzero entries. Without `size` this is eager only (the result's shape
    depends on the values); with a static `size` it also works under jit (padded with
    `fill_value`, extra entries dropped), as in JAX."""
    if size is not None and isinstance(a, Tracer):
        return _nonzero_static_size(a, int(size), fill_value)
    if isinstance(a, Tracer) and a.concrete_value() is None and size is None:
        raise ConcretizationError(a, "array")
    value = np.asarray(a)
    res = np.nonzero(value)
    if size is not None:
        fill = 0 if fill_value is None else fill_value
        res = tuple(
            np.concatenate([r[:size], np.full(builtins.max(size - len(r), 0), fill)]) for r in res
        )
    return tuple(Array(r.astype(np.int32)) for r in res)


def _nonzero_static_size(a, size, fill_value):
    shape = info(a)[2]
    mask = ravel(_bool(a))
    n = info(mask)[2][0]
    pos = cumsum(mask.astype(dtypes.int_)) - 1
    target = where(mask, pos, size)  # zeros go past the end and are dropped
    flat = lax.full((size,), 0, dtypes.int_).at[target].set(lax.iota(dtypes.int_, n))
    count = _sum(mask.astype(dtypes.int_))
    valid = lax.iota(dtypes.int_, size) < count
    fills = fill_value if isinstance(fill_value, (tuple, list)) else [fill_value] * len(shape)
    out = []
    rest = flat
    for d, dim in reversed(list(enumerate(shape))):
        idx = rest % dim
        rest = rest // dim
        fill = 0 if fills[d] is None else fills[d]
        out.append(where(valid, idx, fill).astype(dtypes.int_))
    return tuple(reversed(out))


def argwhere(a, size=None, fill_value=None):
    return (
        stack(nonzero(a, size, fill_value), axis=1)
        if ndim(a)
        else Array(np.argwhere(np.asarray(a)).astype(np.int32))
    )


def flatnonzero(a, *, size=None, fill_value=None):
    return nonzero(ravel(a), size=size, fill_value=fill_value)[0]


def unique(
    ar,
    return_index=False,
    return_inverse=False,
    return_counts=False,
    axis=None,
    size=None,
    fill_value=None,
):
    """Eager only (the output shape depends on the values), like JAX without `size`."""
    out = np.unique(np.asarray(ar), return_index, return_inverse, return_counts, axis)
    if size is not None and axis is None:
        out = _unique_sized(out, int(size), fill_value, return_index, return_inverse)
    if isinstance(out, tuple):
        return tuple(Array(default_int(o)) for o in out)
    return Array(out)


def _unique_sized(out, size, fill_value, return_index, return_inverse):
    """JAX's `size=`: truncate, or pad values with fill_value (default: the smallest),
    indices with the smallest's index and counts with 0."""
    parts = list(out) if isinstance(out, tuple) else [out]
    vals = parts[0]
    n = size - len(vals)
    kinds = ["values"] + ["index"] * return_index + ["inverse"] * return_inverse
    kinds += ["counts"] * (len(parts) - len(kinds))
    for i, (kind, p) in enumerate(zip(kinds, parts)):
        if kind == "inverse":
            continue
        if n <= 0:
            parts[i] = p[:size]
            continue
        if kind == "values":
            fill = vals[0] if fill_value is None and len(vals) else (fill_value or 0)
        else:
            fill = p[0] if kind == "index" and len(p) else 0
        parts[i] = np.concatenate([p, np.full(n, fill, p.dtype)])
    return tuple(parts) if isinstance(out, tuple) else parts[0]


def default_int(o):
    return o.astype(np.int32) if o.dtype == np.int64 else o


def diff(a, n=1, axis=-1, prepend=None, append=None):
    a = operand(a)
    axis = canonical_axis(axis, ndim(a))
    if prepend is not None:
        a = concatenate(
            [
                broadcast_to(prepend, _with(info(a)[2], axis, 1))
                if ndim(prepend) == 0
                else prepend,
                a,
            ],
            axis,
        )
    if append is not None:
        a = concatenate(
            [a, broadcast_to(append, _with(info(a)[2], axis, 1)) if ndim(append) == 0 else append],
            axis,
        )
    for _ in range(n):
        k = info(a)[2][axis]
        a = lax.sub(lax.slice_in_dim(a, 1, k, axis=axis), lax.slice_in_dim(a, 0, k - 1, axis=axis))
    return a


def _with(shape, axis, v):
    shape = list(shape)
    shape[axis] = v
    return tuple(shape)


def tril(m, k=0):
    m = operand(m)
    s = info(m)[2]
    mask = np.tri(s[-2], s[-1], k, dtype=bool)

    return where(mask, m, 0)


def triu(m, k=0):
    m = operand(m)
    s = info(m)[2]
    mask = ~np.tri(s[-2], s[-1], k - 1, dtype=bool)

    return where(mask, m, 0)


def searchsorted(a, v, side="left", sorter=None):
    a = operand(a)
    v = operand(v)
    cmp = greater_equal if side == "right" else greater
    vs = expand_dims(v, -1)
    return _sum(cmp(vs, a), axis=-1).astype(np.int32)


def clip_index(i, n):
    return lax.clamp(0, i, n - 1)


# the jax.numpy names this module gives fflow.numpy (its `import *`)


def where(condition, x=None, y=None, /, *, size=None, fill_value=None):
    """Elementwise choice; with one argument, the indices of nonzero entries (eager only,
    or under jit with a static `size`)."""
    if x is None and y is None:
        return nonzero(condition, size=size, fill_value=fill_value)
    return _elementwise_where(condition, x, y, size=size, fill_value=fill_value)


__all__ = [
    "where",
    "argsort",
    "argwhere",
    "array_split",
    "atleast_1d",
    "atleast_2d",
    "atleast_3d",
    "broadcast_arrays",
    "broadcast_shapes",
    "broadcast_to",
    "column_stack",
    "concat",
    "concatenate",
    "diff",
    "dstack",
    "expand_dims",
    "flatnonzero",
    "flip",
    "fliplr",
    "flipud",
    "hsplit",
    "hstack",
    "matrix_transpose",
    "moveaxis",
    "ndim",
    "nonzero",
    "pad",
    "permute_dims",
    "ravel",
    "repeat",
    "reshape",
    "roll",
    "rot90",
    "searchsorted",
    "shape",
    "size",
    "sort",
    "split",
    "squeeze",
    "stack",
    "swapaxes",
    "take",
    "take_along_axis",
    "tile",
    "transpose",
    "tril",
    "triu",
    "unique",
    "vsplit",
    "vstack",
]
