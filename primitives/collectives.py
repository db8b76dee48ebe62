"""Collective primitives: the boxing operations `shard` inserts into SPMD programs.

Each equation of a per-device program carries its communication group as
`group` (flat placement indices of the members, in order) and `index` (this
device's position in it), plus `placement`. Communicating collectives are written
once as *phases*: every member makes its outgoing messages, then combines what it
received. The simulated runtime delivers messages between devices of one process;
the MPI runtime sends them between ranks. Both count bytes the same way, so
measured bytes equal the cost model of `transforms/shard_boxing.py`.

Members always reduce in group order, so every runtime gets bit-identical numbers.

| primitive      | SBP conversion (per mesh axis) | bytes over the group |
|----------------|--------------------------------|----------------------|
| all_reduce     | P -> B                         | 2(p-1)T              |
| reduce_scatter | P -> S(k)                      | (p-1)T               |
| all_gather     | S(k) -> B                      | (p-1)T               |
| all_to_all     | S(i) -> S(j)                   | (p-1)/p T            |
| shard_slice    | B -> S(k)                      | 0                    |
| shard_pad      | S(k) -> P                      | 0                    |
| keep_one       | B -> P                         | 0                    |
| exchange       | anything (slice intersection)  | what it moves        |
"""

import numpy as np
from fflow.transforms import vmap as vmap_mod
from fflow.transforms.autodiff import Zero, deflinear, instantiate, jvp_rules, transpose_rules

from fflow import lax_ops as lax
from fflow.core import Primitive, ShapedArray
from fflow.errors import FflowError
from fflow.sbp import balanced, partial_identity, reduce_fn

collective_phases = {}  # prim -> list of Phase
batch_axis_params = {}  # prim -> names of params holding tensor axes (shifted by batching)


class Phase:
    """One communication round: `make(x, state, **params) -> {dst: [arrays]}` and
    `combine(x, state, received, **params) -> state`; the last state is the output."""

    def __init__(self, make, combine, expect=None):
        self.make = make
        self.combine = combine
        self.expect = expect  # params -> members this device receives from (default: all)

    def sources(self, params):
        if self.expect is not None:
            return self.expect(params)
        return [j for j in range(len(params["group"])) if j != params["index"]]


def _collective(name, abstract_eval, phases=(), local_impl=None, axis_params=()):
    prim = Primitive(name)
    prim.traits.add("collective")
    prim.amp_class = "follow"
    prim.def_abstract_eval(abstract_eval)
    batch_axis_params[prim] = axis_params
    if phases:
        collective_phases[prim] = list(phases)

        def impl(x, **params):
            if len(params["group"]) != 1:
                raise FflowError(
                    f"{name} over {len(params['group'])} devices runs only inside a sharded "
                    "program (fflow.shard or global arrays), not on a local array."
                )
            return run_phases_single(prim, x, params)

        prim.def_impl(impl)
    else:
        prim.def_impl(local_impl)
    return prim


def run_phases_single(prim, x, params):
    state = None
    for phase in collective_phases[prim]:
        state = phase.combine(x, state, {}, **params)
    return state


def _chunks(flat, p):
    bounds = np.cumsum([0] + balanced(flat.size, p))
    return [flat[bounds[i] : bounds[i + 1]] for i in range(p)]


def _slices(x, axis, sizes):
    bounds = np.cumsum([0] + list(sizes))
    idx = [slice(None)] * x.ndim
    out = []
    for i in range(len(sizes)):
        idx[axis] = slice(int(bounds[i]), int(bounds[i + 1]))
        out.append(x[tuple(idx)])
    return out


def _ordered(received, own, index, n):
    return [own if j == index else received[j] for j in range(n)]


# -- all_reduce: reduce-scatter of flat chunks, then all-gather of the chunks --------
def _ar_rs_make(x, state, *, op, group, index, placement):
    chunks = _chunks(np.ascontiguousarray(x).reshape(-1), len(group))
    return {j: [chunks[j]] for j in range(len(group)) if j != index}


def _ar_rs_combine(x, state, received, *, op, group, index, placement):
    own = _chunks(np.ascontiguousarray(x).reshape(-1), len(group))[index]
    parts = _ordered({j: r[0] for j, r in received.items() if j != index}, own, index, len(group))
    return _reduce_parts(parts, op, x.dtype)


def _ar_ag_make(x, state, *, op, group, index, placement):
    return {j: [state] for j in range(len(group)) if j != index}


def _ar_ag_combine(x, state, received, *, op, group, index, placement):
    parts = _ordered({j: r[0] for j, r in received.items() if j != index}, state, index, len(group))
    return np.concatenate(parts).reshape(x.shape) if parts else state.reshape(x.shape)


def _reduce_parts(parts, op, dtype):
    """Reduce members' parts in group order; half-precision sums accumulate in float32
    (rounded once at the end), as AMP accumulates reductions and matmuls."""
    wide = op == "sum" and np.dtype(dtype).itemsize < 4 and np.dtype(dtype).kind == "f"
    if np.dtype(dtype).name == "bfloat16":
        wide = op == "sum"
    acc = parts[0].astype(np.float32) if wide else parts[0]
    fn = reduce_fn(op)
    for part in parts[1:]:
        acc = fn(acc, part.astype(np.float32) if wide else part)
    return np.asarray(acc, dtype=dtype)


def _same_aval(x, **params):
    return ShapedArray(x.shape, x.dtype, x.weak_type)


all_reduce_p = _collective(
    "all_reduce",
    _same_aval,
    phases=[Phase(_ar_rs_make, _ar_rs_combine), Phase(_ar_ag_make, _ar_ag_combine)],
)


# -- all_gather: S(axis) -> B ------------------------------------------------------
def _ag_make(x, state, *, axis, sizes, group, index, placement):
    return {j: [x] for j in range(len(group)) if j != index}


def _ag_combine(x, state, received, *, axis, sizes, group, index, placement):
    parts = _ordered({j: r[0] for j, r in received.items() if j != index}, x, index, len(group))
    return np.concatenate(parts, axis=axis)


def _ag_abstract(x, *, axis, sizes, group, index, placement):
    shape = list(x.shape)
    shape[axis] = int(sum(sizes))
    return ShapedArray(shape, x.dtype, x.weak_type)


all_gather_p = _collective(
    "all_gather", _ag_abstract, phases=[Phase(_ag_make, _ag_combine)], axis_params=("axis",)
)


# -- reduce_scatter: P(op) -> S(axis) ---------------------------------------------------
def _rs_make(x, state, *, op, axis, sizes, group, index, placement):
    pieces = _slices(x, axis, sizes)
    return {j: [pieces[j]] for j in range(len(group)) if j != index}


def _rs_combine(x, state, received, *, op, axis, sizes, group, index, placement):
    own = _slices(x, axis, sizes)[index]
    parts = _ordered({j: r[0] for j, r in received.items() if j != index}, own, index, len(group))
    return _reduce_parts(parts, op, x.dtype)


def _rs_abstract(x, *, op, axis, sizes, group, index, placement):
    shape = list(x.shape)
    shape[axis] = int(sizes[index])
    return ShapedArray(shape, x.dtype, x.weak_type)


reduce_scatter_p = _collective(
    "reduce_scatter", _rs_abstract, phases=[Phase(_rs_make, _rs_combine)], axis_params=("axis",)
)


# -- all_to_all: S(in_axis) -> S(out_axis) ------------------------------------------------
def _a2a_make(x, state, *, in_axis, out_axis, in_sizes, out_sizes, group, index, placement):
    pieces = _slices(x, out_axis, out_sizes)
    return {j: [pieces[j]] for j in range(len(group)) if j != index}


def _a2a_combine(
    x, state, received, *, in_axis, out_axis, in_sizes, out_sizes, group, index, placement
):
    own = _slices(x, out_axis, out_sizes)[index]
    parts = _ordered({j: r[0] for j, r in received.items() if j != index}, own, index, len(group))
    return np.concatenate(parts, axis=in_axis)


def _a2a_abstract(x, *, in_axis, out_axis, in_sizes, out_sizes, group, index, placement):
    shape = list(x.shape)
    shape[in_axis] = int(sum(in_sizes))
    shape[out_axis] = int(out_sizes[index])
    return ShapedArray(shape, x.dtype, x.weak_type)


all_to_all_p = _collective(
    "all_to_all",
    _a2a_abstract,
    phases=[Phase(_a2a_make, _a2a_combine)],
    axis_params=("in_axis", "out_axis"),
)


# -- local boxing: B -> S (slice), S -> P (pad), B -> P (keep one) ------------------------
def _shard_slice_impl(x, *, axis, sizes, index, group, placement):
    return np.array(_slices(x, axis, sizes)[index])


def _shard_slice_abstract(x, *, axis, sizes, index, group, placement):
    return _rs_abstract(
        x, op="sum", axis=axis, sizes=sizes, group=group, index=index, placement=placement
    )


shard_slice_p = _collective(
    "shard_slice", _shard_slice_abstract, local_impl=_shard_slice_impl, axis_params=("axis",)
)


def _shard_pad_impl(x, *, axis, sizes, index, fill, group, placement):
    shape = list(x.shape)
    shape[axis] = int(sum(sizes))
    value = partial_identity(fill, x.dtype) if isinstance(fill, str) else fill
    out = np.full(shape, value, dtype=x.dtype)
    start = int(sum(sizes[:index]))
    idx = [slice(None)] * x.ndim
    idx[axis] = slice(start, start + x.shape[axis])
    out[tuple(idx)] = x
    return out


def _shard_pad_abstract(x, *, axis, sizes, index, fill, group, placement):
    shape = list(x.shape)
    shape[axis] = int(sum(sizes))
    return ShapedArray(shape, x.dtype, x.weak_type)


shard_pad_p = _collective(
    "shard_pad", _shard_pad_abstract, local_impl=_shard_pad_impl, axis_params=("axis",)
)


def _keep_one_impl(x, *, index, group, placement):
    return np.array(x) if index == 0 else np.zeros_like(x)


keep_one_p = _collective("keep_one", _same_aval, local_impl=_keep_one_impl)


# -- exchange: the general slice-intersection fallback ----------------------------------
# sends: ((dst, in_box), ...); recvs: ((src, out_box), ...); local: ((in_box, out_box), ...)
def _box(b):
    return tuple(slice(lo, hi) for lo, hi in b)


def _ex_make(x, state, *, sends, recvs, local, out_shape, accumulate, group, index, placement):
    msgs = {}
    for dst, in_box in sends:
        msgs.setdefault(dst, []).append(np.ascontiguousarray(x[_box(in_box)]))
    return msgs


def _ex_combine(
    x, state, received, *, sends, recvs, local, out_shape, accumulate, group, index, placement
):
    out = np.zeros(out_shape, dtype=x.dtype)
    pieces = [(x[_box(ib)], ob) for ib, ob in local]
    cursor = {}
    for src, out_box in recvs:
        k = cursor.get(src, 0)
        cursor[src] = k + 1
        pieces.append((received[src][k], out_box))
    for piece, ob in pieces:
        if accumulate:
            out[_box(ob)] += piece
        else:
            out[_box(ob)] = piece
    return out


def _ex_expect(params):
    return sorted({src for src, _ in params["recvs"]})


def _ex_abstract(x, *, sends, recvs, local, out_shape, accumulate, group, index, placement):
    return ShapedArray(out_shape, x.dtype, x.weak_type)


exchange_p = _collective(
    "exchange", _ex_abstract, phases=[Phase(_ex_make, _ex_combine, expect=_ex_expect)]
)

# ----------------------------------------------------------------------------
# Autodiff: every linear collective transposes into its dual conversion
# (P->B <-> P->B, S->B <-> P->S, S(i)->S(j) <-> S(j)->S(i), B->S <-> S->P, B->P <-> B->P).


def _common(params):
    return dict(group=params["group"], index=params["index"], placement=params["placement"])


def _all_reduce_jvp(primals, tangents, **params):
    (x,), (t,) = primals, tangents
    out = all_reduce_p.bind(x, **params)
    if type(t) is Zero:
        return out, t
    if params["op"] == "sum":
        return out, all_reduce_p.bind(t, **params)
    # max/min: the tangent of the member(s) attaining the extremum, averaged over ties
    mask = lax.convert_element_type(lax.eq(x, out), t.dtype)
    summed = dict(params, op="sum")
    num = all_reduce_p.bind(lax.mul(t, mask), **summed)
    return out, lax.div(num, all_reduce_p.bind(mask, **summed))


def _all_reduce_transpose(ct, x, **params):
    if type(ct) is Zero:
        return [None]
    if params["op"] != "sum":
        raise FflowError("all_reduce(max/min) is not linear")
    return [all_reduce_p.bind(ct, **params)]


jvp_rules[all_reduce_p] = _all_reduce_jvp
transpose_rules[all_reduce_p] = _all_reduce_transpose


def _all_gather_transpose(ct, x, *, axis, sizes, **params):
    if type(ct) is Zero:
        return [None]
    return [reduce_scatter_p.bind(ct, op="sum", axis=axis, sizes=sizes, **_common(params))]


deflinear(all_gather_p, _all_gather_transpose)


def _reduce_scatter_jvp(primals, tangents, **params):
    (x,), (t,) = primals, tangents
    out = reduce_scatter_p.bind(x, **params)
    if type(t) is Zero:
        return out, Zero(ShapedArray(out.shape, out.dtype))
    if params["op"] == "sum":
        return out, reduce_scatter_p.bind(t, **params)
    full = all_gather_p.bind(out, axis=params["axis"], sizes=params["sizes"], **_common(params))
    mask = lax.convert_element_type(lax.eq(x, full), t.dtype)
    summed = dict(params, op="sum")
    num = reduce_scatter_p.bind(lax.mul(t, mask), **summed)
    return out, lax.div(num, reduce_scatter_p.bind(mask, **summed))


def _reduce_scatter_transpose(ct, x, *, op, axis, sizes, **params):
    if type(ct) is Zero:
        return [None]
    if op != "sum":
        raise FflowError("reduce_scatter(max/min) is not linear")
    return [all_gather_p.bind(ct, axis=axis, sizes=sizes, **_common(params))]


jvp_rules[reduce_scatter_p] = _reduce_scatter_jvp
transpose_rules[reduce_scatter_p] = _reduce_scatter_transpose


def _all_to_all_transpose(ct, x, *, in_axis, out_axis, in_sizes, out_sizes, **params):
    if type(ct) is Zero:
        return [None]
    return [
        all_to_all_p.bind(
            ct,
            in_axis=out_axis,
            out_axis=in_axis,
            in_sizes=out_sizes,
            out_sizes=in_sizes,
            **_common(params),
        )
    ]


deflinear(all_to_all_p, _all_to_all_transpose)


def _shard_slice_transpose(ct, x, *, axis, sizes, **params):
    if type(ct) is Zero:
        return [None]
    return [shard_pad_p.bind(ct, axis=axis, sizes=sizes, fill=0, **_common(params))]


deflinear(shard_slice_p, _shard_slice_transpose)


def _shard_pad_jvp(primals, tangents, **params):
    (x,), (t,) = primals, tangents
    out = shard_pad_p.bind(x, **params)
    if type(t) is Zero:
        return out, Zero(ShapedArray(out.shape, out.dtype))
    return out, shard_pad_p.bind(t, **dict(params, fill=0))


def _shard_pad_transpose(ct, x, *, axis, sizes, fill, **params):
    if type(ct) is Zero:
        return [None]
    if fill != 0:
        raise FflowError("shard_pad with a non-zero fill is not linear")
    return [shard_slice_p.bind(ct, axis=axis, sizes=sizes, **_common(params))]


jvp_rules[shard_pad_p] = _shard_pad_jvp
transpose_rules[shard_pad_p] = _shard_pad_transpose

deflinear(
    keep_one_p,
    lambda ct, x, **params: [None if type(ct) is Zero else keep_one_p.bind(ct, **params)],
)


def _exchange_transpose(ct, x, *, sends, recvs, local, out_shape, accumulate, **params):
    if type(ct) is Zero:
        return [None]
    in_shape = x.aval.shape
    return [
        exchange_p.bind(
            instantiate(ct),
            sends=recvs,
            recvs=sends,
            local=tuple((ob, ib) for ib, ob in local),
            out_shape=tuple(in_shape),
            accumulate=True,
            **_common(params),
        )
    ]


deflinear(exchange_p, _exchange_transpose)

# ----------------------------------------------------------------------------
# Batching: a batch dimension rides along at the front; tensor-axis params shift by one.


def collective_batch(prim, args, dims, params):
    """Batching rule shared by all collectives (used by transforms/vmap.py's table)."""
    (x,), (bdim,) = args, dims
    if bdim is None:
        return prim.bind(x, **params), None
    if bdim != 0:
        perm = [bdim] + [i for i in range(x.ndim) if i != bdim]
        x = lax.transpose(x, tuple(perm))
    new = dict(params)
    for name in batch_axis_params[prim]:
        new[name] = params[name] + 1
    if prim is exchange_p:
        n = x.shape[0]
        new["sends"] = tuple((d, ((0, n),) + tuple(b)) for d, b in params["sends"])
        new["recvs"] = tuple((s, ((0, n),) + tuple(b)) for s, b in params["recvs"])
        new["local"] = tuple(
            (((0, n),) + tuple(ib), ((0, n),) + tuple(ob)) for ib, ob in params["local"]
        )
        new["out_shape"] = (n,) + tuple(params["out_shape"])
    return prim.bind(x, **new), 0


ALL = (
    all_reduce_p,
    all_gather_p,
    reduce_scatter_p,
    all_to_all_p,
    shard_slice_p,
    shard_pad_p,
    keep_one_p,
    exchange_p,
)


def _batch_rule_for(prim):
    def rule(args, dims, **params):
        return collective_batch(prim, args, dims, params)

    return rule


def _register_vmap_rules():

    for prim in ALL:
        vmap_mod.batch_rules.setdefault(prim, _batch_rule_for(prim))


_register_vmap_rules()
