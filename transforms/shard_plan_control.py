"""SBP signatures for `scan`, `while_loop` and `cond` whose bodies run without
communication (for loops, a fixpoint over the carry's SBP).

The runtimes exchange data only at collectives of a device's top-level program, so a
loop body cannot communicate. A scan still runs split when some SBPs of its operands
let every device run the body on its own pieces: each body equation then takes a
signature whose inputs are exactly what their producers give (no conversion at all),
and the body gives the carry back in the SBP it received. Scans of up to 64 steps are
unrolled before planning (transforms/shard_unroll.py); these signatures are what a
longer scan gets: gradient accumulation over micro-batches whose batch dimension is
split keeps its gradients partial through the loop (one all-reduce after it), and a
recurrence on split state stays split.

The search: from a few seeds (the scanned-over inputs split along their first
per-step dimension, or the carry split along its first dimension; constants
broadcast), plan the body (the planner itself, outputs free and partial sums allowed),
set the carry to the SBP the body gives it back, and repeat until it stays the same.
A seed is kept when the final body plan moves no bytes (its conversions are local:
slicing a broadcast value, or making a sum partial): the scan's signature is
(constants, carry, xs) -> (carry, ys) with each stacked output split one dimension
further out than the body's per-step output.
"""

import itertools

import numpy as np
from fflow.primitives.scan import scan_p
from fflow.transforms.shard_rules import LocalCtx, Sig, _fits, apply_local
from fflow.transforms.staging import trace_to_program

from fflow import core
from fflow import lax_ops as lax
from fflow.array import root_trace
from fflow.core import Literal, ShapedArray
from fflow.sbp import B, Split, local_box

MAX_ROUNDS = 4  # carry SBP updates before a seed is given up
MAX_BODY_EQNS = 2000  # bodies larger than this are not planned (the scan runs whole)


class _Mesh:
    """What the planner needs of a placement: its hierarchy (and a device type)."""

    type = "cpu"

    def __init__(self, hierarchy):
        self.hierarchy = tuple(hierarchy)
        self.ndim = len(self.hierarchy)
        self.size = int(np.prod(self.hierarchy))


def _shift(nd, by):
    """An N-D SBP with every split moved `by` dimensions (stacking: +1, slicing: -1)."""
    return tuple(Split(s.axis + by) if s.is_split() else s for s in nd)


def _seeds(consts, carry, xs, nd):
    bcast = (B,) * nd
    split0 = (Split(0),) * nd
    split1 = (Split(1),) * nd
    seeds = []
    if xs and all(a.ndim >= 2 for a in xs):
        seeds.append(([bcast] * len(consts), [bcast] * len(carry), [split1] * len(xs)))
        if carry and all(a.ndim >= 1 for a in carry):
            seeds.append(([bcast] * len(consts), [split0] * len(carry), [split1] * len(xs)))
    if carry and all(a.ndim >= 1 for a in carry):
        seeds.append(([bcast] * len(consts), [split0] * len(carry), [bcast] * len(xs)))
    return seeds


def scan_signatures(eqn, hierarchy, profile, plan_fn):
    """Extra N-D signatures of a scan equation (each with its per-device kernel), found by
    the fixpoint above; `plan_fn` is the planner's `plan_program`."""
    p = eqn.params
    body = p["jaxpr"]
    if len(body.eqns) > MAX_BODY_EQNS or all(x == 1 for x in hierarchy):
        return []
    nc, nk = p["num_consts"], p["num_carry"]
    avals = [v.aval for v in eqn.inputs]
    consts, carry, xs = avals[:nc], avals[nc : nc + nk], avals[nc + nk :]
    mesh = _Mesh(hierarchy)
    sigs = []
    for c_sbp, k_sbp, x_sbp in _seeds(consts, carry, xs, len(hierarchy)):
        ins_ok = all(_fits(a, s, mesh.hierarchy) for a, s in zip(avals, c_sbp + k_sbp + x_sbp))
        if not ins_ok:
            continue
        for _ in range(MAX_ROUNDS):
            body_in = c_sbp + k_sbp + [_shift(s, -1) for s in x_sbp]
            if not all(_fits(v.aval, s, mesh.hierarchy) for v, s in zip(body.invars, body_in)):
                break
            plan = plan_fn(body, mesh, body_in, [None] * len(body.outvars), True, profile=profile)
            out = [tuple(s) for s in plan.out_sbps]
            if out[:nk] != [tuple(s) for s in k_sbp]:
                k_sbp = out[:nk]  # the carry as the body gives it back: try again from there
                if not all(_fits(a, s, mesh.hierarchy) for a, s in zip(carry, k_sbp)):
                    break
                continue
            if not _local_only(plan):
                break
            ins = tuple(tuple(s) for s in c_sbp + k_sbp + x_sbp)
            outs = tuple(out[:nk]) + tuple(_shift(s, 1) for s in out[nk:])
            kernel = _LocalLoop(scan_p, {"jaxpr": (body, plan)}, p, mesh.hierarchy, ins)
            sig = Sig(ins, outs, kernel)
            if all(sig.ins != s.ins or sig.outs != s.outs for s in sigs):
                sigs.append(sig)
            break
    return sigs


def while_signatures(eqn, hierarchy, profile, plan_fn):
    """Extra N-D signatures of a while_loop: its array carries split along dim 0 (scalars
    broadcast), constants broadcast, then the carry's fixpoint as for scan; kept when
    the body moves no bytes and the condition computes its broadcast predicate from
    what each device holds."""
    p = eqn.params
    cond, body = p["cond_jaxpr"], p["body_jaxpr"]
    if len(body.eqns) + len(cond.eqns) > MAX_BODY_EQNS or all(x == 1 for x in hierarchy):
        return []
    ncc, nbc = p["cond_nconsts"], p["body_nconsts"]
    avals = [v.aval for v in eqn.inputs]
    carry = avals[ncc + nbc :]
    nd = len(hierarchy)
    mesh = _Mesh(hierarchy)
    bcast = (B,) * nd
    k_sbp = [(Split(0),) * nd if a.ndim >= 1 else bcast for a in carry]
    if all(s == bcast for s in k_sbp):
        return []
    cc, bc = [bcast] * ncc, [bcast] * nbc
    for _ in range(MAX_ROUNDS):
        if not all(_fits(a, s, mesh.hierarchy) for a, s in zip(carry, k_sbp)):
            return []
        plan = plan_fn(body, mesh, bc + k_sbp, [None] * len(body.outvars), True, profile=profile)
        out = [tuple(s) for s in plan.out_sbps]
        if out == [tuple(s) for s in k_sbp]:
            break
        k_sbp = out
    else:
        return []
    cplan = plan_fn(cond, mesh, cc + k_sbp, [bcast], True, profile=profile)
    if not (_local_only(plan) and _local_only(cplan)):
        return []
    ins = tuple(tuple(s) for s in cc + bc + k_sbp)
    progs = {"cond_jaxpr": (cond, cplan), "body_jaxpr": (body, plan)}
    kernel = _LocalLoop(eqn.primitive, progs, p, mesh.hierarchy, ins)
    return [Sig(ins, tuple(tuple(s) for s in k_sbp), kernel)]


def cond_signatures(eqn, hierarchy, profile, plan_fn):
    """Extra N-D signature of a cond (switch): the operands of one leading dim size split
    along it (largest first), the index and the rest broadcast; kept when every branch
    runs on those pieces without moving bytes and gives its outputs in common SBPs."""
    branches = eqn.params["branches"]
    if sum(len(b.eqns) for b in branches) > MAX_BODY_EQNS or all(x == 1 for x in hierarchy):
        return []
    ops = [v.aval for v in eqn.inputs[1:]]
    nd = len(hierarchy)
    mesh = _Mesh(hierarchy)
    bcast, split0 = (B,) * nd, (Split(0),) * nd
    # seeds: the operands sharing a leading dim size split along it (rows of a batch
    # and what was computed from them), the others broadcast
    sizes = sorted({a.shape[0] for a in ops if a.ndim >= 1}, reverse=True)
    for size in sizes:
        o_sbp = [split0 if a.ndim >= 1 and a.shape[0] == size else bcast for a in ops]
        if not all(_fits(a, s, mesh.hierarchy) for a, s in zip(ops, o_sbp)):
            continue
        free = [
            [
                tuple(x)
                for x in plan_fn(
                    b, mesh, o_sbp, [None] * len(b.outvars), True, profile=profile
                ).out_sbps
            ]
            for b in branches
        ]
        # output SBPs every branch can give: one branch's free choice, or partial
        # wherever some branch holds a partial sum (the others pad theirs locally)
        merged = [
            next((x for x in col if any(s.is_partial() for s in x)), col[0]) for col in zip(*free)
        ]
        for outs in [merged] + free:
            plans = [plan_fn(b, mesh, o_sbp, outs, True, profile=profile) for b in branches]
            if all(_local_only(pl_) for pl_ in plans):
                ins = (bcast,) + tuple(tuple(s) for s in o_sbp)
                progs = {"branches": list(zip(branches, plans))}
                kernel = _LocalLoop(eqn.primitive, progs, eqn.params, mesh.hierarchy, ins)
                return [Sig(ins, tuple(outs), kernel)]
    return []


def _local_only(plan):
    """Whether every conversion of the plan is a local one (no bytes move; no partial
    max or min, whose identity is not zero)."""
    prob = plan.problem
    have = prob.labels_of(plan.sig_index)
    for i, h, w in prob.conversions(plan.sig_index, have):
        if prob.bbytes(i, h, w):
            return False
        if any(x.is_partial() and x.op != "sum" for x in prob.nd_of(w)):
            return False
    return True


def _box_shape(box):
    return tuple(b - a for a, b in box)


def local_convert(x, shape, have, want, hierarchy, coords):
    """Device `coords`' piece of a value under `want`, from its piece under `have`, when
    no other device's data is needed: the part of its piece that `want` keeps, placed
    in zeros where `want` is a partial sum (on a partial-sum axis where the value was
    whole, only the first device keeps it)."""
    if have == want:
        return x
    hb = local_box(shape, have, hierarchy, coords)
    tb = local_box(shape, want, hierarchy, coords)
    lo = [max(a, c) for (a, _), (c, _) in zip(hb, tb)]
    hi = [min(b, d) for (_, b), (_, d) in zip(hb, tb)]
    keep = all(
        coords[m] == 0
        for m, (h, w) in enumerate(zip(have, want))
        if w.is_partial() and not h.is_partial() and not h.is_split()
    )
    if not keep or any(l >= u for l, u in zip(lo, hi)):
        return lax.full(_box_shape(tb), 0, x.dtype)
    part = lax.slice(x, [l - a for l, (a, _) in zip(lo, hb)], [u - a for u, (a, _) in zip(hi, hb)])
    pads = [(l - c, d - u, 0) for l, u, (c, d) in zip(lo, hi, tb)]
    if any(p != (0, 0, 0) for p in pads):
        part = lax.pad(part, np.zeros((), x.dtype), pads)
    return part


class _LocalLoop:
    """The per-device kernel of a split loop: the same loop primitive over programs made
    of each equation's local kernel under that program's plan (built once per device).
    `progs`: {param name: (program, plan), or a list of them for a tuple param}."""

    def __init__(self, prim, progs, params, hierarchy, in_sbps):
        self.prim = prim
        self.progs = progs
        self.params = params
        self.h = hierarchy
        self.in_sbps = in_sbps
        self._built = {}

    def __call__(self, ctx, *xs):
        key = tuple(tuple(map(tuple, b)) for b in ctx.in_boxes)
        local = self._built.get(key)
        if local is None:
            coords = self._coords(ctx)
            local = {}
            for k, pair in self.progs.items():  # one (program, plan), or a tuple of them
                if isinstance(pair, list):
                    local[k] = tuple(_local_program(g, pl_, self.h, coords) for g, pl_ in pair)
                else:
                    local[k] = _local_program(*pair, self.h, coords)
            self._built[key] = local
        return self.prim.bind(*xs, **dict(self.params, **local))

    def _coords(self, ctx):
        """Mesh coordinates of a device holding these input boxes (devices holding the
        same boxes run the same local programs)."""
        for coords in itertools.product(*[range(n) for n in self.h]):
            if all(
                tuple(map(tuple, local_box(a.shape, s, self.h, coords))) == tuple(map(tuple, b))
                for a, s, b in zip(ctx.in_avals, self.in_sbps, ctx.in_boxes)
            ):
                return coords
        raise AssertionError("shard: a loop's input boxes match no device")


def _local_program(body, plan, h, coords):
    """Device `coords`' program of `body` under `plan` (local conversions only)."""

    def box(v, nd):
        return local_box(v.aval.shape, nd, h, coords)

    local_in = [
        ShapedArray(_box_shape(box(v, plan.var_sbp[v])), v.aval.dtype, v.aval.weak_type)
        for v in body.invars
    ]

    def device_fn(*xs):
        env = dict(zip(body.invars, xs))
        env.update(zip(body.constvars, body.consts))

        def read(v, want):
            if type(v) is Literal:
                x, have = np.asarray(v.value, v.aval.dtype), (B,) * len(h)
            else:
                x, have = env[v], plan.var_sbp[v]
            return local_convert(x, v.aval.shape, have, want, h, coords)

        for e, sig in zip(body.eqns, plan.eqn_sigs):
            ctx = LocalCtx(
                [box(v, s) for v, s in zip(e.inputs, sig.ins)],
                [box(v, s) for v, s in zip(e.outputs, sig.outs)],
                [v.aval for v in e.inputs],
                [v.aval for v in e.outputs],
                e.params,
                sig.outs,
            )
            xs = [read(v, w) for v, w in zip(e.inputs, sig.ins)]
            out = apply_local(e.primitive, sig, ctx, xs, e.params)
            env.update(zip(e.outputs, out if e.primitive.multiple_results else [out]))
        return [read(v, w) for v, w in zip(body.outvars, plan.out_sbps)]

    with core.set_current_trace(root_trace):
        return trace_to_program(device_fn, local_in)
