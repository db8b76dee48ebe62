"""`sbp_constraint`: the identity carrying an SBP annotation (`with_sbp` inside `shard`).

The planner (transforms/shard_plan.py) pins the annotated value to `sbp`; on one
device it is the identity. Its transpose constrains the cotangent to the dual SBP
(a partial value's cotangent is broadcast); vmap shifts split axes past the batch
axis. `tracing` is the stack of placements of the `shard` calls being traced
(innermost last), which gives the shape check its mesh and `constrain` its
placement; `shard` pushes onto it.
"""

import threading

import numpy as np
from fflow.transforms import vmap as _vmap
from fflow.transforms.autodiff import Zero, deflinear

from fflow import lax_ops as lax
from fflow.core import Primitive, ShapedArray
from fflow.sbp import B, Split, as_nd_sbp, check_sbp_fits

sbp_constraint_p = Primitive("sbp_constraint")
sbp_constraint_p.amp_class = "follow"


class _Tracing(threading.local):
    def __init__(self):
        self.stack = []  # placements of the shard calls being traced (innermost last)


tracing = _Tracing()


@sbp_constraint_p.def_impl
def _sbp_constraint_impl(x, *, sbp):
    return x


def _mesh_of(sbp):
    pl = tracing.stack[-1] if tracing.stack else None
    if pl is not None and pl.ndim == len(sbp):
        return pl.hierarchy
    return (1,) * len(sbp)


@sbp_constraint_p.def_abstract_eval
def _sbp_constraint_abstract_eval(x, *, sbp):
    check_sbp_fits(x.shape, sbp, _mesh_of(sbp), "with_sbp")
    return ShapedArray(x.shape, x.dtype, x.weak_type)


def dual(nd):
    """The SBP of a cotangent: partial becomes broadcast, split and broadcast stay."""
    return tuple(B if s.is_partial() else s for s in nd)


deflinear(
    sbp_constraint_p,
    lambda ct, x, *, sbp: [None if type(ct) is Zero else sbp_constraint_p.bind(ct, sbp=dual(sbp))],
)


def shift(nd):
    """The SBP after a batch axis is put in front (split axes move up by one)."""
    return tuple(Split(s.axis + 1) if s.is_split() else s for s in nd)


def _batch_constraint(args, dims, *, sbp):
    (x,), (d,) = args, dims
    if d != 0:
        perm = (d,) + tuple(i for i in range(x.ndim) if i != d)
        x = lax.transpose(x, perm)
    return sbp_constraint_p.bind(x, sbp=shift(sbp)), 0


_vmap.batch_rules[sbp_constraint_p] = _batch_constraint


def constrain(x, sbp):
    """`with_sbp(x, sbp)` of a traced value: the annotation inside `shard`, else `x`."""
    if not tracing.stack:
        return x
    pl = tracing.stack[-1]
    nd = as_nd_sbp(sbp, pl.ndim, "with_sbp")
    check_sbp_fits(
        np.shape(x) if not hasattr(x, "shape") else x.shape, nd, pl.hierarchy, "with_sbp"
    )
    return sbp_constraint_p.bind(x, sbp=nd)
