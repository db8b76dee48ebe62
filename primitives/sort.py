"""`sort`: sorts operands along a dimension by the first `num_keys` of them (stable)."""

import numpy as np
from fflow.transforms import vmap as vm
from fflow.transforms.autodiff import Zero, jvp_rules
from fflow.transforms.shard_rules import Sig, def_sbp
from fflow.transforms.vmap import batch_rules

from fflow import lax_ops as lax
from fflow.core import Primitive, ShapedArray
from fflow.errors import ShapeError, user_error
from fflow.sbp import S

sort_p = Primitive("sort", multiple_results=True)
sort_p.amp_class = "follow"
sort_p.traits.add("fresh_output")  # its NumPy result is a new array (lowering/schedule.py)


@sort_p.def_impl
def _sort_impl(*operands, dimension, num_keys=1):
    keys = operands[:num_keys]
    if num_keys == 1:
        perm = np.argsort(keys[0], axis=dimension, kind="stable")
    else:
        moved = [np.moveaxis(k, dimension, -1) for k in keys]
        flat = [m.reshape(-1, m.shape[-1]) for m in moved]
        rows = [np.lexsort(tuple(f[r] for f in reversed(flat))) for r in range(flat[0].shape[0])]
        perm = np.moveaxis(np.stack(rows).reshape(moved[0].shape), -1, dimension)
    return [np.take_along_axis(op, perm, axis=dimension) for op in operands]


@sort_p.def_abstract_eval
def _sort_abstract_eval(*operands, dimension, num_keys=1):
    first = operands[0]
    for op in operands[1:]:
        if op.shape != first.shape:
            raise user_error(ShapeError, "sort: all operands need one shape")
    if not 0 <= dimension < max(first.ndim, 1):
        raise user_error(ShapeError, f"sort: dimension {dimension} out of range")
    return [ShapedArray(op.shape, op.dtype, op.weak_type) for op in operands]


def _sort_jvp(primals, tangents, *, dimension, num_keys=1):
    shape = np.shape(primals[0])
    iota = lax.broadcasted_iota(np.int32, shape, dimension)
    *outs, perm = lax.sort([*primals, iota], dimension=dimension, num_keys=num_keys)
    t_outs = []
    for t in tangents:
        if type(t) is Zero:
            t_outs.append(t)
        else:
            t_outs.append(lax.take_along_axis(t, perm, dimension))
    return outs, t_outs


jvp_rules[sort_p] = _sort_jvp


# -- batching rule (vmap) ---------------------------------------------------------------
def _sort_batch(vals, dims, *, dimension, num_keys=1):

    moved, _ = vm.all_to_front(vals, dims)
    outs = sort_p.bind(*moved, dimension=dimension + 1, num_keys=num_keys)
    return outs, [0] * len(outs)


def _register_sort_batch_rule():

    batch_rules[sort_p] = _sort_batch


_register_sort_batch_rule()


# ----------------------------------------------------------------------------
# SBP signatures (transforms/shard_rules.py): one mesh axis; S = split, B = broadcast,
# P = partial sum. A `local` kernel gets the device's boxes (e.g. a shard's offset).


def _sort_sbp(in_avals, out_avals, *, dimension, num_keys=1):
    n = len(in_avals)
    return [Sig((S(k),) * n, (S(k),) * n) for k in range(in_avals[0].ndim) if k != dimension]


def_sbp(sort_p, _sort_sbp)
