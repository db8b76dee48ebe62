"""One sharded program over several placements: cut at `with_sbp(..., placement=)`.

`shard(f, pl)` traces `f`; where `f` moves a value to another placement
(`with_sbp(x, sbp, placement=other)` binds `shard_move`), the program is cut into
segments, each a run of equations on one placement planned as its own
`ShardedProgram`, with the moves between them. Each equation's placement is that
of its inputs (inputs of the program: `pl`; a move's output: its target); an
equation without inputs (a constant) goes where its first user is. A move is a
boxing between placements: its bytes come from the transfer plan
(transforms/shard_transfer.py) and show in the printed plan, and it runs as
point-to-point sends (simulated devices or MPI buffers). The cut program runs as
plain `shard_call` / `shard_move` binds, so `grad`, `jit` and `linearize` go
through their rules (the cotangent of a move moves back).
"""

import itertools

from fflow.primitives.sbp_constraint import sbp_constraint_p
from fflow.primitives.shard_move import shard_move_p
from fflow.transforms.shard import bind_call
from fflow.transforms.shard_exec import ShardedProgram
from fflow.transforms.shard_transfer import plan_transfer

from fflow import array as array_mod
from fflow.core import Literal, Program
from fflow.errors import user_error
from fflow.sharding import B, Split, check_sbp_fits, is_global, to_global


def _fits(v, nd, q):
    try:
        check_sbp_fits(v.aval.shape, nd, q.hierarchy, "in_sbp")
    except Exception:  # noqa: BLE001  (an SBP for another mesh: broadcast there)
        return False
    return True


def _where(eqn):
    info = getattr(eqn, "source_info", None)
    return f" (at {info})" if info else ""


def _placements(program, pl):
    """The placement of every equation (a move: None) and of every var."""
    eqns = program.eqns
    place = {}  # program inputs are placed where they are used (see MixedProgram)
    eqn_pl = [None] * len(eqns)
    for i, e in enumerate(eqns):
        if e.primitive is shard_move_p:
            place[e.outputs[0]] = e.params["dst"]
            continue
        pls = []
        for v in e.inputs:
            q = place.get(v) if type(v) is not Literal else None
            if q is not None and q not in pls:
                pls.append(q)
        if len(pls) > 1:
            raise user_error(
                ValueError,
                f"{e.primitive.name}{_where(e)} uses values on two placements ({pls[0]} and "
                f"{pls[1]}). Fix: move one of them first with "
                "fflow.with_sbp(x, sbp, placement=...).",
            )
        if pls:
            eqn_pl[i] = pls[0]
            for o in e.outputs:
                place[o] = pls[0]
    # equations without placed inputs (constants) go where their first user is
    users = {}
    for j, e in enumerate(eqns):
        for v in e.inputs:
            if type(v) is not Literal:
                users.setdefault(v, []).append(j)
    for i in reversed(range(len(eqns))):
        e = eqns[i]
        if e.primitive is shard_move_p or eqn_pl[i] is not None:
            continue
        q = pl
        for j in sorted(k for o in e.outputs for k in users.get(o, [])):
            if eqns[j].primitive is not shard_move_p and eqn_pl[j] is not None:
                q = eqn_pl[j]
                break
        eqn_pl[i] = q
        for o in e.outputs:
            place[o] = q
    return eqn_pl, place


class MixedProgram:
    """Segments (ShardedProgram per placement run) and the moves between them."""

    is_mixed = True

    def __init__(
        self, program, pl, in_sbps, out_specs, plan_options=None, in_sources=None, free_inputs=None
    ):
        self.program = program
        self.placement = pl
        self.in_sbps = list(in_sbps)
        eqn_pl, place = _placements(program, pl)
        consts = dict(zip(program.constvars, program.consts))
        # cut into items: ("seg", placement, [eqns]) or ("move", eqn)
        items = []
        for e, q in zip(program.eqns, eqn_pl):
            if e.primitive is shard_move_p:
                items.append(["move", e])
            elif items and items[-1][0] == "seg" and items[-1][1] == q:
                items[-1][2].append(e)
            else:
                items.append(["seg", q, [e]])
        later = _used_later(items, program.outvars)
        sbp_of = {}
        moved = set()
        free_sbp = dict(zip(program.invars, self.in_sbps))  # inputs: placed where used
        # where each input lives: a global array on another placement (placement, sbp);
        # others start on `pl` in their in_sbp. An input read on another placement moves.
        source = {v: (pl, free_sbp[v]) for v in program.invars}
        elsewhere = set()  # global arrays: they move to where they are used
        for v, s in zip(program.invars, in_sources or ()):
            if s is not None:
                source[v] = (s[0], tuple(s[1]))
                elsewhere.add(v)
        self.in_sources = [None if source[v][0] == pl else source[v] for v in program.invars]
        out_spec = dict(zip(program.outvars, out_specs))
        # inputs living elsewhere whose SBP neither the user nor their array fixed: the
        # SBP they arrive in is chosen by cost (with_sbp moves: where the value leaves)
        free_in = {v for v, f in zip(program.invars, free_inputs or ()) if f}
        move_dst = {}  # value -> [(placement, sbp)] it is moved to by with_sbp
        for e in program.eqns:
            if e.primitive is shard_move_p and type(e.inputs[0]) is not Literal:
                move_dst.setdefault(e.inputs[0], []).append((e.params["dst"], e.params["sbp"]))
        self.items = []
        self.moves = []  # (TransferPlan, source line) per move, for the printed plan
        for k, item in enumerate(items):
            if item[0] == "move":
                e = item[1]
                x = e.inputs[0]
                src = place.get(x, pl) if type(x) is not Literal else None
                if x in free_sbp:  # an input moved straight away: from where it lives
                    src, sbp_of[x] = source[x]
                if src is None or x not in sbp_of:
                    src_sbp = None
                else:
                    src_sbp = sbp_of[x]
                params = dict(e.params, src=src, src_sbp=src_sbp)
                sbp_of[e.outputs[0]] = e.params["sbp"]
                tp = None
                if src is not None and src_sbp is not None:
                    a = x.aval
                    tp = plan_transfer(a.shape, a.dtype, src, src_sbp, params["dst"], params["sbp"])
                    self.moves.append((tp, _where(e)))
                self.items.append(("move", x, e.outputs[0], params, tp))
                continue
            _, q, eqns = item
            defined = {o for e in eqns for o in e.outputs}
            ins, cvars, keys = [], [], []
            arrivals = []  # (input, key, source placement, source SBP) moved here
            for e in eqns:
                for v in e.inputs:
                    if type(v) is Literal or v in defined or v in ins or v in cvars:
                        continue
                    if v in consts:
                        cvars.append(v)
                        continue
                    if v in free_sbp:
                        src, src_sbp = source[v]
                        if v not in elsewhere:  # a local value: placed where it is used
                            src = q
                        nd = src_sbp if src == q else free_sbp[v]
                        nd = nd if len(nd) == q.ndim and _fits(v, nd, q) else (B,) * q.ndim
                        sbp_of[v] = nd
                        ins.append(v)
                        keys.append(v)
                        if src != q:  # a global input living elsewhere: move it here
                            key = ("moved", v, q)
                            keys[-1] = key
                            if key in moved:
                                continue
                            moved.add(key)
                            arrivals.append((v, key, src, src_sbp))
                        continue
                    if place.get(v) != q:
                        raise user_error(
                            ValueError,
                            f"{e.primitive.name}{_where(e)} runs on {q} but reads a value on "
                            f"{place.get(v)}. Fix: move it with "
                            "fflow.with_sbp(x, sbp, placement=...).",
                        )
                    ins.append(v)
                    keys.append(v)
            outs = [v for v in dict.fromkeys(o for e in eqns for o in e.outputs) if v in later[k]]
            specs = [out_spec.get(v) for v in outs]
            specs = [s if s is not None and len(s) == q.ndim else None for s in specs]
            sub = Program(ins, cvars, eqns, outs, [consts[c] for c in cvars])
            seg = _Segment(sub, q, [sbp_of[v] for v in ins], specs, plan_options)
            for v, _key, src, src_sbp in arrivals:
                seg.arrive(ins.index(v), src, src_sbp, free=v in free_in)
            pinned = {o for e in eqns if e.primitive is sbp_constraint_p for o in e.outputs}
            for i, v in enumerate(outs):
                if v in move_dst and specs[i] is None:
                    seg.leave(i, move_dst[v], free=v not in pinned)
            sp = seg.choose()
            for v, key, src, src_sbp in arrivals:
                nd = tuple(sp.in_sbps[ins.index(v)])
                params = dict(dst=q, sbp=nd, src=src, src_sbp=src_sbp)
                a = v.aval
                tp = plan_transfer(a.shape, a.dtype, src, src_sbp, q, nd)
                self.moves.append((tp, " (an input on another placement)"))
                self.items.append(("move", v, key, params, tp))
            for v in ins:
                sbp_of.pop(v) if v in free_sbp else None
            for v, s in zip(outs, sp.out_sbps):
                sbp_of[v] = tuple(s)
            self.items.append(("seg", keys, outs, sp))
        for v in program.outvars:
            if v in free_sbp and v not in sbp_of:
                sbp_of[v] = source[v][1]
        self.out_sbps = [sbp_of.get(v) if type(v) is not Literal else None for v in program.outvars]

    @property
    def segments(self):
        return [it[3] for it in self.items if it[0] == "seg"]

    @property
    def move_bytes(self):
        return sum(tp.bytes for tp, _ in self.moves)

    @property
    def time(self):
        """Estimated seconds of one call: the segments' plans and the moves
        (`move_time`), on the segments' device profile."""
        segs = self.segments
        profile = segs[0].plan.profile if segs else None
        return sum(sp.plan.time for sp in segs) + sum(
            move_time(tp, profile) for tp, _ in self.moves
        )

    @property
    def bytes(self):
        """Bytes moved by one call: the segments' boxing plus the moves."""
        return sum(sp.bytes for sp in self.segments) + self.move_bytes

    def run(self, args):
        """Run at the current trace: shard_call per segment, shard_move per move."""
        env = dict(zip(self.program.invars, args))

        def read(v):
            return v.val if type(v) is Literal else env[v]  # a var, or ("moved", v, q)

        for item in self.items:
            if item[0] == "move":
                _, x, y, params, _ = item
                env[y] = shard_move_p.bind(read(x), **params)
            else:
                _, ins, outs, sp = item
                env.update(zip(outs, bind_call(sp, [read(v) for v in ins])))
        return [read(v) for v in self.program.outvars]

    def __str__(self):
        lines = [f"mixed-placement program: {len(self.segments)} segments, "
                 f"{len(self.moves)} moves, {self.bytes} B moved"]  # fmt: skip
        for item in self.items:
            if item[0] == "seg":
                sp = item[3]
                lines.append(f"-- segment on {sp.placement} ({sp.bytes} B of boxing)")
                lines.append(str(sp))
            else:
                p, tp = item[3], item[4]
                a = item[1].aval if type(item[1]) is not Literal else None
                what = f"{a.dtype.name}{list(a.shape)}" if a is not None else "literal"
                size = f": {tp.describe()}" if tp is not None else ""
                lines.append(f"-- move {what} to {p['dst']} {p['sbp']}{size}")
        return "\n".join(lines)


class _Segment:
    """One placement's run of equations, planned with the SBPs its moves cost least
    with. A value moved in or out whose SBP is free (an input on another placement
    that neither `in_sbp` nor its array fixed; a value a with_sbp moves out that no
    with_sbp pins here) is tried in each SBP that fits, one after another: the
    segment is planned with it and the total is the plan's time plus each move's
    (`move_time`); one at least 1% cheaper replaces the first choice (an input's own
    SBP, the planner's free pick for an output)."""

    def __init__(self, program, q, in_sbps, out_specs, plan_options):
        self.program, self.q = program, q
        self.in_sbps, self.out_specs = list(in_sbps), list(out_specs)
        self.plan_options = plan_options or {}
        self.arrivals = []  # (input index, source placement, source sbp)
        self.leaving = []  # (output index, [(placement, sbp)])
        self.free = []  # ("in"|"out", index)

    def arrive(self, i, src, src_sbp, free):
        self.arrivals.append((i, src, src_sbp))
        if free:
            self.free.append(("in", i))

    def leave(self, i, dests, free):
        self.leaving.append((i, dests))
        if free:
            self.free.append(("out", i))

    def _build(self):
        sp = ShardedProgram(
            self.program, self.q, self.in_sbps, self.out_specs, name="segment",
            plan_options=self.plan_options,
        )  # fmt: skip
        profile = sp.plan.profile
        cost = sp.plan.time
        for i, src, src_sbp in self.arrivals:
            a = self.program.invars[i].aval
            tp = plan_transfer(a.shape, a.dtype, src, src_sbp, self.q, self.in_sbps[i])
            cost += move_time(tp, profile)
        for i, dests in self.leaving:
            a = self.program.outvars[i].aval
            for dst, nd in dests:
                tp = plan_transfer(a.shape, a.dtype, self.q, sp.out_sbps[i], dst, nd)
                cost += move_time(tp, profile)
        return sp, cost

    def choose(self):
        best, cost = self._build()
        for kind, i in self.free:
            seq = self.in_sbps if kind == "in" else self.out_specs
            var = (self.program.invars if kind == "in" else self.program.outvars)[i]
            keep = seq[i]
            for nd in _candidates(var, self.q):
                if kind == "in" and nd == keep:
                    continue
                seq[i] = nd
                sp, c = self._build()
                if c < cost * 0.99:  # ties keep the SBP the value has (no reshaping)
                    best, cost, keep = sp, c, nd
            seq[i] = keep
        return best


def _candidates(v, q):
    """The SBPs without partial sums that fit `v` on placement `q`."""
    options = [B] + [Split(k) for k in range(len(v.aval.shape))]
    out = []
    for nd in itertools.product(options, repeat=q.ndim):
        if _fits(v, nd, q):
            out.append(tuple(nd))
    return out


def move_time(tp, profile):
    """Seconds of a TransferPlan on `profile`: the partial values' reduction on the
    source, then each source device's messages one after another (devices at once)."""
    t = 0.0
    if tp.pre_bytes:
        t += profile.latency_of(0) + tp.pre_bytes / tp.src_pl.size / profile.bandwidth_of(0)
    sent, count = {}, {}
    for m in tp.messages:
        if tp.src_pl.ranks[m.src] != tp.dst_pl.ranks[m.dst]:
            sent[m.src] = sent.get(m.src, 0) + m.nbytes
            count[m.src] = count.get(m.src, 0) + 1
    if sent:
        t += max(count.values()) * profile.latency_of(0)
        t += max(sent.values()) / profile.bandwidth_of(0)
    return t


def _used_later(items, outvars):
    """Per item: the vars read by later items or returned."""
    need = set(v for v in outvars if type(v) is not Literal)
    out = [None] * len(items)
    for k in reversed(range(len(items))):
        out[k] = set(need)
        item = items[k]
        eqns = [item[1]] if item[0] == "move" else item[2]
        for e in eqns:
            need.update(v for v in e.inputs if type(v) is not Literal)
    return out


def _move_dispatch(prim, args, params):
    # a move of a global array at the root trace: point-to-point transfer
    if prim is not shard_move_p:
        return NotImplemented
    (x,) = args
    if is_global(x):
        return to_global(x, params["dst"], params["sbp"])
    return to_global(x, params["dst"], params["sbp"])


if _move_dispatch not in array_mod.special_dispatch:
    array_mod.special_dispatch.insert(0, _move_dispatch)
