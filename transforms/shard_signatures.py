"""SBP signatures of the primitives that are not covered by a family rule.

Grouped by the primitive file they belong to (shape, indexing, dot, sort, random
bits, control flow, collectives). Family rules (elementwise, reduction,
cumulative) live in transforms/shard_rules.py.
"""

import numpy as np
from fflow.transforms.shard_rules import Sig, def_broadcast_only, def_sbp

from fflow import core, lax
from fflow.sharding import B, P, Split, partial_max, partial_min

S = Split
_PASS_PARTIAL = [(P, P), (partial_max, partial_max), (partial_min, partial_min)]


def _prim(name):
    return core.primitives.get(name)


def _passthrough_partials(sigs, n_extra_b=0):
    for a, b in _PASS_PARTIAL:
        sigs.append(Sig((a,) + (B,) * n_extra_b, (b,)))
    return sigs


# ----------------------------------------------------------------------------
# primitives/dot.py


def _dot_general_sbp(in_avals, out_avals, *, dimension_numbers, preferred_element_type=None):
    (lc, rc), (lb, rb) = dimension_numbers
    lhs, rhs = in_avals
    lf = [i for i in range(lhs.ndim) if i not in lc and i not in lb]
    rf = [i for i in range(rhs.ndim) if i not in rc and i not in rb]
    nb = len(lb)
    sigs = [Sig((S(a), S(b)), (S(i),)) for i, (a, b) in enumerate(zip(lb, rb))]
    sigs += [Sig((S(a), B), (S(nb + j),)) for j, a in enumerate(lf)]
    sigs += [Sig((B, S(b)), (S(nb + len(lf) + j),)) for j, b in enumerate(rf)]
    sigs += [Sig((S(a), S(b)), (P,)) for a, b in zip(lc, rc)]
    sigs += [Sig((P, B), (P,)), Sig((B, P), (P,))]
    return sigs


# ----------------------------------------------------------------------------
# primitives/shape.py


def _broadcast_in_dim_sbp(in_avals, out_avals, *, shape, broadcast_dimensions):
    (x,) = in_avals
    sigs = []
    for src, dst in enumerate(broadcast_dimensions):
        if x.shape[src] == shape[dst]:
            sigs.append(Sig((S(src),), (S(dst),)))
    for d in range(len(shape)):
        if d not in broadcast_dimensions or x.shape[broadcast_dimensions.index(d)] != shape[d]:
            sigs.append(Sig((B,), (S(d),)))
    return _passthrough_partials(sigs)


def reshape_groups(a, b):
    """Pairs (in_dims, out_dims) of contiguous dim groups with equal element counts."""
    groups, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        gi, gj = [i], [j]
        pa, pb = a[i], b[j]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb:
                pa *= a[i]
                gi.append(i)
                i += 1
            else:
                pb *= b[j]
                gj.append(j)
                j += 1
        groups.append((gi, gj))
    return groups


def _reshape_sbp(in_avals, out_avals, *, new_sizes, dimensions=None):
    (x,) = in_avals
    sigs = []
    if 0 not in x.shape:
        for gi, gj in reshape_groups(list(x.shape), list(new_sizes)):
            lead_i = next((d for d in gi if x.shape[d] > 1), None)
            lead_j = next((d for d in gj if new_sizes[d] > 1), None)
            if lead_i is not None and lead_j is not None:
                sigs.append(Sig((S(lead_i),), (S(lead_j),)))
    return _passthrough_partials(sigs)


def _transpose_sbp(in_avals, out_avals, *, permutation):
    sigs = [Sig((S(p),), (S(k),)) for k, p in enumerate(permutation)]
    return _passthrough_partials(sigs)


def _squeeze_sbp(in_avals, out_avals, *, dimensions):
    (x,) = in_avals
    kept = [k for k in range(x.ndim) if k not in dimensions]
    sigs = [Sig((S(k),), (S(i),)) for i, k in enumerate(kept)]
    return _passthrough_partials(sigs)


def _rev_sbp(in_avals, out_avals, *, dimensions):
    (x,) = in_avals
    sigs = [Sig((S(k),), (S(k),)) for k in range(x.ndim) if k not in dimensions]
    return _passthrough_partials(sigs)


def _slice_local(ctx, x):
    # The device holds [lo, hi) of the input on each dim; it produces its output
    # box, filled where its input covers the slice and zero elsewhere (P).
    p = ctx.params
    strides = p["strides"] or (1,) * len(p["start_indices"])
    starts, limits, pads = [], [], []
    for d, ((lo, hi), (olo, ohi)) in enumerate(zip(ctx.in_boxes[0], ctx.out_boxes[0])):
        s, st = p["start_indices"][d], strides[d]
        # output positions o in [olo, ohi) with input index s + o*st in [lo, hi)
        first = max(olo, -(-(lo - s) // st))
        last = min(ohi, -(-(hi - s) // st))
        last = max(last, first)
        starts.append(s + first * st - lo)
        limits.append(s + (last - 1) * st - lo + 1 if last > first else s + first * st - lo)
        pads.append((first - olo, ohi - last, 0))
    n = len(starts)
    starts = [min(max(a, 0), x.shape[d]) for d, a in enumerate(starts)]
    limits = [min(max(b, starts[d]), x.shape[d]) for d, b in enumerate(limits)]
    piece = lax.slice(x, starts, limits, strides)
    if any(lo or hi for lo, hi, _ in pads):
        piece = lax.pad(piece, lax.full((), 0, x.dtype), tuple(pads))
    assert n == len(pads)
    return piece


def _slice_sbp(in_avals, out_avals, *, start_indices, limit_indices, strides):
    (x,) = in_avals
    strides = strides or (1,) * x.ndim
    sigs = []
    for k in range(x.ndim):
        full = start_indices[k] == 0 and limit_indices[k] == x.shape[k] and strides[k] == 1
        sigs.append(Sig((S(k),), (S(k),) if full else (P,), _slice_local))
    sigs.append(Sig((P,), (P,), _slice_local))
    return sigs


def _pad_sbp(in_avals, out_avals, *, padding_config):
    (x, _) = in_avals
    return [
        Sig((S(k), B), (S(k),)) for k, cfg in enumerate(padding_config) if tuple(cfg) == (0, 0, 0)
    ]


def _concatenate_sbp(in_avals, out_avals, *, dimension):
    n = len(in_avals)
    sigs = [Sig((S(k),) * n, (S(k),)) for k in range(in_avals[0].ndim) if k != dimension]
    sigs.append(Sig((P,) * n, (P,)))
    return sigs


def _iota_local(ctx):
    p = ctx.params
    shape = ctx.out_shape()
    dim = p["dimension"]
    offset = ctx.out_boxes[0][dim][0]
    out = lax.broadcasted_iota(p["dtype"], shape, dim)
    return lax.add(out, lax.full(shape, offset, p["dtype"])) if offset else out


def _iota_sbp(in_avals, out_avals, *, dtype, shape, dimension):
    return [Sig((), (S(k),), None if k != dimension else _iota_local) for k in range(len(shape))]


# ----------------------------------------------------------------------------
# primitives/indexing.py


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


# ----------------------------------------------------------------------------
# primitives/sort.py, primitives/random_bits.py


def _sort_sbp(in_avals, out_avals, *, dimension, num_keys=1):
    n = len(in_avals)
    return [Sig((S(k),) * n, (S(k),) * n) for k in range(in_avals[0].ndim) if k != dimension]


def _random_bits_local(ctx, key):
    # Counter-based bits: each shard is the slice of the same logical random array.
    full = ctx.out_avals[0].shape
    out = _prim("random_bits").bind(key, **ctx.params)
    box = ctx.out_boxes[0]
    if all(lo == 0 and hi == n for (lo, hi), n in zip(box, full)):
        return out
    return lax.slice(out, [lo for lo, _ in box], [hi for _, hi in box])


def _random_bits_sbp(in_avals, out_avals, *, shape):
    (key,) = in_avals
    nb = key.ndim - 1
    sigs = [Sig((S(k),), (S(k),)) for k in range(nb)]
    sigs += [Sig((B,), (S(nb + k),), _random_bits_local) for k in range(len(shape))]
    return sigs


def _fold_in_sbp(in_avals, out_avals):
    key, data = in_avals
    return [Sig((S(k), S(k)), (S(k),)) for k in range(key.ndim - 1)]


def register():
    reg = {
        "dot_general": (_dot_general_sbp, None),
        "broadcast_in_dim": (_broadcast_in_dim_sbp, "shape"),
        "reshape": (_reshape_sbp, "new_sizes"),
        "transpose": (_transpose_sbp, None),
        "squeeze": (_squeeze_sbp, None),
        "rev": (_rev_sbp, None),
        "slice": (_slice_sbp, None),
        "pad": (_pad_sbp, None),
        "concatenate": (_concatenate_sbp, None),
        "iota": (_iota_sbp, "shape"),
        "dynamic_slice": (_dynamic_slice_sbp, "slice_sizes"),
        "dynamic_update_slice": (_dus_sbp, None),
        "gather": (_gather_sbp, None),
        "scatter_add": (_scatter_sbp_for(True), None),
        "scatter": (_scatter_sbp_for(False), None),
        "scatter_mul": (_scatter_sbp_for(False), None),
        "scatter_min": (_scatter_sbp_for(False), None),
        "scatter_max": (_scatter_sbp_for(False), None),
        "sort": (_sort_sbp, None),
        "random_bits": (_random_bits_sbp, None),
        "random_fold_in": (_fold_in_sbp, None),
    }
    for name, (rule, shape_param) in reg.items():
        prim = _prim(name)
        if prim is not None:
            def_sbp(prim, rule, shape_param=shape_param)
    for name in ("cond", "while", "scan"):
        prim = _prim(name)
        if prim is not None:
            def_broadcast_only(
                prim, "control flow runs replicated (all-broadcast) inside a sharded program"
            )
    for prim in core.primitives.values():
        if "collective" in prim.traits:
            def_broadcast_only(prim, "a per-device collective; shard inserts it, never plans it")


register()
