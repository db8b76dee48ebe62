"""Shape primitives: broadcast_in_dim, reshape, transpose, squeeze, slice, pad,
concatenate, rev. All are linear; their transposes move cotangents back."""

import numpy as np
from fflow.transforms import vmap
from fflow.transforms.autodiff import Zero, deflinear, is_undefined
from fflow.transforms.shard_rules import Sig, def_sbp, passthrough_partials
from fflow.transforms.vmap import batch_rules

from fflow import lax_ops as lax
from fflow.core import Primitive, ShapedArray
from fflow.errors import ShapeError, user_error
from fflow.sbp import B, P, S


def _shape_prim(name):
    prim = Primitive(name)
    prim.traits.add("shape")
    prim.amp_class = "follow"
    return prim


# -- broadcast_in_dim ---------------------------------------------------------
broadcast_in_dim_p = _shape_prim("broadcast_in_dim")
broadcast_in_dim_p.traits.add("view")  # the NumPy result is a view of the input


@broadcast_in_dim_p.def_impl
def _broadcast_in_dim_impl(x, *, shape, broadcast_dimensions):
    expanded = [1] * len(shape)
    for src, dst in enumerate(broadcast_dimensions):
        expanded[dst] = x.shape[src]
    return np.broadcast_to(x.reshape(expanded), shape)


@broadcast_in_dim_p.def_abstract_eval
def _broadcast_in_dim_abstract_eval(x, *, shape, broadcast_dimensions):
    if len(broadcast_dimensions) != x.ndim:
        raise user_error(
            ShapeError,
            f"broadcast_in_dim: operand of rank {x.ndim} needs {x.ndim} broadcast_dimensions, "
            f"got {broadcast_dimensions}",
        )
    for src, dst in enumerate(broadcast_dimensions):
        if not 0 <= dst < len(shape) or x.shape[src] not in (1, shape[dst]):
            raise user_error(ShapeError, f"cannot broadcast shape {x.shape} to {tuple(shape)}")
    if list(broadcast_dimensions) != sorted(broadcast_dimensions):
        raise user_error(ShapeError, "broadcast_dimensions must be increasing")
    return ShapedArray(shape, x.dtype, x.weak_type)


def _broadcast_in_dim_transpose(ct, x, *, shape, broadcast_dimensions):
    in_shape = x.aval.shape
    new_dims = tuple(i for i in range(len(shape)) if i not in broadcast_dimensions)
    expanded = tuple(
        dst
        for src, dst in enumerate(broadcast_dimensions)
        if in_shape[src] == 1 and shape[dst] != 1
    )
    summed = lax.reduce_sum(ct, tuple(sorted(new_dims + expanded))) if new_dims or expanded else ct
    return [lax.reshape(summed, in_shape)]


deflinear(broadcast_in_dim_p, _broadcast_in_dim_transpose)

# -- reshape -------------------------------------------------------------------
reshape_p = _shape_prim("reshape")
reshape_p.traits.add("view")  # the NumPy result is a view of the input


@reshape_p.def_impl
def _reshape_impl(x, *, new_sizes):
    return x.reshape(new_sizes)


@reshape_p.def_abstract_eval
def _reshape_abstract_eval(x, *, new_sizes):
    if int(np.prod(new_sizes, dtype=np.int64)) != x.size:
        raise user_error(
            ShapeError,
            f"cannot reshape an array of shape {x.shape} ({x.size} elements) into shape "
            f"{tuple(new_sizes)}. Fix: the sizes must multiply to {x.size} (one may be -1).",
        )
    return ShapedArray(new_sizes, x.dtype, x.weak_type)


deflinear(reshape_p, lambda ct, x, *, new_sizes: [lax.reshape(ct, x.aval.shape)])

# -- transpose -----------------------------------------------------------------
transpose_p = _shape_prim("transpose")
transpose_p.traits.add("view")  # the NumPy result is a view of the input


@transpose_p.def_impl
def _transpose_impl(x, *, permutation):
    return np.transpose(x, permutation)


@transpose_p.def_abstract_eval
def _transpose_abstract_eval(x, *, permutation):
    if sorted(permutation) != list(range(x.ndim)):
        raise user_error(
            ShapeError,
            f"transpose: {permutation} is not a permutation of the axes of {x.shape}. Fix: "
            f"list each of the {x.ndim} axes once.",
        )
    return ShapedArray(tuple(x.shape[p] for p in permutation), x.dtype, x.weak_type)


def _transpose_transpose(ct, x, *, permutation):
    return [lax.transpose(ct, tuple(np.argsort(permutation)))]


deflinear(transpose_p, _transpose_transpose)

# -- squeeze ---------------------------------------------------------------------
squeeze_p = _shape_prim("squeeze")
squeeze_p.traits.add("view")  # the NumPy result is a view of the input


@squeeze_p.def_impl
def _squeeze_impl(x, *, dimensions):
    return np.squeeze(x, axis=dimensions) if dimensions else x


@squeeze_p.def_abstract_eval
def _squeeze_abstract_eval(x, *, dimensions):
    for d in dimensions:
        if not 0 <= d < x.ndim or x.shape[d] != 1:
            raise user_error(
                ShapeError,
                f"squeeze: axis {d} of shape {x.shape} is not of size 1. Fix: squeeze only "
                f"axes of size 1 (axis=None squeezes all of them).",
            )
    shape = tuple(s for i, s in enumerate(x.shape) if i not in dimensions)
    return ShapedArray(shape, x.dtype, x.weak_type)


deflinear(squeeze_p, lambda ct, x, *, dimensions: [lax.reshape(ct, x.aval.shape)])

# -- slice -----------------------------------------------------------------------
slice_p = _shape_prim("slice")
slice_p.traits.add("view")  # the NumPy result is a view of the input


@slice_p.def_impl
def _slice_impl(x, *, start_indices, limit_indices, strides):
    idx = tuple(
        slice(s, l, st) for s, l, st in zip(start_indices, limit_indices, strides or [1] * x.ndim)
    )
    return x[idx]


@slice_p.def_abstract_eval
def _slice_abstract_eval(x, *, start_indices, limit_indices, strides):
    strides = strides or (1,) * x.ndim
    if not (len(start_indices) == len(limit_indices) == len(strides) == x.ndim):
        raise user_error(ShapeError, f"slice: index lists must have length {x.ndim}")
    shape = []
    for d, s, l, st in zip(x.shape, start_indices, limit_indices, strides):
        if not (0 <= s <= l <= d) or st < 1:
            raise user_error(
                ShapeError, f"slice [{s}:{l}:{st}] is out of bounds for a dimension of size {d}"
            )
        shape.append((l - s + st - 1) // st)
    return ShapedArray(shape, x.dtype, x.weak_type)


def _slice_transpose(ct, x, *, start_indices, limit_indices, strides):
    shape = x.aval.shape
    strides = strides or (1,) * len(shape)
    config = []
    for d, s, st, n in zip(
        shape, start_indices, strides, ct.aval.shape if hasattr(ct, "aval") else np.shape(ct)
    ):
        used = s + (n - 1) * st + 1 if n > 0 else s
        config.append((s, d - used, st - 1))
    if any(n == 0 for n in np.shape(ct)):
        return [lax.full(shape, 0, x.aval.dtype)]
    zero = lax.full((), 0, x.aval.dtype)
    return [lax.pad(ct, zero, tuple(config))]


deflinear(slice_p, _slice_transpose)

# -- pad -------------------------------------------------------------------------
pad_p = _shape_prim("pad")
pad_p.traits.add("fresh_output")  # its NumPy result is a new array (lowering/schedule.py)


@pad_p.def_impl
def _pad_impl(x, padding_value, *, padding_config):
    lows = [lo for lo, _, _ in padding_config]
    highs = [hi for _, hi, _ in padding_config]
    interiors = [it for _, _, it in padding_config]
    # interior padding first, then edges; negative edges crop
    shape = [d + max(d - 1, 0) * it for d, it in zip(x.shape, interiors)]
    out = np.full(
        [s + max(lo, 0) + max(hi, 0) for s, lo, hi in zip(shape, lows, highs)],
        padding_value,
        dtype=x.dtype,
    )
    idx = tuple(
        slice(max(lo, 0), max(lo, 0) + s, it + 1) for s, lo, it in zip(shape, lows, interiors)
    )
    out[idx] = x
    crop = tuple(
        slice(-min(lo, 0), out.shape[i] + min(hi, 0)) for i, (lo, hi) in enumerate(zip(lows, highs))
    )
    return out[crop]


@pad_p.def_abstract_eval
def _pad_abstract_eval(x, padding_value, *, padding_config):
    if len(padding_config) != x.ndim:
        raise user_error(ShapeError, f"pad: padding_config needs {x.ndim} entries")
    if padding_value.shape != () or padding_value.dtype != x.dtype:
        raise user_error(ShapeError, "pad: padding_value must be a scalar of the operand's dtype")
    shape = []
    for d, (lo, hi, it) in zip(x.shape, padding_config):
        n = d + lo + hi + max(d - 1, 0) * it
        if n < 0 or it < 0:
            raise user_error(ShapeError, f"pad: negative size from config {(lo, hi, it)}")
        shape.append(n)
    return ShapedArray(shape, x.dtype, x.weak_type)


def _pad_transpose(ct, x, padding_value, *, padding_config):
    if type(ct) is Zero:
        return [None, None]
    # undo negative edges by padding back with zeros, then take every (interior+1)th
    lows = [lo for lo, _, _ in padding_config]
    highs = [hi for _, hi, _ in padding_config]
    c = ct
    if any(lo < 0 or hi < 0 for lo, hi in zip(lows, highs)):
        unpad = tuple((max(-lo, 0), max(-hi, 0), 0) for lo, hi in zip(lows, highs))
        c = lax.pad(ct, lax.full((), 0, ct.dtype), unpad)
    starts = [max(lo, 0) for lo in lows]
    limits = [s - max(hi, 0) for s, hi in zip(c.shape, highs)]
    strides = [it + 1 for _, _, it in padding_config]
    ct_operand = lax.slice(c, starts, limits, strides)
    ct_x = ct_operand if is_undefined(x) else None
    ct_pv = None
    if is_undefined(padding_value):
        total = lax.reduce_sum(ct, tuple(range(ct.ndim)))
        inner = lax.reduce_sum(ct_operand, tuple(range(ct_operand.ndim)))
        ct_pv = lax.sub(total, inner)
    return [ct_x, ct_pv]


deflinear(pad_p, _pad_transpose)

# -- concatenate -------------------------------------------------------------------
concatenate_p = _shape_prim("concatenate")
concatenate_p.traits.add("fresh_output")  # its NumPy result is a new array (lowering/schedule.py)


@concatenate_p.def_impl
def _concatenate_impl(*xs, dimension):
    return np.concatenate(xs, axis=dimension)


@concatenate_p.def_abstract_eval
def _concatenate_abstract_eval(*xs, dimension):
    if not xs:
        raise user_error(ValueError, "concatenate needs at least one array")
    first = xs[0]
    if not 0 <= dimension < first.ndim:
        raise user_error(
            ShapeError, f"concatenate: axis {dimension} out of range for rank {first.ndim}"
        )
    for x in xs[1:]:
        if x.ndim != first.ndim or any(
            a != b for i, (a, b) in enumerate(zip(x.shape, first.shape)) if i != dimension
        ):
            raise user_error(
                ShapeError,
                f"concatenate along axis {dimension}: shapes {first.shape} and {x.shape} differ "
                f"outside that axis. Fix: all sizes but axis {dimension}'s must match (pass "
                f"axis= to concatenate along another axis).",
            )
        if x.dtype != first.dtype:
            raise user_error(
                ShapeError,
                f"concatenate: operands must have one dtype, got {first.dtype.name} and "
                f"{x.dtype.name}. Fix: cast with .astype() (jnp.concatenate promotes).",
            )
    shape = list(first.shape)
    shape[dimension] = sum(x.shape[dimension] for x in xs)
    return ShapedArray(shape, first.dtype, all(x.weak_type for x in xs))


def _concatenate_transpose(ct, *xs, dimension):
    out = []
    start = 0
    for x in xs:
        shape = x.aval.shape if is_undefined(x) else np.shape(x)
        n = shape[dimension]
        if is_undefined(x) and type(ct) is not Zero:
            out.append(lax.slice_in_dim(ct, start, start + n, axis=dimension))
        else:
            out.append(None)
        start += n
    return out


deflinear(concatenate_p, _concatenate_transpose)

# -- rev -----------------------------------------------------------------------------
rev_p = _shape_prim("rev")
rev_p.traits.add("view")  # the NumPy result is a view of the input


@rev_p.def_impl
def _rev_impl(x, *, dimensions):
    return np.flip(x, dimensions) if dimensions else x


@rev_p.def_abstract_eval
def _rev_abstract_eval(x, *, dimensions):
    for d in dimensions:
        if not 0 <= d < x.ndim:
            raise user_error(ShapeError, f"rev: axis {d} out of range for rank {x.ndim}")
    return x


deflinear(rev_p, lambda ct, x, *, dimensions: [lax.rev(ct, dimensions)])

# -- iota ------------------------------------------------------------------------------
iota_p = Primitive("iota")
iota_p.amp_class = "follow"
iota_p.traits.add("fresh_output")  # its NumPy result is a new array (lowering/schedule.py)


@iota_p.def_impl
def _iota_impl(*, dtype, shape, dimension):
    ar = np.arange(shape[dimension], dtype=dtype)
    expanded = [1] * len(shape)
    expanded[dimension] = shape[dimension]
    return np.broadcast_to(ar.reshape(expanded), shape)


@iota_p.def_abstract_eval
def _iota_abstract_eval(*, dtype, shape, dimension):
    return ShapedArray(shape, dtype)


# -- batching rules (vmap) -------------------------------------------------------------
def _shape_batch_imports():

    return vmap


def _broadcast_in_dim_batch(vals, dims, *, shape, broadcast_dimensions):
    vm = _shape_batch_imports()
    (x,), (d,) = vals, dims
    x = vm.moveaxis(x, d, 0)
    size = x.shape[0]
    out = lax.broadcast_in_dim(
        x, (size,) + tuple(shape), (0,) + tuple(b + 1 for b in broadcast_dimensions)
    )
    return out, 0


def _reshape_batch(vals, dims, *, new_sizes):
    vm = _shape_batch_imports()
    (x,), (d,) = vals, dims
    x = vm.moveaxis(x, d, 0)
    size = x.shape[0]
    return lax.reshape(x, (size,) + tuple(new_sizes)), 0


def _transpose_batch(vals, dims, *, permutation):
    (x,), (d,) = vals, dims
    # keep the batch dim where it is: permute the other axes around it
    others = [p if p < d else p + 1 for p in permutation]
    perm = others[:d] + [d] + others[d:]
    return lax.transpose(x, perm), d


def _squeeze_batch(vals, dims, *, dimensions):
    vm = _shape_batch_imports()
    (x,), (d,) = vals, dims
    x = vm.moveaxis(x, d, 0)
    return lax.squeeze(x, tuple(a + 1 for a in dimensions)), 0


def _slice_batch(vals, dims, *, start_indices, limit_indices, strides):
    vm = _shape_batch_imports()
    (x,), (d,) = vals, dims
    x = vm.moveaxis(x, d, 0)
    size = x.shape[0]
    strides = None if strides is None else (1,) + tuple(strides)
    out = slice_p.bind(
        x,
        start_indices=(0,) + tuple(start_indices),
        limit_indices=(size,) + tuple(limit_indices),
        strides=strides,
    )
    return out, 0


def _pad_batch(vals, dims, *, padding_config):
    vm = _shape_batch_imports()
    (x, pv), (dx, dpv) = vals, dims
    size = vm.batch_size(vals, dims)
    x = vm.bdim_to_front(x, dx, size)
    config = ((0, 0, 0),) + tuple(padding_config)
    if dpv is vm.not_mapped:
        return pad_p.bind(x, pv, padding_config=config), 0
    # a batched padding value: pad with zeros, then select it where a mask of ones is not
    zero = lax.full((), 0, x.dtype)
    padded = pad_p.bind(x, zero, padding_config=config)
    mask = pad_p.bind(lax.full(x.shape, True, np.bool_), np.asarray(False), padding_config=config)
    pv = vm.moveaxis(pv, dpv, 0)
    pv_full = lax.broadcast_in_dim(pv, padded.shape, (0,))
    return lax.select_n(mask, pv_full, padded), 0


def _concatenate_batch(vals, dims, *, dimension):
    vm = _shape_batch_imports()
    moved, _ = vm.all_to_front(vals, dims)
    return concatenate_p.bind(*moved, dimension=dimension + 1), 0


def _rev_batch(vals, dims, *, dimensions):
    (x,), (d,) = vals, dims
    return lax.rev(x, tuple(a if a < d else a + 1 for a in dimensions)), d


def _iota_batch(vals, dims, **params):
    return iota_p.bind(**params), None  # no operands: never batched


def _register_shape_batch_rules():

    batch_rules[broadcast_in_dim_p] = _broadcast_in_dim_batch
    batch_rules[reshape_p] = _reshape_batch
    batch_rules[transpose_p] = _transpose_batch
    batch_rules[squeeze_p] = _squeeze_batch
    batch_rules[slice_p] = _slice_batch
    batch_rules[pad_p] = _pad_batch
    batch_rules[concatenate_p] = _concatenate_batch
    batch_rules[rev_p] = _rev_batch
    batch_rules[iota_p] = _iota_batch


_register_shape_batch_rules()


# ----------------------------------------------------------------------------
# SBP signatures (transforms/shard_rules.py): one mesh axis; S = split, B = broadcast,
# P = partial sum. A `local` kernel gets the device's boxes (e.g. a shard's offset).


def _broadcast_in_dim_sbp(in_avals, out_avals, *, shape, broadcast_dimensions):
    (x,) = in_avals
    sigs = []
    for src, dst in enumerate(broadcast_dimensions):
        if x.shape[src] == shape[dst]:
            sigs.append(Sig((S(src),), (S(dst),)))
    for d in range(len(shape)):
        if d not in broadcast_dimensions or x.shape[broadcast_dimensions.index(d)] != shape[d]:
            sigs.append(Sig((B,), (S(d),)))
    return passthrough_partials(sigs)


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
    return passthrough_partials(sigs)


def _transpose_sbp(in_avals, out_avals, *, permutation):
    sigs = [Sig((S(p),), (S(k),)) for k, p in enumerate(permutation)]
    return passthrough_partials(sigs)


def _squeeze_sbp(in_avals, out_avals, *, dimensions):
    (x,) = in_avals
    kept = [k for k in range(x.ndim) if k not in dimensions]
    sigs = [Sig((S(k),), (S(i),)) for i, k in enumerate(kept)]
    return passthrough_partials(sigs)


def _rev_sbp(in_avals, out_avals, *, dimensions):
    (x,) = in_avals
    sigs = [Sig((S(k),), (S(k),)) for k in range(x.ndim) if k not in dimensions]
    return passthrough_partials(sigs)


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


def_sbp(broadcast_in_dim_p, _broadcast_in_dim_sbp, shape_param="shape")
def_sbp(reshape_p, _reshape_sbp, shape_param="new_sizes")
def_sbp(transpose_p, _transpose_sbp)
def_sbp(squeeze_p, _squeeze_sbp)
def_sbp(rev_p, _rev_sbp)
def_sbp(slice_p, _slice_sbp)
def_sbp(pad_p, _pad_sbp)
def_sbp(concatenate_p, _concatenate_sbp)
def_sbp(iota_p, _iota_sbp, shape_param="shape")
