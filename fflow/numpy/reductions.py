"""Reductions with `axis` / `keepdims` (sum, mean, var, std, max, min, prod, ...)."""

import builtins

import numpy as np

from fflow import dtypes
from fflow import lax_ops as lax
from fflow.array import Array
from fflow.errors import user_error
from fflow.numpy._util import canonical_axes, canonical_axis, convert, info, operand, strong
from fflow.numpy.elementwise import _bool, multiply
from fflow.numpy.elementwise import where as _where


def _keep(out, axes, shape, keepdims):
    if not keepdims:
        return out
    kept = [1 if i in axes else d for i, d in enumerate(shape)]
    return lax.reshape(out, kept)


def _sum_dtype(d):
    # like JAX: bool and small ints accumulate in the default int
    if d == np.bool_ or (d.kind in "iu" and d.itemsize < 4):
        return dtypes.int_ if d.kind != "u" else np.dtype(np.uint32)
    return d


def _prep(a, axis, dtype, where=None, initial=None):
    a = operand(a)
    d, _, shape = info(a)
    axes = canonical_axes(axis, len(shape))
    return a, d, shape, axes


def sum(a, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=None):  # noqa: A001
    a, d, shape, axes = _prep(a, axis, dtype)
    target = dtypes.canonicalize(dtype) if dtype is not None else _sum_dtype(d)
    a = convert(a, target)
    if where is not None:
        a = _where(where, a, 0)
    res = lax.reduce_sum(a, axes) if axes else a
    if initial is not None:
        res = lax.add(res, lax.full_like(res, initial))
    return _keep(res, axes, shape, keepdims)


def prod(a, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=None):
    a, d, shape, axes = _prep(a, axis, dtype)
    target = dtypes.canonicalize(dtype) if dtype is not None else _sum_dtype(d)
    a = convert(a, target)
    if where is not None:
        a = _where(where, a, 1)
    res = lax.reduce_prod(a, axes) if axes else a
    if initial is not None:
        res = lax.mul(res, lax.full_like(res, initial))
    return _keep(res, axes, shape, keepdims)


def _extremum(lax_fn, name):
    def fn(a, axis=None, out=None, keepdims=False, initial=None, where=None):
        a, d, shape, axes = _prep(a, axis, None)
        if where is not None:
            if initial is None:
                raise user_error(
                    ValueError, f"{name} with where= needs initial=. Fix: pass initial=."
                )
            a = _where(where, a, initial)
        if builtins.any(shape[i] == 0 for i in axes) and initial is None:
            raise user_error(
                ValueError,
                f"zero-size array to reduction operation {name} which has no identity. "
                f"Fix: pass initial= (e.g. {name}(x, initial=-inf)) or check x.size first.",
            )
        if builtins.any(shape[i] == 0 for i in axes):  # empty: just `initial`
            kept = tuple(n for i, n in enumerate(shape) if i not in axes)
            res = _keep(lax.full(kept, initial, d), axes, shape, keepdims)
            return Array(res) if type(res) is np.ndarray else res
        res = lax_fn(a, axes) if axes else a
        if initial is not None:
            other = lax.full_like(res, initial)
            res = lax.max(res, other) if name == "max" else lax.min(res, other)
        return _keep(res, axes, shape, keepdims)

    fn.__name__ = name
    return fn


max = _extremum(lax.reduce_max, "max")  # noqa: A001
min = _extremum(lax.reduce_min, "min")  # noqa: A001
amax, amin = max, min


def all(a, axis=None, out=None, keepdims=False, where=None):  # noqa: A001

    a, d, shape, axes = _prep(a, axis, None)
    a = _bool(a)
    res = lax.reduce_and(a, axes) if axes else a
    return _keep(res, axes, shape, keepdims)


def any(a, axis=None, out=None, keepdims=False, where=None):  # noqa: A001

    a, d, shape, axes = _prep(a, axis, None)
    a = _bool(a)
    res = lax.reduce_or(a, axes) if axes else a
    return _keep(res, axes, shape, keepdims)


def _count(shape, axes):
    return int(np.prod([shape[i] for i in axes], dtype=np.int64))


def mean(a, axis=None, dtype=None, out=None, keepdims=False, where=None):
    a, d, shape, axes = _prep(a, axis, dtype)
    target = (
        dtypes.canonicalize(dtype)
        if dtype is not None
        else (d if dtypes.is_inexact(d) else dtypes.float_)
    )
    a = convert(a, target)
    if where is not None:
        total = sum(_where(where, a, 0), axis=axis, keepdims=keepdims)
        count = sum(_where(where, 1.0, 0.0), axis=axis, keepdims=keepdims)
        return lax.div(total, convert(count, target))
    total = sum(a, axis=axis, keepdims=keepdims)
    n = _count(shape, axes)
    return lax.div(total, lax.full_like(total, n))


def var(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, where=None):
    a, d, shape, axes = _prep(a, axis, dtype)
    target = (
        dtypes.canonicalize(dtype)
        if dtype is not None
        else (d if dtypes.is_inexact(d) else dtypes.float_)
    )
    a = convert(a, target)
    m = mean(a, axis=axis, keepdims=True)
    centered = lax.sub(a, lax.broadcast_in_dim(m, shape, tuple(range(len(shape)))))
    sq = lax.mul(centered, centered)
    total = sum(sq, axis=axis, keepdims=keepdims)
    n = _count(shape, axes) - ddof
    return lax.div(total, lax.full_like(total, n))


def std(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, where=None):
    return lax.sqrt(var(a, axis=axis, dtype=dtype, ddof=ddof, keepdims=keepdims))


def _arg(lax_fn, name):
    def fn(a, axis=None, out=None, keepdims=False):
        a = operand(a)
        d, _, shape = info(a)
        if axis is None:
            flat = lax.reshape(a, (int(np.prod(shape, dtype=np.int64)),))
            res = lax_fn(flat, 0, dtypes.int_)
            return lax.reshape(res, (1,) * len(shape)) if keepdims else res
        ax = canonical_axis(axis, len(shape))
        res = lax_fn(a, ax, dtypes.int_)
        return _keep(res, (ax,), shape, keepdims)

    fn.__name__ = name
    return fn


argmax = _arg(lax.argmax, "argmax")
argmin = _arg(lax.argmin, "argmin")


def _cumulative(lax_fn, name, promote_small=True):
    def fn(a, axis=None, dtype=None, out=None):
        a = operand(a)
        d, _, shape = info(a)
        if axis is None:
            a = lax.reshape(a, (int(np.prod(shape, dtype=np.int64)),))
            axis = 0
            shape = info(a)[2]
        # like JAX: cumulative ops keep the dtype (bool becomes the default int)
        target = (
            dtypes.canonicalize(dtype)
            if dtype is not None
            else _sum_dtype(d)
            if promote_small
            else (dtypes.int_ if d == np.bool_ else d)
        )
        a = convert(a, target)
        return lax_fn(a, canonical_axis(axis, len(shape)))

    fn.__name__ = name
    return fn


cumsum = _cumulative(lax.cumsum, "cumsum", promote_small=False)
cumprod = _cumulative(lax.cumprod, "cumprod", promote_small=False)
cumulative_sum = _cumulative(lax.cumsum, "cumulative_sum")
cumulative_prod = _cumulative(lax.cumprod, "cumulative_prod")


def count_nonzero(a, axis=None, keepdims=False):
    return sum(_bool(a), axis=axis, keepdims=keepdims)


def average(a, axis=None, weights=None, returned=False, keepdims=False):
    if weights is None:
        avg = mean(a, axis=axis, keepdims=keepdims)
        n = lax.full_like(avg, _count(info(a)[2], canonical_axes(axis, len(info(a)[2]))))
        return (avg, n) if returned else avg

    shape = info(a)[2]
    if len(info(weights)[2]) == 1 and len(shape) > 1 and isinstance(axis, int):
        # NumPy/JAX: 1-D weights run along `axis`
        ax = axis % len(shape)
        weights = lax.broadcast_in_dim(
            operand(weights), shape[:ax] + (info(weights)[2][0],) + shape[ax + 1 :], (ax,)
        )
    wsum = sum(weights, axis=axis, keepdims=keepdims)
    avg = lax.div(sum(multiply(a, weights), axis=axis, keepdims=keepdims), wsum)
    return (avg, wsum) if returned else avg


def ptp(a, axis=None, keepdims=False):
    return lax.sub(max(a, axis=axis, keepdims=keepdims), min(a, axis=axis, keepdims=keepdims))


# the jax.numpy names this module gives fflow.numpy (its `import *`)
def _strong_result(fn):
    # JAX's reductions cast their result to its dtype: never weakly typed (sum(2.0) too)
    def wrapped(*args, **kwargs):
        return strong(fn(*args, **kwargs))

    wrapped.__name__, wrapped.__doc__ = fn.__name__, fn.__doc__
    return wrapped


sum, prod, max, min, mean, var, std, cumsum, cumprod = (  # noqa: A001
    _strong_result(f) for f in (sum, prod, max, min, mean, var, std, cumsum, cumprod)
)
amax, amin = max, min
cumulative_sum, cumulative_prod = _strong_result(cumulative_sum), _strong_result(cumulative_prod)

__all__ = [
    "all",
    "amax",
    "amin",
    "any",
    "argmax",
    "argmin",
    "average",
    "count_nonzero",
    "cumprod",
    "cumsum",
    "cumulative_prod",
    "cumulative_sum",
    "max",
    "mean",
    "min",
    "prod",
    "ptp",
    "std",
    "sum",
    "var",
]
