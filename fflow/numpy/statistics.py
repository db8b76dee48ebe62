"""Order statistics and NaN-aware reductions: quantile, percentile, median, nan*,
plus bincount, histogram, interp, cross, select, fmax/fmin (JAX's semantics)."""

import builtins

import numpy as np

from fflow import dtypes
from fflow import lax_ops as lax
from fflow.errors import ShapeError, user_error
from fflow.numpy import elementwise as ew
from fflow.numpy import reductions as red
from fflow.numpy import shapes as sh
from fflow.numpy._util import canonical_axes, info, operand


def _as_float(a):
    a = operand(a)
    return a if dtypes.is_inexact(info(a)[0]) else lax.convert_element_type(a, dtypes.float_)


def _move_axes_last(a, axis):
    """(array with the reduced axes flattened into the last one, kept shape for keepdims)."""
    shape = info(a)[2]
    axes = canonical_axes(axis, len(shape))
    rest = [i for i in range(len(shape)) if i not in axes]
    a = lax.transpose(a, tuple(rest) + axes) if axes != tuple(range(len(rest), len(shape))) else a
    n = int(np.prod([shape[i] for i in axes], dtype=np.int64))
    a = lax.reshape(a, tuple(shape[i] for i in rest) + (n,))
    kept = tuple(1 if i in axes else d for i, d in enumerate(shape))
    return a, kept


def quantile(a, q, axis=None, out=None, overwrite_input=False, method="linear", keepdims=False):
    """The q-th quantile(s) along `axis` (q in [0, 1]); NumPy's methods linear, lower,
    higher, nearest, midpoint."""
    a = _as_float(a)
    a, kept = _move_axes_last(a, axis)
    n = info(a)[2][-1]
    s = sh.sort(a, axis=-1)
    dtype = info(a)[0]
    qv = operand(q)
    qv = lax.convert_element_type(qv, dtype) if info(qv)[0] != dtype else qv
    pos = ew.multiply(qv, n - 1)
    lo = ew.floor(pos)
    hi = ew.ceil(pos)
    if method == "lower":
        pos = lo
    elif method == "higher":
        pos = hi
    elif method == "nearest":
        pos = ew.round(pos)
    lo_i = lax.convert_element_type(ew.clip(lo, 0, n - 1), dtypes.int_)
    hi_i = lax.convert_element_type(ew.clip(hi, 0, n - 1), dtypes.int_)
    q_shape = info(qv)[2]
    batch = info(s)[2][:-1]

    def gather(idx):
        flat = sh.reshape(idx, (-1,))
        g = sh.take(s, flat, axis=-1)  # batch + (nq,)
        g = sh.moveaxis(g, -1, 0)
        return sh.reshape(g, tuple(q_shape) + tuple(batch))

    if method in ("lower", "higher", "nearest"):
        idx = lax.convert_element_type(ew.clip(pos, 0, n - 1), dtypes.int_)
        res = gather(idx)
    else:
        v_lo, v_hi = gather(lo_i), gather(hi_i)
        nb = len(batch)
        if method == "midpoint":
            w = ew.where(ew.equal(lo, hi), 0.0, 0.5)
        else:
            w = ew.subtract(pos, lo)
        w = sh.reshape(w, tuple(q_shape) + (1,) * nb)
        res = ew.add(v_lo, ew.multiply(ew.subtract(v_hi, v_lo), w))
    if keepdims:
        res = sh.reshape(res, tuple(q_shape) + kept)
    return res


def percentile(a, q, axis=None, out=None, overwrite_input=False, method="linear", keepdims=False):
    q = ew.true_divide(q, 100.0) if not isinstance(q, (int, float)) else q / 100.0
    return quantile(a, q, axis=axis, method=method, keepdims=keepdims)


def median(a, axis=None, out=None, overwrite_input=False, keepdims=False):
    return quantile(a, 0.5, axis=axis, keepdims=keepdims)


def _nan_mask(a):
    a = operand(a)
    if not dtypes.is_inexact(info(a)[0]):
        return a, None
    return a, ew.isnan(a)


def nansum(a, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=None):
    a, nan = _nan_mask(a)
    if nan is not None:
        a = ew.where(nan, 0, a)
    return red.sum(a, axis=axis, dtype=dtype, keepdims=keepdims, initial=initial, where=where)


def nanprod(a, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=None):
    a, nan = _nan_mask(a)
    if nan is not None:
        a = ew.where(nan, 1, a)
    return red.prod(a, axis=axis, dtype=dtype, keepdims=keepdims, initial=initial, where=where)


def nanmax(a, axis=None, out=None, keepdims=False, initial=None, where=None):
    a, nan = _nan_mask(a)
    if nan is None:
        return red.max(a, axis=axis, keepdims=keepdims, initial=initial, where=where)
    out = red.max(ew.where(nan, -np.inf, a), axis=axis, keepdims=keepdims, initial=initial)
    all_nan = red.all(nan, axis=axis, keepdims=keepdims)
    return ew.where(all_nan, np.nan, out)


def nanmin(a, axis=None, out=None, keepdims=False, initial=None, where=None):
    a, nan = _nan_mask(a)
    if nan is None:
        return red.min(a, axis=axis, keepdims=keepdims, initial=initial, where=where)
    out = red.min(ew.where(nan, np.inf, a), axis=axis, keepdims=keepdims, initial=initial)
    all_nan = red.all(nan, axis=axis, keepdims=keepdims)
    return ew.where(all_nan, np.nan, out)


def nanmean(a, axis=None, dtype=None, out=None, keepdims=False, where=None):
    a = _as_float(a)
    nan = ew.isnan(a)
    total = red.sum(ew.where(nan, 0, a), axis=axis, dtype=dtype, keepdims=keepdims)
    count = red.sum(ew.logical_not(nan), axis=axis, keepdims=keepdims)
    return ew.true_divide(total, count.astype(info(total)[0]))


def nanvar(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, where=None):
    a = _as_float(a)
    nan = ew.isnan(a)
    ok = ew.logical_not(nan)
    count = red.sum(ok, axis=axis, keepdims=True).astype(info(a)[0])
    mean = ew.true_divide(red.sum(ew.where(nan, 0, a), axis=axis, keepdims=True), count)
    centered = ew.where(ok, ew.subtract(a, mean), 0)
    ss = red.sum(ew.multiply(centered, centered), axis=axis, keepdims=keepdims)
    if not keepdims:
        count = red.sum(ok, axis=axis).astype(info(a)[0])
    return ew.true_divide(ss, ew.maximum(ew.subtract(count, ddof), 0))


def nanstd(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, where=None):
    return ew.sqrt(nanvar(a, axis=axis, ddof=ddof, keepdims=keepdims))


def nanmedian(a, axis=None, out=None, overwrite_input=False, keepdims=False):
    return nanquantile(a, 0.5, axis=axis, keepdims=keepdims)


def nanquantile(a, q, axis=None, out=None, overwrite_input=False, method="linear", keepdims=False):
    """Eager only when NaNs are present: the count of valid entries varies per row."""
    a = _as_float(a)
    value = np.asarray(a)
    return operand(np.nanquantile(value, np.asarray(q), axis=axis, keepdims=keepdims)).astype(
        info(a)[0]
    )


def nancumsum(a, axis=None, dtype=None, out=None):
    a, nan = _nan_mask(a)
    return red.cumsum(a if nan is None else ew.where(nan, 0, a), axis=axis, dtype=dtype)


def nancumprod(a, axis=None, dtype=None, out=None):
    a, nan = _nan_mask(a)
    return red.cumprod(a if nan is None else ew.where(nan, 1, a), axis=axis, dtype=dtype)


def nanargmax(a, axis=None, out=None, keepdims=False):
    a, nan = _nan_mask(a)
    return red.argmax(a if nan is None else ew.where(nan, -np.inf, a), axis, keepdims=keepdims)


def nanargmin(a, axis=None, out=None, keepdims=False):
    a, nan = _nan_mask(a)
    return red.argmin(a if nan is None else ew.where(nan, np.inf, a), axis, keepdims=keepdims)


# -- counting and binning ----------------------------------------------------------------


def bincount(x, weights=None, minlength=0, *, length=None):
    """Counts of each value of a non-negative int array; `length` makes it traceable."""
    x = operand(x)
    if length is None:
        value = np.asarray(x)
        length = builtins.max(int(value.max()) + 1 if value.size else 0, minlength)
    x = sh.reshape(x, (-1,))
    n = info(x)[2][0]
    w = lax.full((n,), 1, dtypes.int_) if weights is None else sh.reshape(operand(weights), (-1,))
    dtype = info(w)[0]
    idx = lax.reshape(lax.convert_element_type(x, dtypes.int_), (n, 1))
    return lax.scatter_add(lax.full((int(length),), 0, dtype), idx, w, (0,))


def histogram(a, bins=10, range=None, weights=None, density=None):  # noqa: A002
    """Counts per bin (static bin count); edges from `range` or the data's min/max."""
    a = _as_float(sh.ravel(a))
    if isinstance(bins, int):
        if range is None:
            lo, hi = red.min(a), red.max(a)
        else:
            lo, hi = range
        edges = ew.add(lo, ew.multiply(ew.subtract(hi, lo), np.linspace(0, 1, bins + 1)))
        edges = operand(edges).astype(info(a)[0])
    else:
        edges = _as_float(bins)
    nb = info(edges)[2][0] - 1
    idx = sh.searchsorted(edges, a, side="right") - 1
    # the last edge is inclusive
    idx = ew.where(ew.equal(a, edges[-1]), nb - 1, idx)
    valid = ew.logical_and(ew.greater_equal(idx, 0), ew.less(idx, nb))
    w = lax.full_like(a, 1) if weights is None else _as_float(sh.ravel(weights))
    w = ew.where(valid, w, 0)
    idx = ew.clip(idx, 0, nb - 1)
    counts = lax.scatter_add(
        lax.full((nb,), 0, info(w)[0]), lax.reshape(idx, (info(idx)[2][0], 1)), w, (0,)
    )
    if density:
        widths = ew.subtract(edges[1:], edges[:-1])
        counts = ew.true_divide(counts, ew.multiply(red.sum(counts), widths))
    return counts, edges


# -- misc -------------------------------------------------------------------------------------


def interp(x, xp, fp, left=None, right=None, period=None):
    """Piecewise-linear interpolation of (xp, fp) at x (xp increasing)."""
    x, xp, fp = _as_float(x), _as_float(xp), _as_float(fp)
    n = info(xp)[2][0]
    i = ew.clip(sh.searchsorted(xp, x, side="right"), 1, n - 1)
    x0, x1 = sh.take(xp, i - 1), sh.take(xp, i)
    f0, f1 = sh.take(fp, i - 1), sh.take(fp, i)
    dx = ew.subtract(x1, x0)
    safe = ew.where(ew.equal(dx, 0), 1, dx)
    t = ew.true_divide(ew.subtract(x, x0), safe)
    out = ew.add(f0, ew.multiply(t, ew.subtract(f1, f0)))
    out = ew.where(ew.less(x, xp[0]), fp[0] if left is None else left, out)
    return ew.where(ew.greater(x, xp[-1]), fp[-1] if right is None else right, out)


def cross(a, b, axisa=-1, axisb=-1, axisc=-1, axis=None):
    """The cross product of 3-vectors (2-vectors get a zero z component)."""
    if axis is not None:
        axisa = axisb = axisc = axis
    a = sh.moveaxis(operand(a), axisa, -1)
    b = sh.moveaxis(operand(b), axisb, -1)
    if info(a)[2][-1] not in (2, 3) or info(b)[2][-1] not in (2, 3):
        raise user_error(ShapeError, "cross: vectors must have 2 or 3 components")
    if info(a)[2][-1] == 2:
        a = sh.pad(a, [(0, 0)] * (len(info(a)[2]) - 1) + [(0, 1)])
    if info(b)[2][-1] == 2:
        b = sh.pad(b, [(0, 0)] * (len(info(b)[2]) - 1) + [(0, 1)])
    a0, a1, a2 = a[..., 0], a[..., 1], a[..., 2]
    b0, b1, b2 = b[..., 0], b[..., 1], b[..., 2]
    c = sh.stack(
        [
            ew.subtract(ew.multiply(a1, b2), ew.multiply(a2, b1)),
            ew.subtract(ew.multiply(a2, b0), ew.multiply(a0, b2)),
            ew.subtract(ew.multiply(a0, b1), ew.multiply(a1, b0)),
        ],
        axis=-1,
    )
    return sh.moveaxis(c, -1, axisc)


def select(condlist, choicelist, default=0):
    """The first choice whose condition holds, elementwise."""
    if len(condlist) != len(choicelist):
        raise ValueError("select: condlist and choicelist must have the same length")
    out = default
    for cond, choice in reversed(list(zip(condlist, choicelist))):
        out = ew.where(cond, choice, out)
    return operand(out)


def fmax(x1, x2):
    """Elementwise maximum that ignores NaNs."""
    x1, x2 = operand(x1), operand(x2)
    return ew.where(ew.isnan(x2), x1, ew.where(ew.isnan(x1), x2, ew.maximum(x1, x2)))


def fmin(x1, x2):
    x1, x2 = operand(x1), operand(x2)
    return ew.where(ew.isnan(x2), x1, ew.where(ew.isnan(x1), x2, ew.minimum(x1, x2)))


# the jax.numpy names this module gives fflow.numpy (its `import *`)
__all__ = [
    "bincount",
    "cross",
    "fmax",
    "fmin",
    "histogram",
    "interp",
    "median",
    "nanargmax",
    "nanargmin",
    "nancumprod",
    "nancumsum",
    "nanmax",
    "nanmean",
    "nanmedian",
    "nanmin",
    "nanprod",
    "nanquantile",
    "nanstd",
    "nansum",
    "nanvar",
    "percentile",
    "quantile",
    "select",
]
