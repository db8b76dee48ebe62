"""Collectives over a named vmap axis: psum, pmax, pmin, all_gather, axis_index.

As in JAX, `vmap(f, axis_name="i")` names the batch axis, and inside `f`
`lax.psum(x, "i")` sums `x` over the examples of that vmap (every example sees the
total). The `BatchTrace` whose `axis_name` matches evaluates these primitives
(transforms/vmap.py `named_axis_rules`); under any other trace they are ordinary
per-example operations (their batching rules below), and with no such vmap
around they raise an "unbound axis name" error.

Params: `axis_name` is a tuple of names; all_gather also has `axis`, `tiled` and
`axis_size` (looked up when it is bound).
"""

import numpy as np
from fflow.transforms import autodiff as ad
from fflow.transforms import vmap as vm

from fflow import lax_ops as lax
from fflow.core import Primitive, ShapedArray
from fflow.errors import user_error


def _unbound(name):
    def impl(*args, axis_name, **params):
        raise user_error(
            NameError,
            f"unbound axis name {axis_name}: {name} needs an enclosing "
            f"fflow.vmap(..., axis_name=...) with that name.",
        )

    return impl


def _named(name):
    prim = Primitive(name)
    prim.traits.add("named_axis")
    prim.amp_class = "follow"
    prim.impl = _unbound(name)
    return prim


psum_p = _named("psum")
pmax_p = _named("pmax")
pmin_p = _named("pmin")
all_gather_named_p = _named("all_gather_axis")
axis_index_p = _named("axis_index")

for _p in (psum_p, pmax_p, pmin_p):
    _p.def_abstract_eval(lambda x, *, axis_name: x)


@all_gather_named_p.def_abstract_eval
def _all_gather_abstract_eval(x, *, axis_name, axis, tiled, axis_size):
    shape = list(x.shape)
    if tiled:
        shape[axis] *= axis_size
    else:
        shape.insert(axis, axis_size)
    return ShapedArray(shape, x.dtype, x.weak_type)


@axis_index_p.def_abstract_eval
def _axis_index_abstract_eval(*, axis_name):
    return ShapedArray((), np.int32)


# -- the matching vmap evaluates them over its batch dimension -------------------------
def _rest(axis_name, own):
    return tuple(n for n in axis_name if n != own)


def _psum_named(trace, vals, dims, *, axis_name):
    (x,), (d,) = vals, dims
    out = lax.mul(x, trace.axis_size) if d is None else lax.reduce_sum(x, (d,))
    rest = _rest(axis_name, trace.axis_name)
    return (psum_p.bind(out, axis_name=rest) if rest else out), None


def _pminmax_named(prim, reduce):
    def rule(trace, vals, dims, *, axis_name):
        (x,), (d,) = vals, dims
        out = x if d is None else reduce(x, (d,))
        rest = _rest(axis_name, trace.axis_name)
        return (prim.bind(out, axis_name=rest) if rest else out), None

    return rule


def _all_gather_named(trace, vals, dims, *, axis_name, axis, tiled, axis_size):
    (x,), (d,) = vals, dims
    if len(axis_name) > 1:
        raise user_error(NotImplementedError, "all_gather over several axis names at once")
    out = vm.move_bdim(x, d, axis, trace.axis_size)
    if tiled:
        shape = list(out.shape)
        merged = shape[:axis] + [shape[axis] * shape[axis + 1]] + shape[axis + 2 :]
        out = lax.reshape(out, merged)
    return out, None


def _axis_index_named(trace, vals, dims, *, axis_name):
    if len(axis_name) > 1:
        raise user_error(NotImplementedError, "axis_index of several axis names at once")
    return lax.iota(np.int32, trace.axis_size), 0


vm.named_axis_rules[psum_p] = _psum_named
vm.named_axis_rules[pmax_p] = _pminmax_named(pmax_p, lax.reduce_max)
vm.named_axis_rules[pmin_p] = _pminmax_named(pmin_p, lax.reduce_min)
vm.named_axis_rules[all_gather_named_p] = _all_gather_named
vm.named_axis_rules[axis_index_p] = _axis_index_named


# -- under a vmap of another name: per-example operations ------------------------------
def _same_dim_batch(prim):
    def rule(vals, dims, **params):
        return prim.bind(vals[0], **params), dims[0]

    return rule


def _all_gather_batch(vals, dims, *, axis_name, axis, tiled, axis_size):
    (x,), (d,) = vals, dims
    x = vm.moveaxis(x, d, 0)
    out = all_gather_named_p.bind(
        x, axis_name=axis_name, axis=axis + 1, tiled=tiled, axis_size=axis_size
    )
    return out, 0


vm.batch_rules[psum_p] = _same_dim_batch(psum_p)
vm.batch_rules[pmax_p] = _same_dim_batch(pmax_p)
vm.batch_rules[pmin_p] = _same_dim_batch(pmin_p)
vm.batch_rules[all_gather_named_p] = _all_gather_batch
vm.batch_rules[axis_index_p] = lambda vals, dims, **p: (axis_index_p.bind(**p), None)


# -- autodiff ----------------------------------------------------------------------------
# psum is linear and self-transposed: d/dx_j of the total seen by every example i
# is 1, so the cotangent of x_j is the sum of the examples' cotangents.
ad.deflinear(psum_p, lambda ct, x, *, axis_name: [psum_p.bind(ct, axis_name=axis_name)])


def _all_gather_transpose(ct, x, *, axis_name, axis, tiled, axis_size):
    # example i's input went to slot i of every example's output
    total = psum_p.bind(ct, axis_name=axis_name)
    idx = axis_index_p.bind(axis_name=axis_name)
    size = 1 if not tiled else x.aval.shape[axis]
    piece = lax.dynamic_slice_in_dim(total, lax.mul(idx, np.int32(size)), size, axis)
    return [piece if tiled else lax.squeeze(piece, (axis,))]


ad.deflinear(all_gather_named_p, _all_gather_transpose)
ad.defzero(axis_index_p)


def _pminmax_jvp(prim):
    # the tangent of the example(s) attaining the extremum, averaged over ties
    def rule(primals, tangents, *, axis_name):
        (x,), (t,) = primals, tangents
        out = prim.bind(x, axis_name=axis_name)
        hit = lax.convert_element_type(lax.eq(x, out), t.dtype)
        num = psum_p.bind(lax.mul(t, hit), axis_name=axis_name)
        return out, lax.div(num, psum_p.bind(hit, axis_name=axis_name))

    ad.jvp_rules[prim] = rule


_pminmax_jvp(pmax_p)
_pminmax_jvp(pmin_p)

__all__ = ["psum_p", "pmax_p", "pmin_p", "all_gather_named_p", "axis_index_p"]
