"""Reductions over `axes`: sum, max, min, prod, argmax, argmin."""

import numpy as np
from fflow.transforms.autodiff import deflinear, defzero, jvp_rules

from fflow import dtypes
from fflow import lax_ops as lax
from fflow.core import Primitive, ShapedArray
from fflow.errors import ShapeError, user_error


def _check_axes(name, x, axes):
    for a in axes:
        if not 0 <= a < x.ndim:
            raise user_error(
                ShapeError,
                f"{name}: axis {a} is out of range for an array of rank {x.ndim}. Fix: an "
                f"axis in [{-x.ndim}, {x.ndim}).",
            )
    if len(set(axes)) != len(axes):
        raise user_error(ShapeError, f"{name}: repeated axis in {axes}. Fix: list each axis once.")


def _reduce_shape(shape, axes):
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def reduction(name, np_fn, amp="fp32", out_dtype=None, accumulate_wide=False):
    prim = Primitive(name)
    prim.traits.add("reduction")
    prim.amp_class = amp

    def impl(x, *, axes):
        dtype = out_dtype or x.dtype
        if accumulate_wide and x.dtype.itemsize < 4 and dtypes.is_float(x.dtype):
            # NumPy sums bf16 in bf16 (1 + 1 + ... stalls at 256): accumulate in f32
            x = x.astype(np.float32)
        out = np_fn(x, axis=axes)
        if type(out) is not np.ndarray or out.dtype != dtype:
            out = np.asarray(out, dtype=dtype)
        return out

    def abstract_eval(x, *, axes):
        _check_axes(name, x, axes)
        return ShapedArray(_reduce_shape(x.shape, axes), out_dtype or x.dtype, x.weak_type)

    prim.impl = impl
    prim.abstract_eval = abstract_eval
    return prim


reduce_sum_p = reduction("reduce_sum", np.sum, accumulate_wide=True)


def _reduce_sum_transpose(ct, x, *, axes):
    shape = x.aval.shape
    kept = tuple(i for i in range(len(shape)) if i not in axes)
    return [lax.broadcast_in_dim(ct, shape, kept)]


deflinear(reduce_sum_p, _reduce_sum_transpose)

reduce_max_p = reduction("reduce_max", np.max, amp="follow")
reduce_min_p = reduction("reduce_min", np.min, amp="follow")


def _chooser_jvp(prim):
    # The tangent is the mean of the tangents at the locations that attain the extremum.
    def rule(primals, tangents, *, axes):
        (x,), (t,) = primals, tangents
        out = prim.bind(x, axes=axes)
        kept = tuple(i for i in range(x.ndim) if i not in axes)
        out_b = lax.broadcast_in_dim(out, x.shape, kept)
        mask = lax.convert_element_type(lax.eq(x, out_b), t.dtype)
        count = lax.reduce_sum(mask, axes)
        return out, lax.div(lax.reduce_sum(lax.mul(t, mask), axes), count)

    jvp_rules[prim] = rule


_chooser_jvp(reduce_max_p)
_chooser_jvp(reduce_min_p)

reduce_prod_p = reduction("reduce_prod", np.prod, accumulate_wide=True)


def _reduce_prod_jvp(primals, tangents, *, axes):
    # d prod = sum_i t_i * prod_{j != i} x_j, with the exclusive products computed
    # by cumulative products from both sides (exact when some x_j are zero).
    (x,), (t,) = primals, tangents
    out = lax.reduce_prod(x, axes)
    kept = [i for i in range(x.ndim) if i not in axes]
    perm = kept + list(axes)
    n = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    lead = [x.shape[i] for i in kept]
    xs = lax.reshape(lax.transpose(x, perm), (*lead, n))
    ts = lax.reshape(lax.transpose(t, perm), (*lead, n))
    last = len(lead)
    ones = lax.full((*lead, 1), 1, x.dtype)
    left = lax.cumprod(
        lax.concatenate([ones, lax.slice_in_dim(xs, 0, n - 1, axis=last)], last), last
    )
    right = lax.cumprod(
        lax.concatenate([lax.slice_in_dim(xs, 1, n, axis=last), ones], last), last, reverse=True
    )
    others = lax.mul(left, right)
    return out, lax.reduce_sum(lax.mul(ts, others), (last,))


jvp_rules[reduce_prod_p] = _reduce_prod_jvp


def arg_reduction(name, np_fn):
    prim = Primitive(name)
    prim.traits.add("reduction")
    prim.amp_class = "follow"

    def impl(x, *, axes, index_dtype):
        (axis,) = axes
        return np.asarray(np_fn(x, axis=axis), dtype=index_dtype)

    def abstract_eval(x, *, axes, index_dtype):
        _check_axes(name, x, axes)
        return ShapedArray(_reduce_shape(x.shape, axes), index_dtype)

    prim.impl = impl
    prim.abstract_eval = abstract_eval
    defzero(prim)
    return prim


argmax_p = arg_reduction("argmax", np.argmax)
argmin_p = arg_reduction("argmin", np.argmin)

reduce_or_p = reduction("reduce_or", np.any, amp="follow", out_dtype=np.dtype(bool))
reduce_and_p = reduction("reduce_and", np.all, amp="follow", out_dtype=np.dtype(bool))
defzero(reduce_or_p)
defzero(reduce_and_p)


# the partial value each reduction produces from a split axis (transforms/shard_rules.py)
for _p, _kind in ((reduce_sum_p, "sum"), (reduce_max_p, "max"), (reduce_min_p, "min"),
                  (reduce_or_p, "max"), (reduce_and_p, "min")):  # fmt: skip
    _p.sbp_partial = _kind
