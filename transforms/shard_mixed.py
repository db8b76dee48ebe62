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

from fflow.primitives.shard_move import shard_move_p
from fflow.transforms.shard import bind_call
from fflow.transforms.shard_exec import ShardedProgram
from fflow.transforms.shard_transfer import plan_transfer

from fflow import array as array_mod
from fflow.core import Literal, Program
from fflow.errors import user_error
from fflow.sharding import B, check_sbp_fits, is_global, to_global


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

    def __init__(self, program, pl, in_sbps, out_specs, plan_options=None, in_sources=None):
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
                            params = dict(dst=q, sbp=nd, src=src, src_sbp=src_sbp)
                            a = v.aval
                            tp = plan_transfer(a.shape, a.dtype, src, src_sbp, q, nd)
                            self.moves.append((tp, " (an input on another placement)"))
                            self.items.append(("move", v, key, params, tp))
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
            in_sbps = [sbp_of[v] for v in ins]
            for v in ins:
                sbp_of.pop(v) if v in free_sbp else None
            sp = ShardedProgram(
                sub, q, in_sbps, specs, name="segment",
                plan_options=plan_options or {},
            )  # fmt: skip
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
