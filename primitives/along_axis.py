"""Indexing along one axis: take_along_axis and its transpose, scatter_add_along_axis.

take_along_axis(x, indices, axis) is NumPy's `np.take_along_axis`: `indices` has x's
shape except along `axis`, and out[..., j, ...] = x[..., indices[..., j, ...], ...].
Every other dimension is a *batch* dimension shared by x, indices and the result (JAX
expresses this as a gather with operand_batching_dims), so under `shard` a split of
any of them stays a split with no communication: a cross-entropy's
`take_along_axis(logp[b, t, V], targets[b, t, 1], -1)` keeps the batch split. A full
gather over every axis (iota indices for the batch dims) cannot: its index array
mixes all dims into one.

scatter_add_along_axis(x, indices, updates, axis) adds `updates` (shaped like
`indices`) into a copy of x at those positions along `axis`, repeated indices
accumulating. Both clamp out-of-range indices into [0, n) (gather's default), so each
is exactly the other's transpose.
"""

import numpy as np
from fflow.transforms import vmap as vm
from fflow.transforms.autodiff import Zero, instantiate, is_undefined, jvp_rules, transpose_rules
from fflow.transforms.shard_rules import Sig, def_sbp
from fflow.transforms.vmap import batch_rules

from fflow import lax_ops as lax
from fflow.core import Primitive, ShapedArray
from fflow.errors import ShapeError, user_error
from fflow.sbp import B, P, S


def _prim(name):
    prim = Primitive(name)
    prim.traits.add("indexing")
    prim.traits.add("fresh_output")  # its NumPy result is a new array (lowering/schedule.py)
    prim.amp_class = "follow"
    return prim


def _clipped(indices, n):
    return np.clip(indices, 0, max(n - 1, 0))


def _check(name, x, indices, axis):
    if indices.dtype.kind not in "iu":
        raise user_error(ShapeError, f"{name}: indices must be integers, got {indices.dtype}")
    if not 0 <= axis < x.ndim:
        raise user_error(ShapeError, f"{name}: axis {axis} out of range for {x.ndim} dims")
    same = indices.ndim == x.ndim and all(
        a == b for d, (a, b) in enumerate(zip(x.shape, indices.shape)) if d != axis
    )
    if not same:
        raise user_error(
            ShapeError,
            f"{name}: indices {indices.shape} must have the shape of the operand {x.shape} "
            f"except along axis {axis} (broadcast them first, as jnp.take_along_axis does)",
        )


# -- take_along_axis ------------------------------------------------------------------
take_along_axis_p = _prim("take_along_axis")


@take_along_axis_p.def_impl
def _take_along_axis_impl(x, indices, *, axis):
    if x.shape[axis] == 0:
        return np.zeros(indices.shape, x.dtype)
    return np.take_along_axis(x, _clipped(indices, x.shape[axis]), axis)


@take_along_axis_p.def_abstract_eval
def _take_along_axis_abstract_eval(x, indices, *, axis):
    _check("take_along_axis", x, indices, axis)
    return ShapedArray(indices.shape, x.dtype, x.weak_type)


def _take(x, indices, axis):
    return take_along_axis_p.bind(x, indices, axis=axis)


def _scatter_add(x, indices, updates, axis):
    return scatter_add_along_axis_p.bind(x, indices, updates, axis=axis)


def _take_along_axis_jvp(primals, tangents, *, axis):
    x, indices = primals
    out = _take(x, indices, axis)
    x_dot = tangents[0]
    if type(x_dot) is Zero:
        return out, Zero(ShapedArray(np.shape(indices), x_dot.aval.dtype))
    return out, _take(x_dot, indices, axis)


def _take_along_axis_transpose(ct, x, indices, *, axis):
    if type(ct) is Zero:
        return [None, None]
    zeros = lax.full(x.aval.shape, 0, x.aval.dtype)
    return [_scatter_add(zeros, indices, ct, axis), None]


jvp_rules[take_along_axis_p] = _take_along_axis_jvp
transpose_rules[take_along_axis_p] = _take_along_axis_transpose
take_along_axis_p.traits.add("linear_in_first")


# -- scatter_add_along_axis -----------------------------------------------------------
scatter_add_along_axis_p = _prim("scatter_add_along_axis")


def add_along_axis_into(out, indices, updates, axis):
    """Add `updates` into the NumPy array `out` in place at `indices` (clamped) along
    `axis` and return it; also the NumPy backend's in-place form."""
    n = out.shape[axis]
    if n == 0 or updates.size == 0:
        return out
    idx = _clipped(indices, n)
    if indices.shape[axis] == 1:
        # one update per line: no repeated index, so a read-add-write is exact
        np.put_along_axis(out, idx, np.take_along_axis(out, idx, axis) + updates, axis)
        return out
    where = tuple(
        idx if d == axis else np.arange(s).reshape([-1 if k == d else 1 for k in range(idx.ndim)])
        for d, s in enumerate(idx.shape)
    )
    np.add.at(out, where, updates)
    return out


@scatter_add_along_axis_p.def_impl
def _scatter_add_along_axis_impl(x, indices, updates, *, axis):
    return add_along_axis_into(np.array(x), indices, updates, axis)


@scatter_add_along_axis_p.def_abstract_eval
def _scatter_add_along_axis_abstract_eval(x, indices, updates, *, axis):
    _check("scatter_add_along_axis", x, indices, axis)
    if updates.shape != indices.shape or updates.dtype != x.dtype:
        raise user_error(
            ShapeError,
            f"scatter_add_along_axis: updates {updates.shape} ({updates.dtype.name}) must "
            f"have the indices' shape {indices.shape} and the operand's dtype {x.dtype.name}",
        )
    return ShapedArray(x.shape, x.dtype, x.weak_type)


def _scatter_add_along_axis_jvp(primals, tangents, *, axis):
    x, indices, updates = primals
    x_dot, _, u_dot = tangents
    out = _scatter_add(x, indices, updates, axis)
    if type(x_dot) is Zero and type(u_dot) is Zero:
        return out, x_dot
    return out, _scatter_add(instantiate(x_dot), indices, instantiate(u_dot), axis)


def _scatter_add_along_axis_transpose(ct, x, indices, updates, *, axis):
    if type(ct) is Zero:
        return [None, None, None]
    ct_x = ct if is_undefined(x) else None
    ct_u = _take(ct, indices, axis) if is_undefined(updates) else None
    return [ct_x, None, ct_u]


jvp_rules[scatter_add_along_axis_p] = _scatter_add_along_axis_jvp
transpose_rules[scatter_add_along_axis_p] = _scatter_add_along_axis_transpose
scatter_add_along_axis_p.traits.add("linear_in_operand_and_updates")


# -- batching rules (vmap) --------------------------------------------------------------
def _take_along_axis_batch(vals, dims, *, axis):
    (x, indices), (dx, di) = vals, dims
    size = vm.batch_size(vals, dims)
    if dx is vm.not_mapped:
        # one operand for every lane: fold the lanes into the indexed axis of the
        # indices (no copy of x per lane), then split them out of the result again
        ishape = indices.shape
        moved = vm.moveaxis(indices, di, axis)
        rest = ishape[:di] + ishape[di + 1 :]
        folded = lax.reshape(moved, rest[:axis] + (size * rest[axis],) + rest[axis + 1 :])
        out = _take(x, folded, axis)
        return lax.reshape(out, rest[:axis] + (size,) + rest[axis:]), axis
    x = vm.bdim_to_front(x, dx, size)
    indices = vm.bdim_to_front(indices, di, size)
    return _take(x, indices, axis + 1), 0


def _scatter_add_along_axis_batch(vals, dims, *, axis):
    (x, indices, updates), size = vm.all_to_front(vals, dims)
    return _scatter_add(x, indices, updates, axis + 1), 0


batch_rules[take_along_axis_p] = _take_along_axis_batch
batch_rules[scatter_add_along_axis_p] = _scatter_add_along_axis_batch


# -- SBP signatures (transforms/shard_rules.py): one mesh axis --------------------------
def _shard_offsets(ctx, indices):
    """(indices shifted into this device's shard of the operand along `axis`, a mask of
    those that fall inside it): the operand is split along the indexed axis."""
    axis = ctx.params["axis"]
    n = ctx.in_avals[0].shape[axis]
    lo, hi = ctx.in_boxes[0][axis]
    if np.dtype(indices.dtype).kind == "u":  # shifting needs signed indices
        top = lax.full(np.shape(indices), n - 1, indices.dtype)
        indices = lax.convert_element_type(lax.min(indices, top), np.int32)
    dt = indices.dtype
    shape = np.shape(indices)
    clamped = lax.clamp(lax.full(shape, 0, dt), indices, lax.full(shape, n - 1, dt))
    shifted = lax.sub(clamped, lax.full(shape, lo, dt))
    inside = lax.bitwise_and(
        lax.ge(shifted, lax.full(shape, 0, dt)), lax.lt(shifted, lax.full(shape, hi - lo, dt))
    )
    return shifted, inside


def _take_along_axis_local(ctx, x, indices):
    # look up the indices that fall in this shard, zero elsewhere: the shards sum to
    # the result
    shifted, inside = _shard_offsets(ctx, indices)
    got = _take(x, shifted, ctx.params["axis"])
    return lax.select_n(inside, lax.full(got.shape, 0, got.dtype), got)


def _scatter_add_along_axis_local(ctx, x, indices, updates):
    # add only the updates that land in this shard (the others add zero at a clamped
    # position)
    shifted, inside = _shard_offsets(ctx, indices)
    kept = lax.select_n(inside, lax.full(np.shape(updates), 0, updates.dtype), updates)
    return _scatter_add(x, shifted, kept, ctx.params["axis"])


def _take_along_axis_sbp(in_avals, out_avals, *, axis):
    ndim = in_avals[0].ndim
    sigs = [Sig((S(d), S(d)), (S(d),)) for d in range(ndim) if d != axis]
    sigs.append(Sig((B, S(axis)), (S(axis),)))
    sigs.append(Sig((S(axis), B), (P,), _take_along_axis_local))
    sigs.append(Sig((P, B), (P,)))
    return sigs


def _scatter_add_along_axis_sbp(in_avals, out_avals, *, axis):
    ndim = in_avals[0].ndim
    sigs = [Sig((S(d), S(d), S(d)), (S(d),)) for d in range(ndim) if d != axis]
    sigs.append(Sig((S(axis), B, B), (S(axis),), _scatter_add_along_axis_local))
    sigs.append(Sig((P, B, P), (P,)))
    sigs.append(Sig((P, S(axis), S(axis)), (P,)))
    return sigs


def_sbp(take_along_axis_p, _take_along_axis_sbp)
def_sbp(scatter_add_along_axis_p, _scatter_add_along_axis_sbp)
