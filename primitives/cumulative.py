"""Cumulative ops along one axis: cumsum, cumprod, cummax, cummin.

cumsum is linear. The others differentiate through an associative scan written
with slices and elementwise ops (log2(n) steps), so their JVPs are exact even with
zeros and ties.
"""

import numpy as np
from fflow.transforms.autodiff import deflinear, jvp_flat, jvp_rules

from fflow import lax_ops as lax
from fflow.core import Primitive, ShapedArray
from fflow.errors import ShapeError, user_error


def _cumulative(name, np_fn, amp="follow"):
    prim = Primitive(name)
    prim.traits.add("cumulative")
    prim.amp_class = amp

    def impl(x, *, axis, reverse=False):
        if reverse:
            x = np.flip(x, axis)
        acc = x
        if amp == "fp32" and x.dtype.itemsize < 4 and x.dtype.kind in "fV":
            # NumPy accumulates f16/bf16 running sums in 16 bits: accumulate in f32
            acc = x.astype(np.float32)
        out = np.asarray(np_fn(acc, axis=axis), dtype=x.dtype)
        return np.flip(out, axis) if reverse else out

    def abstract_eval(x, *, axis, reverse=False):
        if not 0 <= axis < x.ndim:
            raise user_error(ShapeError, f"{name}: axis {axis} out of range for rank {x.ndim}")
        return ShapedArray(x.shape, x.dtype, x.weak_type)

    prim.impl = impl
    prim.abstract_eval = abstract_eval
    return prim


cumsum_p = _cumulative("cumsum", np.cumsum, amp="fp32")
deflinear(
    cumsum_p,
    lambda ct, x, *, axis, reverse=False: [lax.cumsum(ct, axis, reverse=not reverse)],
)

cumprod_p = _cumulative("cumprod", np.cumprod, amp="fp32")
cummax_p = _cumulative("cummax", np.maximum.accumulate)
cummin_p = _cumulative("cummin", np.minimum.accumulate)


def associative_scan(op, x, axis, reverse=False):
    """Inclusive scan of a binary `op` along `axis` (Hillis-Steele, log2(n) steps)."""
    if reverse:
        x = lax.rev(x, (axis,))
    n = x.shape[axis]
    shift = 1
    while shift < n:
        head = lax.slice_in_dim(x, 0, shift, axis=axis)
        combined = op(
            lax.slice_in_dim(x, 0, n - shift, axis=axis), lax.slice_in_dim(x, shift, n, axis=axis)
        )
        x = lax.concatenate([head, combined], axis)
        shift *= 2
    return lax.rev(x, (axis,)) if reverse else x


def _scan_jvp(prim, op):
    def rule(primals, tangents, *, axis, reverse=False):
        outs, touts = jvp_flat(
            lambda v: [associative_scan(op, v, axis, reverse)], list(primals), list(tangents)
        )
        return prim.bind(primals[0], axis=axis, reverse=reverse), touts[0]

    jvp_rules[prim] = rule


_scan_jvp(cumprod_p, lax.mul)
_scan_jvp(cummax_p, lax.max)
_scan_jvp(cummin_p, lax.min)

# the partial values each scan passes through (transforms/shard_rules.py)
cumsum_p.sbp_partial, cummax_p.sbp_partial, cummin_p.sbp_partial = "sum", "max", "min"
