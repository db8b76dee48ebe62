"""Indexing primitives: dynamic_slice, dynamic_update_slice, gather and the scatter family.

gather(x, indices, axes): `indices` has shape batch + (len(axes),); the result is
batch + x's remaining dims. Out-of-bounds gather indices are clamped; out-of-bounds
scatter updates are dropped (JAX's defaults).
"""

import numpy as np
from fflow.transforms import vmap as vm
from fflow.transforms.autodiff import (
    Zero,
    instantiate,
    is_undefined,
    jvp_rules,
    transpose_rules,
)
from fflow.transforms.shard_rules import Sig, def_sbp
from fflow.transforms.vmap import batch_rules

from fflow import lax_ops as lax
from fflow.core import Primitive, ShapedArray
from fflow.errors import ShapeError, user_error
from fflow.sbp import B, P, S


def _prim(name):
    prim = Primitive(name)
    prim.traits.add("indexing")
    prim.amp_class = "follow"
    return prim


def _clamp_starts(shape, sizes, starts):
    return [int(min(max(int(s), 0), d - n)) for d, n, s in zip(shape, sizes, starts)]


# -- dynamic_slice -------------------------------------------------------------
dynamic_slice_p = _prim("dynamic_slice")
dynamic_slice_p.traits.add("view")  # a basic slice of the input


@dynamic_slice_p.def_impl
def _dynamic_slice_impl(x, *starts, slice_sizes):
    starts = _clamp_starts(x.shape, slice_sizes, starts)
    return x[tuple(slice(s, s + n) for s, n in zip(starts, slice_sizes))]


@dynamic_slice_p.def_abstract_eval
def _dynamic_slice_abstract_eval(x, *starts, slice_sizes):
    if len(starts) != x.ndim or len(slice_sizes) != x.ndim:
        raise user_error(ShapeError, f"dynamic_slice needs {x.ndim} start indices and sizes")
    for d, n in zip(x.shape, slice_sizes):
        if not 0 <= n <= d:
            raise user_error(ShapeError, f"dynamic_slice size {n} exceeds dimension {d}")
    for s in starts:
        if s.shape != () or s.dtype.kind not in "iu":
            raise user_error(ShapeError, "dynamic_slice start indices must be integer scalars")
    return ShapedArray(slice_sizes, x.dtype, x.weak_type)


# Rules bind the primitives directly: their starts are already normalised (the
# lax wrappers' negative-index wrap must not apply twice).
def _ds(x, starts, slice_sizes):
    return dynamic_slice_p.bind(x, *starts, slice_sizes=tuple(slice_sizes))


def _dus(x, update, starts):
    return dynamic_update_slice_p.bind(x, update, *starts)


def _dynamic_slice_jvp(primals, tangents, *, slice_sizes):
    x, *starts = primals
    out = _ds(x, starts, slice_sizes)
    if type(tangents[0]) is Zero:
        return out, Zero(tangents[0].aval.update(shape=slice_sizes))
    return out, _ds(tangents[0], starts, slice_sizes)


def _dynamic_slice_transpose(ct, x, *starts, slice_sizes):
    zeros = lax.full(x.aval.shape, 0, x.aval.dtype)
    return [_dus(zeros, instantiate(ct), starts)] + [None] * len(starts)


jvp_rules[dynamic_slice_p] = _dynamic_slice_jvp
transpose_rules[dynamic_slice_p] = _dynamic_slice_transpose
dynamic_slice_p.traits.add("linear_in_first")

# -- dynamic_update_slice ---------------------------------------------------------
dynamic_update_slice_p = _prim("dynamic_update_slice")


@dynamic_update_slice_p.def_impl
def _dus_impl(x, update, *starts):
    starts = _clamp_starts(x.shape, update.shape, starts)
    out = np.array(x)
    out[tuple(slice(s, s + n) for s, n in zip(starts, update.shape))] = update
    return out


@dynamic_update_slice_p.def_abstract_eval
def _dus_abstract_eval(x, update, *starts):
    if update.ndim != x.ndim or any(u > d for u, d in zip(update.shape, x.shape)):
        raise user_error(
            ShapeError, f"dynamic_update_slice: update {update.shape} does not fit in {x.shape}"
        )
    if update.dtype != x.dtype:
        raise user_error(ShapeError, "dynamic_update_slice: update dtype differs from operand")
    if len(starts) != x.ndim:
        raise user_error(ShapeError, f"dynamic_update_slice needs {x.ndim} start indices")
    return ShapedArray(x.shape, x.dtype, x.weak_type)


def _dus_jvp(primals, tangents):
    x, update, *starts = primals
    tx, tu = tangents[0], tangents[1]
    out = _dus(x, update, starts)
    if type(tx) is Zero and type(tu) is Zero:
        return out, tx
    return out, _dus(instantiate(tx), instantiate(tu), starts)


def _dus_transpose(ct, x, update, *starts):
    if type(ct) is Zero:
        return [None] * (2 + len(starts))
    u_aval = update.aval if is_undefined(update) else ShapedArray(np.shape(update), ct.dtype)
    ct_x = None
    if is_undefined(x):
        ct_x = _dus(ct, lax.full(u_aval.shape, 0, ct.dtype), starts)
    ct_u = _ds(ct, starts, u_aval.shape) if is_undefined(update) else None
    return [ct_x, ct_u] + [None] * len(starts)


jvp_rules[dynamic_update_slice_p] = _dus_jvp
transpose_rules[dynamic_update_slice_p] = _dus_transpose
dynamic_update_slice_p.traits.add("linear_in_first_two")
dynamic_update_slice_p.traits.add(
    "fresh_output"
)  # its NumPy result is a new array (lowering/schedule.py)


# -- gather ------------------------------------------------------------------------
def _index_tuple(indices, x_shape, axes, clamp):
    idx = []
    for k, a in enumerate(axes):
        i = indices[..., k]
        if clamp:
            i = np.clip(i, 0, x_shape[a] - 1)
        idx.append(i)
    return tuple(idx)


def _gather_shape(x, indices, axes):
    rest = [d for i, d in enumerate(x.shape) if i not in axes]
    return tuple(indices.shape[:-1]) + tuple(rest)


gather_p = _prim("gather")


@gather_p.def_impl
def _gather_impl(x, indices, *, axes):
    moved = np.moveaxis(x, axes, range(len(axes))) if axes != tuple(range(len(axes))) else x
    return moved[_index_tuple(indices, x.shape, axes, clamp=True)]


def _check_gather(name, x, indices, axes):
    if indices.ndim < 1 or indices.shape[-1] != len(axes):
        raise user_error(
            ShapeError,
            f"{name}: indices need a last dimension of size {len(axes)}, got {indices.shape}",
        )
    if indices.dtype.kind not in "iu":
        raise user_error(ShapeError, f"{name}: indices must be integers, got {indices.dtype}")
    if sorted(set(axes)) != list(axes) or any(not 0 <= a < x.ndim for a in axes):
        raise user_error(ShapeError, f"{name}: axes {axes} must be increasing and in range")


@gather_p.def_abstract_eval
def _gather_abstract_eval(x, indices, *, axes):
    _check_gather("gather", x, indices, axes)
    return ShapedArray(_gather_shape(x, indices, axes), x.dtype, x.weak_type)


def _gather_jvp(primals, tangents, *, axes):
    x, indices = primals
    out = lax.gather(x, indices, axes)
    if type(tangents[0]) is Zero:
        return out, Zero(ShapedArray(np.shape(out), tangents[0].aval.dtype))
    return out, lax.gather(tangents[0], indices, axes)


def _gather_transpose(ct, x, indices, *, axes):
    # gather clamps out-of-bounds indices while scatter_add drops them: clamp first
    zeros = lax.full(x.aval.shape, 0, x.aval.dtype)
    clamped = _clamp_indices(indices, x.aval.shape, axes)
    return [lax.scatter_add(zeros, clamped, instantiate(ct), axes), None]


def _clamp_indices(indices, x_shape, axes):
    ishape = np.shape(indices)
    dtype = indices.dtype
    upper = lax.broadcast_in_dim(
        np.asarray([x_shape[a] - 1 for a in axes], dtype), ishape, (len(ishape) - 1,)
    )
    return lax.min(lax.max(indices, lax.full(ishape, 0, dtype)), upper)


def _update_mask(indices, x_shape, axes, updates_shape):
    """True for each update element that lands in x (in bounds), shaped like updates."""
    ishape = np.shape(indices)
    clamped = _clamp_indices(indices, x_shape, axes)
    inb = lax.reduce_and(lax.eq(clamped, indices), (len(ishape) - 1,))
    return lax.broadcast_in_dim(inb, updates_shape, tuple(range(len(ishape) - 1)))


def _update_mask_values(indices, x_shape, axes, updates_shape, dtype):
    return lax.convert_element_type(_update_mask(indices, x_shape, axes, updates_shape), dtype)


def _scatter_winners(indices, x_shape, axes, updates_shape):
    """True for each update element that `scatter` keeps (the last writer of its slot)."""
    n_batch = len(np.shape(indices)) - 1
    batch = tuple(np.shape(indices)[:-1])
    ids = lax.reshape(lax.iota(np.int32, int(np.prod(batch, dtype=np.int64))), batch)
    ids = lax.broadcast_in_dim(ids, updates_shape, tuple(range(n_batch)))
    slots = lax.scatter(lax.full(x_shape, -1, np.int32), indices, ids, axes)
    return lax.eq(lax.gather(slots, indices, axes), ids)


jvp_rules[gather_p] = _gather_jvp
transpose_rules[gather_p] = _gather_transpose
gather_p.traits.add("linear_in_first")
gather_p.traits.add("fresh_output")  # its NumPy result is a new array (lowering/schedule.py)


# -- scatter family -----------------------------------------------------------------
def scatter_into(ufunc, out, indices, updates, axes):
    """Scatter `updates` into the NumPy array `out` in place and return it: `ufunc.at`, or
    plain assignment when `ufunc` is None; out-of-bounds updates are dropped. Also the
    NumPy backend's in-place scatter."""
    moved = np.moveaxis(out, axes, range(len(axes))) if axes != tuple(range(len(axes))) else out
    idx = _index_tuple(indices, out.shape, axes, clamp=False)
    inb = np.ones(indices.shape[:-1], dtype=bool)
    for k, a in enumerate(axes):
        inb &= (idx[k] >= 0) & (idx[k] < out.shape[a])
    if not inb.all():
        idx = tuple(i[inb] for i in idx)
        updates = updates[inb]
    if ufunc is None:
        moved[idx] = updates
    else:
        ufunc.at(moved, idx, updates)
    return out


def _scatter_impl_for(ufunc):
    def impl(x, indices, updates, *, axes):
        return scatter_into(ufunc, np.array(x), indices, updates, axes)

    return impl


def _scatter_prim(name, ufunc):
    prim = _prim(name)
    prim.impl = _scatter_impl_for(ufunc)
    prim.traits.add("fresh_output")  # its NumPy result is a new array (lowering/schedule.py)
    prim.scatter_ufunc = ufunc  # how updates combine (None: replace): CPU's in-place form

    def abstract_eval(x, indices, updates, *, axes):
        _check_gather(name, x, indices, axes)
        expected = _gather_shape(x, indices, axes)
        if updates.shape != expected or updates.dtype != x.dtype:
            raise user_error(
                ShapeError,
                f"{name}: updates of shape {updates.shape} ({updates.dtype.name}) do not match "
                f"the indexed shape {expected} ({x.dtype.name})",
            )
        return ShapedArray(x.shape, x.dtype, x.weak_type)

    prim.abstract_eval = abstract_eval
    return prim


scatter_add_p = _scatter_prim("scatter_add", np.add)


def _linear_scatter_jvp(prim):
    """JVP of a scatter that is linear in operand and updates together (scatter, scatter_add):
    the same scatter of the tangents."""

    def jvp(primals, tangents, *, axes):
        x, indices, updates = primals
        tx, _, tu = tangents
        out = prim.bind(x, indices, updates, axes=axes)
        if type(tx) is Zero and type(tu) is Zero:
            return out, tx
        return out, prim.bind(instantiate(tx), indices, instantiate(tu), axes=axes)

    return jvp


_scatter_add_jvp = _linear_scatter_jvp(scatter_add_p)


def _scatter_add_transpose(ct, x, indices, updates, *, axes):
    if type(ct) is Zero:
        return [None, None, None]
    ct_x = ct if is_undefined(x) else None
    ct_u = None
    if is_undefined(updates):
        # updates dropped as out of bounds get no cotangent (gather would clamp)
        ct_u = lax.gather(ct, indices, axes)
        inb = _update_mask(indices, np.shape(ct), axes, updates.aval.shape)
        ct_u = lax.select_n(inb, lax.full_like(ct_u, 0), ct_u)
    return [ct_x, None, ct_u]


jvp_rules[scatter_add_p] = _scatter_add_jvp
transpose_rules[scatter_add_p] = _scatter_add_transpose
scatter_add_p.traits.add("linear_in_operand_and_updates")

scatter_p = _scatter_prim("scatter", None)


_scatter_jvp = _linear_scatter_jvp(scatter_p)


def _scatter_transpose(ct, x, indices, updates, *, axes):
    # With repeated indices only the last writer of a slot reaches the output (as in
    # the NumPy implementation), so only it receives the cotangent.
    if type(ct) is Zero:
        return [None, None, None]
    x_shape = np.shape(ct)
    u_shape = _gather_shape(
        ShapedArray(x_shape, ct.dtype), ShapedArray(np.shape(indices), np.int32), axes
    )
    ct_x = None
    if is_undefined(x):
        ct_x = lax.scatter(ct, indices, lax.full(u_shape, 0, ct.dtype), axes)
    ct_u = None
    if is_undefined(updates):
        won = _scatter_winners(indices, x_shape, axes, u_shape)
        ct_u = lax.select_n(won, lax.full(u_shape, 0, ct.dtype), lax.gather(ct, indices, axes))
    return [ct_x, None, ct_u]


jvp_rules[scatter_p] = _scatter_jvp
transpose_rules[scatter_p] = _scatter_transpose
scatter_p.traits.add("linear_in_operand_and_updates")

scatter_mul_p = _scatter_prim("scatter_mul", np.multiply)
scatter_min_p = _scatter_prim("scatter_min", np.minimum)
scatter_max_p = _scatter_prim("scatter_max", np.maximum)


def _scatter_mul_jvp(primals, tangents, *, axes):
    # out = x * P with P = scatter_mul(1, idx, u), so d out = t_x P + x dP and
    # dP = sum_k t_k prod_{j != k} u_j over the updates k of a slot. The product of
    # the others is P / u_k, or (for a zero u_k) the product of the nonzero updates
    # when u_k is the slot's only zero: exact with repeated indices and zeros.
    x, indices, updates = primals
    tx, _, tu = tangents
    x_shape, u_shape = np.shape(x), np.shape(updates)
    ones = lax.full(x_shape, 1, x.dtype)
    p = lax.scatter_mul(ones, indices, updates, axes)
    out = lax.mul(x, p)
    t = None
    if type(tx) is not Zero:
        t = lax.mul(tx, p)
    if type(tu) is not Zero:
        zero_u = lax.eq(updates, lax.full(u_shape, 0, x.dtype))
        safe_u = lax.select_n(zero_u, updates, lax.full(u_shape, 1, x.dtype))
        p_nonzero = lax.scatter_mul(ones, indices, safe_u, axes)
        n_zeros = lax.scatter_add(
            lax.full(x_shape, 0, x.dtype), indices, lax.convert_element_type(zero_u, x.dtype), axes
        )
        g_p, g_pnz = lax.gather(p, indices, axes), lax.gather(p_nonzero, indices, axes)
        only_zero = lax.eq(lax.gather(n_zeros, indices, axes), lax.full(u_shape, 1, x.dtype))
        for_zero = lax.select_n(only_zero, lax.full(u_shape, 0, x.dtype), g_pnz)
        others = lax.select_n(zero_u, lax.div(g_p, safe_u), for_zero)
        dp = lax.scatter_add(lax.full(x_shape, 0, x.dtype), indices, lax.mul(tu, others), axes)
        tu_part = lax.mul(x, dp)
        t = tu_part if t is None else lax.add(t, tu_part)
    return out, t


def _scatter_minmax_jvp(prim):
    # the tangent comes from whichever of operand/update attains the result
    def rule(primals, tangents, *, axes):
        x, indices, updates = primals
        tx, _, tu = tangents
        # ties share the tangent evenly (as reduce_max does)
        out = prim.bind(x, indices, updates, axes=axes)
        x_shape, u_shape = np.shape(x), np.shape(updates)
        from_x = lax.convert_element_type(lax.eq(out, x), x.dtype)
        from_u = lax.eq(lax.gather(out, indices, axes), updates)
        from_u = lax.mul(
            lax.convert_element_type(from_u, x.dtype),
            _update_mask_values(indices, x_shape, axes, u_shape, x.dtype),
        )
        count = lax.add(
            from_x, lax.scatter_add(lax.full(x_shape, 0, x.dtype), indices, from_u, axes)
        )
        t = lax.mul(instantiate(tx), from_x)
        if type(tu) is not Zero:
            t_u = lax.scatter_add(lax.full(x_shape, 0, x.dtype), indices, lax.mul(tu, from_u), axes)
            t = lax.add(t, t_u)
        return out, lax.div(t, count)

    return rule


jvp_rules[scatter_mul_p] = _scatter_mul_jvp
jvp_rules[scatter_min_p] = _scatter_minmax_jvp(scatter_min_p)
jvp_rules[scatter_max_p] = _scatter_minmax_jvp(scatter_max_p)


# -- batching rules (vmap) ------------------------------------------------------------
def _window_indices(x_shape, starts, sizes, lead):
    """Indices (lead..., *sizes, len(x_shape)) of the window at clamped `starts`.

    `starts` are scalars or (lead...)-shaped batched arrays; the start is clamped so
    the window fits, as dynamic_slice / dynamic_update_slice do.
    """
    parts = []
    nl = len(lead)
    for k, (d, n, s) in enumerate(zip(x_shape, sizes, starts)):
        s = lax.convert_element_type(s, np.int32)
        s = lax.clamp(0, s, d - n)
        full = tuple(lead) + tuple(sizes)
        s_b = lax.broadcast_in_dim(s, full, tuple(range(len(s.shape))))
        ramp = lax.broadcasted_iota(np.int32, full, nl + k)
        parts.append(lax.reshape(lax.add(s_b, ramp), full + (1,)))
    return lax.concatenate(parts, len(lead) + len(sizes))


def _dynamic_slice_batch(vals, dims, *, slice_sizes):

    x, *starts = vals
    dx, *dstarts = dims
    size = vm.batch_size(vals, dims)
    if all(d is vm.not_mapped for d in dstarts):
        x = vm.moveaxis(x, dx, 0)
        zero = np.asarray(0, np.int32)
        starts = [zero] + [lax.convert_element_type(s, np.int32) for s in starts]
        return dynamic_slice_p.bind(x, *starts, slice_sizes=(size,) + tuple(slice_sizes)), 0
    # batched starts: gather every element of each lane's window
    starts = [vm.bdim_to_front(s, d, size) for s, d in zip(starts, dstarts)]
    if dx is vm.not_mapped:
        # one operand for all lanes: no need to copy it per lane
        idx = _window_indices(x.shape, starts, slice_sizes, (size,))
        return lax.gather(x, idx, tuple(range(x.ndim))), 0
    x = vm.moveaxis(x, dx, 0)
    idx = _window_indices(x.shape[1:], starts, slice_sizes, (size,))
    lane = lax.broadcasted_iota(np.int32, idx.shape[:-1] + (1,), 0)
    idx = lax.concatenate([lane, idx], idx.ndim - 1)
    return lax.gather(x, idx, tuple(range(x.ndim))), 0


def _dus_batch(vals, dims):

    x, update, *starts = vals
    dx, du, *dstarts = dims
    size = vm.batch_size(vals, dims)
    x = vm.bdim_to_front(x, dx, size)
    update = vm.bdim_to_front(update, du, size)
    if all(d is vm.not_mapped for d in dstarts):
        zero = np.asarray(0, np.int32)
        starts = [zero] + [lax.convert_element_type(s, np.int32) for s in starts]
        return dynamic_update_slice_p.bind(x, update, *starts), 0
    starts = [vm.bdim_to_front(s, d, size) for s, d in zip(starts, dstarts)]
    idx = _window_indices(x.shape[1:], starts, update.shape[1:], (size,))
    lane = lax.broadcasted_iota(np.int32, idx.shape[:-1] + (1,), 0)
    idx = lax.concatenate([lane, idx], idx.ndim - 1)
    return lax.scatter(x, idx, update, tuple(range(x.ndim))), 0


def _gather_batch(vals, dims, *, axes):

    (x, indices), (dx, di) = vals, dims
    if di is vm.not_mapped:
        # the batch dim becomes one of x's kept dims: put it first among them
        x = vm.moveaxis(x, dx, 0)
        out = lax.gather(x, indices, tuple(a + 1 for a in axes))
        return out, indices.ndim - 1
    if dx is vm.not_mapped:
        indices = vm.moveaxis(indices, di, 0)
        return lax.gather(x, indices, axes), 0
    x = vm.moveaxis(x, dx, 0)
    indices = vm.moveaxis(indices, di, 0)
    lane = lax.broadcasted_iota(indices.dtype, indices.shape[:-1] + (1,), 0)
    indices = lax.concatenate([lane, indices], indices.ndim - 1)
    return lax.gather(x, indices, (0,) + tuple(a + 1 for a in axes)), 0


def _scatter_batch_for(prim):
    def rule(vals, dims, *, axes):

        (x, indices, updates), (dx, di, du) = vals, dims
        size = vm.batch_size(vals, dims)
        if di is vm.not_mapped:
            # the batch dim is a kept dim of x (first) and of the updates (after the
            # index batch dims)
            x = vm.bdim_to_front(x, dx, size)
            nb = indices.ndim - 1
            updates = vm.move_bdim(updates, du, nb, size)
            return prim.bind(x, indices, updates, axes=tuple(a + 1 for a in axes)), 0
        x = vm.bdim_to_front(x, dx, size)
        indices = vm.bdim_to_front(indices, di, size)
        updates = vm.bdim_to_front(updates, du, size)
        lane = lax.broadcasted_iota(indices.dtype, indices.shape[:-1] + (1,), 0)
        indices = lax.concatenate([lane, indices], indices.ndim - 1)
        return prim.bind(x, indices, updates, axes=(0,) + tuple(a + 1 for a in axes)), 0

    return rule


def _register_indexing_batch_rules():

    batch_rules[dynamic_slice_p] = _dynamic_slice_batch
    batch_rules[dynamic_update_slice_p] = _dus_batch
    batch_rules[gather_p] = _gather_batch
    for prim in (scatter_add_p, scatter_p, scatter_mul_p, scatter_min_p, scatter_max_p):
        batch_rules[prim] = _scatter_batch_for(prim)


_register_indexing_batch_rules()


# ----------------------------------------------------------------------------
# SBP signatures (transforms/shard_rules.py): one mesh axis; S = split, B = broadcast,
# P = partial sum. A `local` kernel gets the device's boxes (e.g. a shard's offset).


def _dynamic_slice_sbp(in_avals, out_avals, *, slice_sizes):
    x, *starts = in_avals
    return [
        Sig((S(k),) + (B,) * len(starts), (S(k),))
        for k in range(x.ndim)
        if slice_sizes[k] == x.shape[k]
    ]


def _dus_sbp(in_avals, out_avals):
    x, u, *starts = in_avals
    return [
        Sig((S(k), S(k)) + (B,) * len(starts), (S(k),))
        for k in range(x.ndim)
        if u.shape[k] == x.shape[k]
    ]


def _gather_local(ctx, x, idx):
    # x is split on gathered axes: look up the indices that fall in this shard
    # (shifted by the shard's offset), zero elsewhere; the shards sum to the result.
    axes = ctx.params["axes"]
    full = ctx.in_avals[0].shape
    box = ctx.in_boxes[0]
    k = len(axes)
    lo = np.array([box[a][0] for a in axes], np.int64)
    size = np.array([box[a][1] - box[a][0] for a in axes], np.int64)
    top = np.array([full[a] - 1 for a in axes], np.int64)
    dt = idx.dtype
    ishape = idx.shape
    dims = (idx.ndim - 1,)

    def row(values):
        return lax.broadcast_in_dim(np.asarray(values, dt), ishape, dims)

    clamped = lax.min(lax.max(idx, row(np.zeros(k))), row(top))
    shifted = lax.sub(clamped, row(lo))
    ok = lax.bitwise_and(lax.ge(shifted, row(np.zeros(k))), lax.lt(shifted, row(size)))
    inside = lax.reduce_and(ok, (idx.ndim - 1,))
    got = lax.gather(x, shifted, axes)
    nb = idx.ndim - 1
    mask = lax.broadcast_in_dim(inside, got.shape, tuple(range(nb)))
    return lax.select_n(mask, lax.full(got.shape, 0, got.dtype), got)


def _gather_sbp(in_avals, out_avals, *, axes):
    x, idx = in_avals
    nb = idx.ndim - 1
    rest = [d for d in range(x.ndim) if d not in axes]
    sigs = [Sig((S(d), B), (S(nb + rest.index(d)),)) for d in rest]
    sigs += [Sig((B, S(k)), (S(k),)) for k in range(nb)]
    sigs += [Sig((S(a), B), (P,), _gather_local) for a in axes]
    sigs.append(Sig((P, B), (P,)))
    return sigs


def _scatter_sbp_for(linear):
    def rule(in_avals, out_avals, *, axes):
        x, idx, upd = in_avals
        nb = idx.ndim - 1
        rest = [d for d in range(x.ndim) if d not in axes]
        sigs = [Sig((S(d), B, S(nb + rest.index(d))), (S(d),)) for d in rest]
        if linear:
            sigs.append(Sig((P, B, P), (P,)))
            sigs += [Sig((P, S(k), S(k)), (P,)) for k in range(nb)]
        return sigs

    return rule


def_sbp(dynamic_slice_p, _dynamic_slice_sbp, shape_param="slice_sizes")
def_sbp(dynamic_update_slice_p, _dus_sbp)
def_sbp(gather_p, _gather_sbp)
def_sbp(scatter_add_p, _scatter_sbp_for(True))
def_sbp(scatter_p, _scatter_sbp_for(False))
for _p in (scatter_mul_p, scatter_min_p, scatter_max_p):
    def_sbp(_p, _scatter_sbp_for(False))
