"""Less common `jax.numpy` functions, built from the core ones: vectorize,
apply_along_axis, index helpers (indices, ix_, unravel_index, tril_indices...),
set membership, convolution, covariance, polynomials, windows and friends."""

import builtins
import functools

import numpy as np

from fflow import dtypes
from fflow import lax_ops as lax
from fflow.array import Array
from fflow.core import Tracer
from fflow.errors import ShapeError, user_error
from fflow.numpy import elementwise as ew
from fflow.numpy import reductions as red
from fflow.numpy import shapes as sh
from fflow.numpy._util import info, operand, strong
from fflow.numpy.creation import asarray, zeros_like
from fflow.numpy.elementwise import where
from fflow.numpy.linalg_ops import diag, diagonal, matmul
from fflow.transforms.vmap import vmap


def _asarray(x):

    return asarray(x)


def _int_array(value):
    return Array(np.asarray(value).astype(np.int32))


# -- mapping functions over arrays --------------------------------------------------------


def vectorize(pyfunc, *, excluded=frozenset(), signature=None):
    """Map a function of scalars (or of core dims given by `signature`, e.g. "(n)->()")
    over broadcast leading dimensions with `fflow.vmap`.

    Example:
        >>> import fflow.numpy as jnp
        >>> f = jnp.vectorize(lambda a, b: a * b + 1)
        >>> f(jnp.arange(3.0), 2.0).tolist()
        [1.0, 3.0, 5.0]
    """
    in_core, out_core = _parse_signature(signature)

    @functools.wraps(pyfunc)
    def wrapped(*args, **kwargs):

        excluded_pos = {i for i in excluded if isinstance(i, int)}
        static = {i: a for i, a in enumerate(args) if i in excluded_pos}
        dynamic = [operand(a) for i, a in enumerate(args) if i not in excluded_pos]
        cores = in_core if in_core is not None else [()] * len(dynamic)
        if len(cores) != len(dynamic):
            raise ValueError("vectorize: the signature does not match the number of arguments")
        batch_shapes = [info(a)[2][: len(info(a)[2]) - len(c)] for a, c in zip(dynamic, cores)]
        batch = tuple(np.broadcast_shapes(*batch_shapes)) if batch_shapes else ()
        dynamic = [
            sh.broadcast_to(a, batch + tuple(info(a)[2][len(info(a)[2]) - len(c) :]))
            for a, c in zip(dynamic, cores)
        ]

        def call(*dyn):
            it = iter(dyn)
            full = [static[i] if i in static else next(it) for i in range(len(args))]
            return pyfunc(*full, **kwargs)

        f = call
        for _ in batch:
            f = vmap(f)
        return f(*dynamic)

    return wrapped


def _parse_signature(signature):
    if signature is None:
        return None, None
    ins, outs = signature.replace(" ", "").split("->")

    def parse(part):
        import re

        return [tuple(d for d in g.split(",") if d) for g in re.findall(r"\(([^)]*)\)", part)]

    return parse(ins), parse(outs)


def apply_along_axis(func1d, axis, arr, *args, **kwargs):
    """`func1d` applied to 1-D slices of `arr` along `axis` (with vmap)."""

    arr = operand(arr)
    nd = len(info(arr)[2])
    axis = axis % nd
    f = functools.partial(func1d, *(), **kwargs)
    g = lambda x: f(x, *args)  # noqa: E731
    for _ in range(nd - 1):
        g = vmap(g)
    moved = sh.moveaxis(arr, axis, -1)
    out = g(moved)
    out_nd = len(info(out)[2])
    extra = out_nd - (nd - 1)
    if extra:
        # the function's output dims take the place of `axis`
        return sh.moveaxis(out, tuple(range(nd - 1, out_nd)), tuple(range(axis, axis + extra)))
    return out


def apply_over_axes(func, a, axes):
    for ax in axes:
        out = func(a, ax)
        a = out if len(info(out)[2]) == len(info(a)[2]) else sh.expand_dims(out, ax)
    return a


# -- building and editing --------------------------------------------------------------------


def append(arr, values, axis=None):
    if axis is None:
        return sh.concatenate([sh.ravel(arr), sh.ravel(values)])
    return sh.concatenate([arr, values], axis=axis)


def insert(arr, obj, values, axis=None):
    """Insert `values` before the (static) index or indices `obj` along `axis`."""
    arr = operand(arr)
    if axis is None:
        arr, axis = sh.ravel(arr), 0
    shape = info(arr)[2]
    axis %= len(shape)
    n = shape[axis]
    if isinstance(obj, slice):
        obj = np.arange(n)[obj]
    idx = np.atleast_1d(np.asarray(obj)).astype(np.int64)
    idx = np.where(idx < 0, idx + n, idx)
    values = operand(values).astype(info(arr)[0])
    if np.ndim(obj) == 0:
        vs = info(values)[2]
        if len(vs) == len(shape):
            slab = values
        else:
            rest = shape[:axis] + shape[axis + 1 :]
            slab = sh.expand_dims(sh.broadcast_to(values, rest), axis)
        k = info(slab)[2][axis]
        idx = np.full(k, idx[0])
    else:
        k = len(idx)
        target = list(shape)
        target[axis] = k
        vals = sh.moveaxis(values, -1, axis) if len(info(values)[2]) == len(shape) else values
        slab = sh.broadcast_to(
            sh.moveaxis(sh.broadcast_to(vals, target[:axis] + target[axis + 1 :] + [k]), -1, axis)
            if len(info(vals)[2]) < len(shape)
            else vals,
            target,
        )
    # original element i keeps rank 2i+1, a value inserted before i gets 2i (stable)
    keys = np.concatenate([2 * np.arange(n) + 1, 2 * idx])
    order = np.argsort(keys, kind="stable").astype(np.int32)
    return sh.take(sh.concatenate([arr, slab], axis=axis), order, axis=axis)


def delete(arr, obj, axis=None, *, assume_unique_indices=False):
    arr = operand(arr)
    if axis is None:
        arr, axis = sh.ravel(arr), 0
    n = info(arr)[2][axis]
    keep = np.ones(n, bool)
    keep[np.asarray(np.arange(n)[obj] if isinstance(obj, slice) else obj)] = False
    return sh.take(arr, np.nonzero(keep)[0].astype(np.int32), axis=axis)


def resize(a, new_shape):
    a = sh.ravel(a)
    new_shape = (new_shape,) if isinstance(new_shape, int) else tuple(new_shape)
    total = int(np.prod(new_shape, dtype=np.int64))
    n = info(a)[2][0]
    reps = -(-total // n) if n else 0
    return sh.reshape(sh.tile(a, reps)[:total], new_shape)


def rollaxis(a, axis, start=0):
    nd = len(info(a)[2])
    axis %= nd
    start = start % (nd + 1) if start < 0 else start
    if axis < start:
        start -= 1
    return sh.moveaxis(a, axis, start)


def unstack(x, axis=0):
    x = operand(x)
    return tuple(sh.take(x, i, axis=axis) for i in range(info(x)[2][axis]))


def dsplit(ary, indices_or_sections):
    return sh.split(ary, indices_or_sections, axis=2)


def diagflat(v, k=0):

    return diag(sh.ravel(v), k)


def fill_diagonal(a, val, wrap=False, *, inplace=True):
    """Functional: returns a copy of `a` with its main diagonal set (pass inplace=False)."""
    if inplace:
        raise user_error(
            ValueError,
            "fflow arrays are immutable: use fflow.numpy.fill_diagonal(a, val, inplace=False).",
        )
    a = _asarray(a)
    shape = info(a)[2]
    n = builtins.min(shape)
    idx = tuple(np.arange(n) for _ in shape)
    return a.at[idx].set(val)


def put_along_axis(arr, indices, values, axis, inplace=True, *, mode=None):
    if inplace:
        raise user_error(
            ValueError, "fflow arrays are immutable: pass inplace=False to put_along_axis."
        )
    arr = _asarray(arr)
    shape = info(arr)[2]
    idx = operand(indices)
    ishape = info(idx)[2]
    full = []
    for d in range(len(shape)):
        if d == axis % len(shape):
            full.append(idx)
        else:
            s = [1] * len(shape)
            s[d] = ishape[d]
            full.append(np.arange(ishape[d]).reshape(s))
    return arr.at[tuple(full)].set(values)


def choose(a, choices, mode="raise"):
    a = operand(a)
    choices = (
        sh.stack([operand(c) for c in choices])
        if isinstance(choices, (list, tuple))
        else operand(choices)
    )
    n = info(choices)[2][0]
    a = ew.clip(a, 0, n - 1) if mode == "clip" else ew.remainder(a, n) if mode == "wrap" else a
    shape = np.broadcast_shapes(info(a)[2], info(choices)[2][1:])
    choices = sh.broadcast_to(choices, (n,) + shape)
    return sh.take_along_axis(choices, sh.broadcast_to(a, shape)[None], axis=0, mode="clip")[0]


def compress(condition, a, axis=None, *, size=None, fill_value=0):
    cond = np.asarray(condition).astype(bool)
    a = operand(a)
    if axis is None:
        a, axis = sh.ravel(a), 0
    return sh.take(a, np.nonzero(cond)[0].astype(np.int32), axis=axis)


def extract(condition, arr, *, size=None, fill_value=0):
    return compress(sh.ravel(condition), sh.ravel(arr))


# -- index helpers ---------------------------------------------------------------------------


def indices(dimensions, dtype=None, sparse=False):
    return (
        tuple(_int_array(i) for i in np.indices(dimensions, sparse=sparse))
        if sparse
        else (Array(np.indices(dimensions).astype(dtype or np.int32)))
    )


def ix_(*args):
    n = len(args)
    out = []
    for i, a in enumerate(args):
        a = operand(a)
        shape = [1] * n
        shape[i] = info(a)[2][0]
        out.append(sh.reshape(a, shape))
    return tuple(out)


def unravel_index(indices, shape):
    idx = operand(indices)
    out = []
    for d in reversed(shape):
        out.append(ew.remainder(idx, d))
        idx = ew.floor_divide(idx, d)
    return tuple(reversed(out))


def ravel_multi_index(multi_index, dims, mode="raise", order="C"):
    out = 0
    for i, d in zip(multi_index, dims):
        i = operand(i)
        if mode == "clip":
            i = ew.clip(i, 0, d - 1)
        elif mode == "wrap":
            i = ew.remainder(i, d)
        out = ew.add(ew.multiply(out, d), i)
    return out


def tril_indices(n, k=0, m=None):
    return tuple(_int_array(i) for i in np.tril_indices(n, k, m))


def triu_indices(n, k=0, m=None):
    return tuple(_int_array(i) for i in np.triu_indices(n, k, m))


def tril_indices_from(arr, k=0):
    s = info(arr)[2]
    return tril_indices(s[-2], k, s[-1])


def triu_indices_from(arr, k=0):
    s = info(arr)[2]
    return triu_indices(s[-2], k, s[-1])


def diag_indices(n, ndim=2):
    return tuple(_int_array(i) for i in np.diag_indices(n, ndim))


def diag_indices_from(arr):
    s = info(arr)[2]
    return diag_indices(s[0], len(s))


def mask_indices(n, mask_func, k=0):
    return tuple(
        _int_array(i) for i in np.mask_indices(n, lambda m, kk: np.asarray(mask_func(m, kk)), k)
    )


class _Grid:
    def __init__(self, sparse):
        self.sparse = sparse

    def __getitem__(self, key):
        grid = np.ogrid[key] if self.sparse else np.mgrid[key]
        if isinstance(grid, (list, tuple)):
            return [Array(_default(g)) for g in grid]
        return Array(_default(grid))


def _default(g):
    g = np.asarray(g)
    return (
        g.astype(np.float32)
        if g.dtype == np.float64
        else g.astype(np.int32)
        if g.dtype == np.int64
        else g
    )


mgrid = _Grid(False)
ogrid = _Grid(True)
s_ = index_exp = np.s_


def argpartition(a, kth, axis=-1):
    return sh.argsort(a, axis=axis)


def partition(a, kth, axis=-1):
    return sh.sort(a, axis=axis)


def lexsort(keys, axis=-1):
    """Indices sorting by the last key first, then the previous ones (stable)."""
    keys = [operand(k) for k in keys]
    shape = info(keys[0])[2]
    axis = axis % len(shape)
    iota = lax.broadcasted_iota(dtypes.int_, shape, axis)
    *_, perm = lax.sort(list(reversed(keys)) + [iota], dimension=axis, num_keys=len(keys))
    return perm


# -- sets, bins ---------------------------------------------------------------------------------


def isin(element, test_elements, assume_unique=False, invert=False):
    element = operand(element)
    test = sh.ravel(test_elements)
    eq = ew.equal(sh.expand_dims(element, -1), test)
    out = red.any(eq, axis=-1)
    return ew.logical_not(out) if invert else out


def in1d(ar1, ar2, assume_unique=False, invert=False):
    return isin(sh.ravel(ar1), ar2, invert=invert)


def _eager_set(fn):
    def wrapped(*arrays, **kwargs):
        out = fn(*[np.asarray(a) for a in arrays], **kwargs)
        return Array(out) if not isinstance(out, tuple) else tuple(Array(o) for o in out)

    wrapped.__name__ = fn.__name__
    wrapped.__doc__ = f"NumPy's {fn.__name__} (eager: the result's size depends on the values)."
    return wrapped


intersect1d = _eager_set(np.intersect1d)
union1d = _eager_set(np.union1d)
setdiff1d = _eager_set(np.setdiff1d)
setxor1d = _eager_set(np.setxor1d)
trim_zeros = _eager_set(np.trim_zeros)


def digitize(x, bins, right=False):
    x = operand(x)
    bins = operand(bins)
    b = np.asarray(bins) if not isinstance(bins, Tracer) else None
    increasing = True if b is None or b.size < 2 else bool(b[-1] >= b[0])
    if increasing:
        return sh.searchsorted(bins, x, side="left" if right else "right")
    n = info(bins)[2][0]
    rev = sh.flip(bins)
    return n - sh.searchsorted(rev, x, side="right" if right else "left")


def ediff1d(ary, to_end=None, to_begin=None):
    d = sh.diff(sh.ravel(ary))
    parts = ([sh.ravel(to_begin)] if to_begin is not None else []) + [d]
    parts += [sh.ravel(to_end)] if to_end is not None else []
    return sh.concatenate(parts) if len(parts) > 1 else d


# -- signal, statistics, polynomials -------------------------------------------------------------


def convolve(a, v, mode="full", *, precision=None, preferred_element_type=None):
    """1-D discrete convolution (NumPy's modes full, same, valid)."""
    a, v = operand(a), operand(v)
    if len(info(a)[2]) != 1 or len(info(v)[2]) != 1:
        raise user_error(ShapeError, "convolve: both inputs must be 1-D")
    return _correlate(a, sh.flip(v), mode)


def correlate(a, v, mode="valid", *, precision=None, preferred_element_type=None):
    return _correlate(operand(a), operand(v), mode)


def _correlate(a, v, mode):
    a, v = sh.promote_dtypes_only(a, v)
    if not dtypes.is_inexact(info(a)[0]):  # as JAX: integers and bools correlate in floats
        a, v = (lax.convert_element_type(x, dtypes.float_) for x in (a, v))
    n, m = info(a)[2][0], info(v)[2][0]
    if n < m:
        # correlation is symmetric up to reversal: keep the longer one first
        return sh.flip(_correlate(v, a, mode))
    full = n + m - 1
    padded = sh.pad(a, (m - 1, m - 1))
    # windows[i, j] = padded[i + j]: one gather, then a matrix-vector product
    idx = np.arange(full)[:, None] + np.arange(m)[None, :]
    windows = sh.take(padded, idx.astype(np.int32))
    out = red.sum(ew.multiply(windows, v), axis=1)
    if mode == "full":
        return out
    if mode == "same":
        start = (m - 1) // 2
        return out[start : start + n]
    if mode == "valid":
        return out[m - 1 : n]
    raise ValueError(f"mode must be one of 'full', 'same', 'valid', got {mode!r}")


def cov(m, y=None, rowvar=True, bias=False, ddof=None, fweights=None, aweights=None):
    x = operand(m)
    if len(info(x)[2]) == 1:
        x = sh.reshape(x, (1, -1))
    if not rowvar:
        x = sh.transpose(x)
    if y is not None:
        yy = operand(y)
        yy = sh.reshape(yy, (1, -1)) if len(info(yy)[2]) == 1 else yy
        x = sh.concatenate([x, yy if rowvar else sh.transpose(yy)], axis=0)
    if not dtypes.is_inexact(info(x)[0]):
        x = x.astype(dtypes.float_)
    n = info(x)[2][1]
    ddof = (0 if bias else 1) if ddof is None else ddof
    centered = ew.subtract(x, red.mean(x, axis=1, keepdims=True))

    c = ew.true_divide(matmul(centered, sh.transpose(centered)), n - ddof)
    return sh.squeeze(c) if info(c)[2] == (1, 1) else c


def corrcoef(x, y=None, rowvar=True):
    c = cov(x, y, rowvar)
    if len(info(c)[2]) == 0:
        return ew.true_divide(c, c)
    d = sh.diagonal(c) if hasattr(sh, "diagonal") else None

    d = ew.sqrt(diagonal(c))
    return ew.clip(ew.true_divide(ew.true_divide(c, d[:, None]), d[None, :]), -1, 1)


def polyval(p, x, *, unroll=16):
    p = operand(p)
    x = operand(x)
    out = ew.multiply(x, 0)
    for i in range(info(p)[2][0]):
        out = ew.add(ew.multiply(out, x), p[i])
    return out


def polyadd(a1, a2):
    a1, a2 = sh.ravel(a1), sh.ravel(a2)
    n1, n2 = info(a1)[2][0], info(a2)[2][0]
    if n1 < n2:
        a1 = sh.pad(a1, (n2 - n1, 0))
    elif n2 < n1:
        a2 = sh.pad(a2, (n1 - n2, 0))
    return ew.add(a1, a2)


def polymul(a1, a2, *, trim_leading_zeros=False):
    return convolve(sh.ravel(a1), sh.ravel(a2))


def polyder(p, m=1):
    p = operand(p)
    for _ in range(m):
        n = info(p)[2][0]
        p = ew.multiply(p[:-1], np.arange(n - 1, 0, -1))
    return p


def polyfit(x, y, deg, rcond=None, full=False, w=None, cov=False):
    from fflow.numpy import linalg as la  # lazy: jnp.linalg loads on first use

    x = operand(x)
    vander_ = vander(x, deg + 1)
    return la.lstsq(vander_, operand(y), rcond=rcond)[0]


def vander(x, N=None, increasing=False):
    x = operand(x)
    n = info(x)[2][0] if N is None else N
    powers = np.arange(n) if increasing else np.arange(n - 1, -1, -1)
    return ew.power(
        sh.expand_dims(x, -1),
        powers.astype(np.int32) if dtypes.is_int(info(x)[0]) else powers.astype(info(x)[0]),
    )


def trapezoid(y, x=None, dx=1.0, axis=-1):
    y = operand(y)
    n = info(y)[2][axis]
    y0 = lax.slice_in_dim(y, 0, n - 1, axis=axis % len(info(y)[2]))
    y1 = lax.slice_in_dim(y, 1, n, axis=axis % len(info(y)[2]))
    avg = ew.multiply(ew.add(y0, y1), 0.5)
    if x is None:
        return ew.multiply(red.sum(avg, axis=axis), dx)
    d = sh.diff(operand(x), axis=axis if len(info(operand(x))[2]) > 1 else -1)
    return red.sum(ew.multiply(avg, d), axis=axis)


def gradient(f, *varargs, axis=None, edge_order=None):
    f = operand(f)
    nd = len(info(f)[2])
    axes = range(nd) if axis is None else [axis] if isinstance(axis, int) else axis
    spacing = list(varargs) if varargs else [1.0] * len(list(axes))
    outs = []
    for ax, h in zip(axes, spacing):
        n = info(f)[2][ax]
        inner = ew.true_divide(
            ew.subtract(lax.slice_in_dim(f, 2, n, axis=ax), lax.slice_in_dim(f, 0, n - 2, axis=ax)),
            2 * h,
        )
        first = ew.true_divide(
            ew.subtract(lax.slice_in_dim(f, 1, 2, axis=ax), lax.slice_in_dim(f, 0, 1, axis=ax)), h
        )
        last = ew.true_divide(
            ew.subtract(
                lax.slice_in_dim(f, n - 1, n, axis=ax), lax.slice_in_dim(f, n - 2, n - 1, axis=ax)
            ),
            h,
        )
        outs.append(sh.concatenate([first, inner, last], axis=ax))
    return outs[0] if len(outs) == 1 else outs


def geomspace(start, stop, num=50, endpoint=True, dtype=None, axis=0):
    value = np.geomspace(start, stop, num, endpoint=endpoint, axis=axis)
    return Array(value.astype(dtypes.canonicalize(dtype) if dtype else np.float32))


def fromfunction(function, shape, *, dtype=float, **kwargs):
    grids = [Array(g.astype(dtypes.canonicalize(dtype))) for g in np.indices(shape)]
    return function(*grids, **kwargs)


def _window(np_fn):
    def fn(M, *args):
        return Array(np_fn(M, *args).astype(np.float32))

    fn.__name__ = np_fn.__name__
    return fn


hamming = _window(np.hamming)
hanning = _window(np.hanning)
blackman = _window(np.blackman)
bartlett = _window(np.bartlett)
kaiser = _window(np.kaiser)


# -- complex-number and dtype helpers (fflow arrays are real) -----------------------------------


imag = ew.imag


def angle(z, deg=False):
    z = operand(z)
    if info(z)[0].kind == "c":
        out = ew.arctan2(ew.imag(z), ew.real(z))
    else:
        out = ew.where(ew.less(z, 0), np.pi, 0.0)
    return strong(ew.rad2deg(out) if deg else out)  # JAX: never weakly typed


def block(arrays):
    """Assemble an array from nested lists of blocks (NumPy's block): the innermost lists
    join along the last axis, the next level along the one before, and so on."""

    def depth(x):
        return 1 + depth(x[0]) if isinstance(x, list) and x else 0

    d = depth(arrays)
    leaves = []

    def collect(x):
        if isinstance(x, list):
            for e in x:
                collect(e)
        else:
            leaves.append(asarray(x))

    collect(arrays)
    ndim = builtins.max([d] + [len(info(a)[2]) for a in leaves])
    it = iter(leaves)

    def build(x, level):
        if not isinstance(x, list):
            a = next(it)
            return sh.reshape(a, (1,) * (ndim - len(info(a)[2])) + tuple(info(a)[2]))
        return sh.concatenate([build(e, level - 1) for e in x], axis=-level)

    return build(arrays, d)


def iscomplexobj(x):
    return np.dtype(info(x)[0]).kind == "c"


def isrealobj(x):
    return not iscomplexobj(x)


def iscomplex(x):
    return ew.not_equal(imag(x), 0)


def isreal(x):
    return ew.equal(imag(x), 0)


def isdtype(dtype, kind):
    return np.isdtype(np.dtype(dtype), kind)


def array_equiv(a1, a2):
    try:
        return red.all(ew.equal(a1, a2))
    except Exception:
        return Array(np.asarray(False))


def ldexp(x1, x2):
    x1 = operand(x1)
    dtype = info(x1)[0] if dtypes.is_inexact(info(x1)[0]) else dtypes.float_
    return ew.multiply(x1, ew.power(np.asarray(2, dtype), operand(x2).astype(dtype)))


def modf(x):
    x = operand(x)
    whole = ew.trunc(x)
    return ew.subtract(x, whole), whole


def frexp(x):
    x = operand(x)
    ax = ew.abs(x)
    e = ew.where(ew.equal(ax, 0), 0, ew.floor(ew.log2(ew.where(ew.equal(ax, 0), 1, ax))) + 1)
    m = ew.true_divide(x, ew.power(2.0, e))
    return m, e.astype(np.int32)


def vecdot(x1, x2, /, *, axis=-1):
    return red.sum(ew.multiply(x1, x2), axis=axis)


def matvec(x1, x2, /):

    return sh.squeeze(matmul(x1, sh.expand_dims(x2, -1)), -1)


def vecmat(x1, x2, /):

    return sh.squeeze(matmul(sh.expand_dims(x1, -2), x2), -2)


def bitwise_count(x):
    """The set bits of |x| (NumPy's and JAX's rule: int8 -1 counts 1), as uint8."""
    x = operand(x)
    if info(x)[0].kind == "i":
        x = ew.abs(x)
    return lax.population_count(x).astype(np.uint8)


def _bit_weights(bitorder, ndim):
    if bitorder not in ("little", "big"):
        raise ValueError(f"bitorder must be 'little' or 'big', got {bitorder!r}")
    bits = np.arange(8, dtype=np.uint8)
    return asarray((bits[::-1] if bitorder == "big" else bits).reshape((1,) * ndim + (8,)))


def packbits(a, axis=None, bitorder="big"):
    """Pack the truth of each element into the bits of uint8s (8 per byte, padded with 0)."""
    a = operand(a)
    if info(a)[0].kind not in "biu":
        raise user_error(TypeError, "packbits: expected an integer or boolean array")
    a = ew.not_equal(a, 0).astype(np.uint8)
    if axis is None:
        a, axis = sh.ravel(a), 0
    a = sh.swapaxes(a, axis, -1)
    n = info(a)[2][-1]
    if n % 8:
        a = sh.pad(a, [(0, 0)] * (len(info(a)[2]) - 1) + [(0, 8 - n % 8)])
    a = sh.reshape(a, info(a)[2][:-1] + (-(-n // 8), 8))
    packed = red.sum(ew.left_shift(a, _bit_weights(bitorder, len(info(a)[2]) - 1)), axis=-1)
    return sh.swapaxes(packed.astype(np.uint8), axis, -1)


def unpackbits(a, axis=None, count=None, bitorder="big"):
    """The bits of a uint8 array, 8 per element along `axis` (flattened when None);
    `count` keeps the first `count` (pads with 0 beyond; negative drops from the end)."""
    a = operand(a)
    if info(a)[0] != np.uint8:
        raise user_error(TypeError, "unpackbits: expected a uint8 array")
    if axis is None:
        a, axis = sh.ravel(a), 0
    a = sh.swapaxes(a, axis, -1)
    shifted = ew.right_shift(sh.expand_dims(a, -1), _bit_weights(bitorder, len(info(a)[2])))
    bits = ew.bitwise_and(shifted, np.uint8(1))
    bits = sh.reshape(bits, info(bits)[2][:-2] + (-1,))
    if count is not None:
        n = info(bits)[2][-1]
        if count > n:
            bits = sh.pad(bits, [(0, 0)] * (len(info(bits)[2]) - 1) + [(0, count - n)])
        else:
            bits = bits[..., :count]
    return sh.swapaxes(bits, axis, -1)


bitwise_invert = ew.bitwise_not
bool = np.bool_  # noqa: A001
iterable = np.iterable


def piecewise(x, condlist, funclist, *args, **kw):
    """NumPy's piecewise: `funclist[i]` (a callable or a value) where `condlist[i]`
    holds (the last true condition wins); an extra last entry is the default."""

    x = asarray(x)
    if not isinstance(condlist, (list, tuple)):
        condlist = [condlist]
    condlist = list(condlist)
    dtype = info(x)[0]

    def value(f):
        return asarray(f(x, *args, **kw) if callable(f) else f).astype(dtype)

    out = zeros_like(x)
    if len(funclist) == len(condlist) + 1:
        out = out + value(funclist[-1])
        cond_any = condlist[0]
        for c in condlist[1:]:
            cond_any = cond_any | c
        out = where(cond_any, zeros_like(x), out)
    for c, f in zip(condlist, funclist):
        out = where(c, value(f), out)
    return out


# the jax.numpy names this module gives fflow.numpy (its `import *`)
__all__ = [
    "angle",
    "append",
    "apply_along_axis",
    "apply_over_axes",
    "argpartition",
    "array_equiv",
    "bartlett",
    "bitwise_count",
    "block",
    "packbits",
    "unpackbits",
    "bitwise_invert",
    "blackman",
    "bool",
    "choose",
    "compress",
    "convolve",
    "corrcoef",
    "correlate",
    "cov",
    "delete",
    "diag_indices",
    "diag_indices_from",
    "diagflat",
    "digitize",
    "dsplit",
    "ediff1d",
    "extract",
    "fill_diagonal",
    "frexp",
    "fromfunction",
    "geomspace",
    "gradient",
    "hamming",
    "hanning",
    "imag",
    "index_exp",
    "indices",
    "insert",
    "intersect1d",
    "iscomplex",
    "iscomplexobj",
    "isdtype",
    "isin",
    "isreal",
    "isrealobj",
    "iterable",
    "ix_",
    "kaiser",
    "ldexp",
    "lexsort",
    "mask_indices",
    "matvec",
    "mgrid",
    "modf",
    "ogrid",
    "partition",
    "piecewise",
    "polyadd",
    "polyder",
    "polyfit",
    "polymul",
    "polyval",
    "put_along_axis",
    "ravel_multi_index",
    "resize",
    "rollaxis",
    "s_",
    "setdiff1d",
    "setxor1d",
    "trapezoid",
    "tril_indices",
    "tril_indices_from",
    "trim_zeros",
    "triu_indices",
    "triu_indices_from",
    "union1d",
    "unravel_index",
    "unstack",
    "vander",
    "vecdot",
    "vecmat",
    "vectorize",
]
