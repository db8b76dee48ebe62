"""From a planned global program to per-device SPMD programs, and running them.

`ShardedProgram` holds the global program, its placement and plan. For each
device it builds (once) a local program: every equation applied to the device's
local shapes (or its signature's local kernel), with boxing collectives inserted
where a consumer needs another SBP than its producer made. Printing a
ShardedProgram shows the global program with every var's SBP, every inserted
collective with its bytes, and the total bytes moved per call.
"""

import sys
import weakref

import numpy as np
from fflow.primitives.collectives import all_reduce_p, collective_phases
from fflow.primitives.sbp_constraint import sbp_constraint_p
from fflow.transforms import shard_fsdp
from fflow.transforms.shard_boxing import apply_boxing, plan_boxing
from fflow.transforms.shard_buckets import plan_buckets, schedule
from fflow.transforms.shard_plan import fixed_plan, plan_program
from fflow.transforms.shard_print import compare, explain, pp_sharded
from fflow.transforms.shard_rules import LocalCtx, apply_local
from fflow.transforms.staging import trace_to_program

from fflow import core
from fflow import sharding as sharding_mod
from fflow.array import Array, root_trace
from fflow.core import Eqn, Literal, Program, ShapedArray, Var
from fflow.sharding import B, GlobalValue, Sharding, local_box, runtime


class ShardedProgram:
    """A global program planned on a placement (the `sharded` param of shard_call)."""

    def __init__(
        self,
        program,
        pl,
        in_sbps,
        out_sbps,
        allow_partial_out=False,
        name="shard",
        sigs=None,
        plan_options=None,
    ):
        self.program = program  # what transformation rules see (grad, vmap, ...)
        self.placement = pl
        self.in_sbps = [tuple(s) for s in in_sbps]
        # what is planned and run: call-like equations (custom_jvp/vjp, checkpoint) are
        # inlined, since their rules only matter to transformations of `program`
        self.exec_program, self.var_map = inline_calls(program, pl)
        # the planner's profile / memory_limit (shard(..., profile=...)), kept for the
        # derived programs (jvp, transpose) of this one
        self.plan_options = dict(plan_options or {})
        if sigs is None:
            self.plan = plan_program(
                self.exec_program, pl, self.in_sbps, out_sbps, allow_partial_out,
                **self.plan_options,
            )  # fmt: skip
        else:  # a given signature per equation (tests of every signature use this)
            self.plan = fixed_plan(
                self.exec_program, pl, self.in_sbps, out_sbps, sigs,
                profile=self.plan_options.get("profile"),
            )  # fmt: skip
        self.out_sbps = self.plan.out_sbps
        self.requested_out = [None if s is None else tuple(s) for s in out_sbps]
        self.name = name
        self._locals = {}
        self._boxings = None
        self._out_shardings = None
        self._out_meta = None  # per output: shape, dtype, weak type, Sharding
        self._one = None  # (sim runtime, runner): one simulated device, no collectives
        self._fast = None  # (runtime, run_global for it, or None to take the general path)

    def sbp_of(self, v):
        """The planned SBP of a var of `program` (through the inlining)."""
        v = self.var_map.get(v, v)
        if type(v) is Literal:
            return (B,) * self.placement.ndim
        return self.plan.var_sbp[v]

    # -- inspection -------------------------------------------------------------
    @property
    def bytes(self):
        """Communication bytes per call (the cost model, equal to what runtimes measure)."""
        return self.plan.bytes

    def boxings(self):
        """[(where, var, src_sbp, dst_sbp, BoxingPlan)] for every conversion in the plan
        (a value converted once is shared by all consumers that need that SBP)."""
        if self._boxings is None:
            out = []
            seen = set()
            var_sbp = self.plan.var_sbp
            h = self.placement.hierarchy
            wants = [
                (k, v, want)
                for k, (eqn, sig) in enumerate(zip(self.exec_program.eqns, self.plan.eqn_sigs))
                for v, want in zip(eqn.inputs, sig.ins)
            ]
            outvars = self.exec_program.outvars
            wants += [("out", v, want) for v, want in zip(outvars, self.out_sbps)]
            for k, v, want in wants:
                have = _sbp(var_sbp, v, h)
                if have == want or (type(v) is not Literal and (v, want) in seen):
                    continue
                if type(v) is not Literal:
                    seen.add((v, want))
                bp = plan_boxing(v.aval.shape, v.aval.dtype, h, have, want)
                out.append((k, v, have, want, bp))
            self._boxings = out
        return self._boxings

    def collectives(self):
        """Names of all communicating and local boxing primitives, in program order."""
        names = []
        for *_, bp in self.boxings():
            names.extend(bp.collectives())
        return names

    def count(self, name):
        return sum(1 for n in self.collectives() if n == name)

    def explain(self, every=True):
        """The plan explained: totals, what annotations forced, per equation the chosen
        signature and its two best alternatives with costs (transforms/shard_print.py)."""
        return explain(self, every)

    def compare(self, other):
        """Where this plan and `other` (of the same program) differ, and their totals."""
        return compare(self, other)

    def __str__(self):
        text = pp_sharded(self)
        lines = bucket_lines(self.local_program(0))
        if lines:
            text += "\ngradient buckets (started when complete, waited where first used):\n"
            text += "\n".join("  " + line for line in lines)
        return text

    __repr__ = __str__

    def eager_conversions(self):
        """{var: SBP} converted right after it is computed (transforms/shard_fsdp.py)."""
        prob, idx = self.plan.problem, self.plan.sig_index
        eager = shard_fsdp.eager_conversions(prob, idx, prob.labels_of(idx))
        ids = {i: v for v, i in prob.vid.items()}
        return {ids[i]: prob.nd_of(c) for i, c in eager.items()}

    # -- per-device programs ----------------------------------------------------
    def local_program(self, flat):
        prog = self._locals.get(flat)
        if prog is None:
            prog = self._build_local(flat)
            self._locals[flat] = prog
        return prog

    def local_in_avals(self, flat):
        pl = self.placement
        coords = pl.coords(flat)
        return [
            ShapedArray(_local_shape(v.aval.shape, s, pl.hierarchy, coords), v.aval.dtype)
            for v, s in zip(self.program.invars, self.in_sbps)
        ]

    def _build_local(self, flat):
        pl = self.placement
        h = pl.hierarchy
        coords = pl.coords(flat)
        prog = self.exec_program
        plan = self.plan
        eager = self.eager_conversions()

        def device_fn(*xs):
            env = {}
            for v, x in zip(prog.invars, xs):
                env[v] = x
            for v, c in zip(prog.constvars, prog.consts):
                env[v] = c  # constants are broadcast: every device has the whole value

            boxed = {}

            def read(v, want):
                if type(v) is Literal:
                    x = np.asarray(v.value, v.aval.dtype)
                    have = (B,) * len(h)
                else:
                    x = env[v]
                    have = plan.var_sbp[v]
                if have != want:
                    hit = boxed.get((v, want)) if type(v) is not Literal else None
                    if hit is not None:
                        return hit
                    bp = plan_boxing(v.aval.shape, v.aval.dtype, h, have, want)
                    x = apply_boxing(x, bp, v.aval.shape, v.aval.dtype, pl, flat)
                    if type(v) is not Literal:
                        boxed[(v, want)] = x
                return x

            for eqn, sig in zip(prog.eqns, plan.eqn_sigs):
                ins = [read(v, want) for v, want in zip(eqn.inputs, sig.ins)]
                early = [v for v in eqn.outputs if v in eager]
                if eqn.primitive is sbp_constraint_p:
                    outs = ins
                else:
                    ctx = LocalCtx(
                        [
                            local_box(v.aval.shape, s, h, coords)
                            for v, s in zip(eqn.inputs, sig.ins)
                        ],
                        [
                            local_box(v.aval.shape, s, h, coords)
                            for v, s in zip(eqn.outputs, sig.outs)
                        ],
                        [v.aval for v in eqn.inputs],
                        [v.aval for v in eqn.outputs],
                        eqn.params,
                        sig.outs,
                    )
                    out = apply_local(eqn.primitive, sig, ctx, ins, eqn.params)
                    outs = out if eqn.primitive.multiple_results else [out]
                for v, o in zip(eqn.outputs, outs):
                    env[v] = o
                for v in early:  # a shrinking conversion, right away (shard_fsdp.py)
                    read(v, eager[v])
            return [read(v, want) for v, want in zip(prog.outvars, self.out_sbps)]

        with core.set_current_trace(_root()):
            return trace_to_program(device_fn, self.local_in_avals(flat))

    # -- running -------------------------------------------------------------------
    def run_shards(self, in_shards):
        """`in_shards[i]` maps flat device index -> local array of input i (this process)."""
        return runtime().execute(self, in_shards)

    def run_values(self, args):
        """Run on logical NumPy values; returns logical NumPy values (a shard_call
        inside a jitted program: no global arrays are made on the way)."""
        rt = runtime()
        pl = self.placement
        if pl.size == 1 and not hasattr(rt, "world"):  # one simulated device: run it
            run = plain_runner(self.local_program(0))
            if run is not None:
                return run([np.asarray(a) for a in args])
        in_shards = [
            rt.scatter(np.asarray(a, v.aval.dtype), s, pl)
            for a, v, s in zip(args, self.program.invars, self.in_sbps)
        ]
        out_shards = rt.execute(self, in_shards)
        if self._out_shardings is None:
            self._out_shardings = [Sharding(pl, s) for s in self.out_sbps]
        return [
            rt.assemble(GlobalValue(v.aval.shape, v.aval.dtype, sh, shards))
            for v, sh, shards in zip(self.program.outvars, self._out_shardings, out_shards)
        ]

    def _init_meta(self, rt):
        pl = self.placement
        self._out_meta = [
            (tuple(v.aval.shape), np.dtype(v.aval.dtype), v.aval.weak_type, Sharding(pl, s))
            for v, s in zip(self.program.outvars, self.out_sbps)
        ]
        one = pl.size == 1 and not hasattr(rt, "world") and plain_runner(self.local_program(0))
        self._one = (rt, one) if one else None
        return self._out_meta

    def global_runner(self):
        """`run_global`, or on one simulated device without collectives a closure over
        the compiled segment and the outputs' metadata (jit's executable for
        jit(shard(f)): no runtime dispatch per call)."""
        rt = runtime()
        meta = self._out_meta or self._init_meta(rt)
        one = self._one
        if one is None or one[0] is not rt:
            return self.run_global
        seg, run_global, of = one[1], self.run_global, GlobalValue.of
        fn = getattr(seg, "segment", None)
        if fn is not None and len(meta) == 1 and len(self.in_sbps) == 1:
            ((shape, dtype, weak, sh),) = meta

            def run1(args):  # one input, one output
                if sharding_mod._runtime is not rt:
                    return run_global(args)
                out = Array(of(shape, dtype, sh, {0: fn(args[0]._value.shards[0])[0]}), weak)
                out._sharding = sh
                return [out]

            return run1

        def run(args):
            if sharding_mod._runtime is not rt:  # the runtime was switched since
                return run_global(args)
            outs = []
            for (shape, dtype, weak, sh), r in zip(meta, seg([a._value.shards[0] for a in args])):
                out = Array(of(shape, dtype, sh, {0: r}), weak)
                out._sharding = sh
                outs.append(out)
            return outs

        return run

    def run_global(self, args):
        """Run on global Arrays already in `in_sbps`; returns global Arrays."""
        rt = runtime()
        fast = self._fast  # set by the runtime (runtime_mpi: a one-collective program)
        if fast is not None and fast[0] is rt:
            outs = fast[1](args)
            if outs is not None:
                return outs
        meta = self._out_meta or self._init_meta(rt)
        one = self._one
        if one is not None and one[0] is rt:  # one simulated device, no collectives
            out_shards = [{0: r} for r in one[1]([a._value.shards[0] for a in args])]
        else:
            out_shards = rt.execute(self, [a._value.shards for a in args])
        outs = []
        for (shape, dtype, weak, sh), shards in zip(meta, out_shards):
            out = Array(GlobalValue.of(shape, dtype, sh, shards), weak)
            out._sharding = sh
            outs.append(out)
        return outs


def _root():
    return root_trace


def _sbp(var_sbp, v, h):
    if type(v) is Literal:
        return (B,) * len(h)
    return var_sbp[v]


def _local_shape(shape, nd, hierarchy, coords):
    return tuple(b - a for a, b in local_box(shape, nd, hierarchy, coords))


# ----------------------------------------------------------------------------
# Inlining call-like equations


def _body(eqn, pl):
    if "sharded_call" in eqn.primitive.traits:
        inner = eqn.params["sharded"]
        return inner.program if inner.placement == pl else None
    if "call" not in eqn.primitive.traits:  # custom_jvp_call, custom_vjp_call, checkpoint
        return None
    body = eqn.params.get("program")
    if body is None or body.constvars or len(body.invars) != len(eqn.inputs):
        return None
    return body


def inline_calls(program, pl):
    """(program with call-like equations replaced by their bodies, {old var: new atom}).

    A nested sharded call on the same placement is inlined too, its input and output
    SBPs becoming `with_sbp` constraints.
    """
    if not any(_body(e, pl) is not None for e in program.eqns):
        return program, {}
    eqns = []

    def constrain(atoms, sbps):
        out = []
        for a, nd in zip(atoms, sbps):
            if type(a) is Literal:
                out.append(a)
                continue
            v = Var(a.aval)
            eqns.append(Eqn(sbp_constraint_p, [a], {"sbp": tuple(nd)}, [v]))
            out.append(v)
        return out

    def go(body_eqns, m, fresh):
        for e in body_eqns:
            ins = [v if type(v) is Literal else m.get(v, v) for v in e.inputs]
            body = _body(e, pl)
            if body is not None:
                nested = "sharded_call" in e.primitive.traits
                if nested:
                    ins = constrain(ins, e.params["sharded"].in_sbps)
                inner = dict(zip(body.invars, ins))
                inner.update(zip(body.constvars, body.constvars))
                go(body.eqns, inner, True)
                outs = [bo if type(bo) is Literal else inner.get(bo, bo) for bo in body.outvars]
                if nested:
                    outs = constrain(outs, e.params["sharded"].out_sbps)
                m.update(zip(e.outputs, outs))
                continue
            outs = e.outputs
            if fresh:
                outs = [Var(o.aval) for o in e.outputs]
                m.update(zip(e.outputs, outs))
            eqns.append(e.replace(inputs=ins, outputs=outs))

    mapping = {}
    go(program.eqns, mapping, False)
    outvars = [v if type(v) is Literal else mapping.get(v, v) for v in program.outvars]
    constvars, consts = list(program.constvars), list(program.consts)
    for e in program.eqns:  # constants of inlined sharded calls
        if "sharded_call" in e.primitive.traits and _body(e, pl) is not None:
            inner = e.params["sharded"].program
            constvars += inner.constvars
            consts += inner.consts
    new = Program(program.invars, constvars, eqns, outvars, consts)
    return new, mapping


# ----------------------------------------------------------------------------
# Executing one device's program: a generator that yields at each collective


def is_communicating(prim):
    return prim in collective_phases


def device_steps(prog, args):
    """Run `prog` on NumPy values; yields requests to the runtime, gets their results.

    Requests: `(prim, x, params)` a collective; `("start", prim, x, params, owned)`
    the all-reduce of a part of a gradient bucket started (the result is a handle;
    `owned`: nothing else refers to `x`, a packed copy or a gradient read here last, so
    it may be reduced in place); `("wait", handle)` its flat result; `("progress",)` a
    chance for MPI to progress while buckets are in flight (transforms/shard_buckets.py).
    The equations between two requests run as one compiled NumPy function (the jit
    backend's code generation), so a program on one device runs as fast as the
    unsharded jitted program.
    """
    stages = _stages(prog)
    drops = _drops(prog, stages)
    env = {v: np.asarray(c) for v, c in zip(prog.constvars, prog.consts)}
    for v, a in zip(prog.invars, args):
        env[v] = a
    handles = {}
    for n, (kind, item, ins, outs) in enumerate(stages):
        for v in drops[n]:  # read for the last time by the stage before: free it
            env.pop(v, None)  # (a bucket start may have taken it already)
        if live_probe is not None:
            live_probe(env)
        if kind == "collective":  # (host or device arrays)
            env[item.outputs[0]] = yield (item.primitive, _read(env, item.inputs[0]), item.params)
        elif kind == "start":  # one all-reduce per part (shard_buckets.Bucket.parts)
            handles[item.number] = parts = []
            for idx, x, owned in item.parts(_take(env, item, drops[n + 1])):
                parts.append((idx, (yield ("start", all_reduce_p, x, item.params, owned))))
            x = None
        elif kind == "wait":
            for idx, h in handles.pop(item.number):
                flat = yield ("wait", h)
                env.update(zip((item.members[k].outputs[0] for k in idx), item.unpack(flat, idx)))
        elif kind == "progress":
            yield ("progress",)
        else:  # (no name keeps a result: a bucket start checks who holds its inputs)
            env.update(zip(outs, item(*[_read(env, v) for v in ins])))
    return [_read(env, v) for v in prog.outvars]


def _take(env, bucket, last):
    """[(value, alone)] of a bucket's members' inputs; `alone`: this start is the last
    reader of the var and nothing else refers to its array (no view, no other var, not a
    caller's input), so its all-reduce may overwrite it. Such vars leave `env` here."""
    ins = [e.inputs[0] for e in bucket.members]
    if len(set(ins)) < len(ins):  # (one var twice: read, never taken)
        return [(_read(env, v), False) for v in ins]
    out = []
    for v in ins:
        if type(v) is Literal or v not in last or type(env[v]) is not np.ndarray:
            out.append((_read(env, v), False))
            continue
        x = env.pop(v)
        # references: `x` and getrefcount's argument; a view of x holds one more
        alone = x.base is None and x.flags.c_contiguous and sys.getrefcount(x) == 2
        out.append((x, alone))
    return out


# a test's hook: called with each device's live values before every stage
live_probe = None
_drop_cache = weakref.WeakKeyDictionary()


def _drops(prog, stages):
    """Per stage, the vars whose last reader is the stage before it (not outputs): the
    device frees them there, so a gathered parameter lives only until its last use."""
    hit = _drop_cache.get(prog)
    if hit is not None:
        return hit
    last = {}
    for n, (kind, item, ins, _) in enumerate(stages):
        if kind == "segment":
            reads = ins
        elif kind == "collective":
            reads = item.inputs[:1]
        elif kind == "start":
            reads = [e.inputs[0] for e in item.members]
        else:
            reads = ()
        for v in reads:
            if type(v) is not Literal:
                last[v] = n
    for v in prog.outvars:
        last.pop(v, None)
    drops = [[] for _ in range(len(stages) + 1)]
    for v, n in last.items():
        drops[n + 1].append(v)
    _drop_cache[prog] = drops
    return drops


def run_plain(prog, args):
    """Run a device program with no collectives straight through (no generator);
    None if it has collectives."""
    run = plain_runner(prog)
    return None if run is None else run(args)


_runner_cache = weakref.WeakKeyDictionary()  # program -> runner or False


def plain_runner(prog):
    """`args -> outputs` running device program `prog` as its one compiled segment, or
    None when it has collectives or constants (cached per program)."""
    hit = _runner_cache.get(prog)
    if hit is None:
        hit = _runner_cache[prog] = _make_runner(prog) or False
    return hit or None


def _make_runner(prog):
    stages = _stages(prog)
    if len(stages) != 1 or stages[0][0] != "segment" or prog.constvars:
        return None
    _, fn, ins, outs = stages[0]
    pos = {v: k for k, v in enumerate(prog.invars)}
    made = {v: k for k, v in enumerate(outs)}
    take = [pos[v] for v in ins]
    if list(prog.outvars) == list(outs):
        if take == list(range(len(prog.invars))):
            run = lambda args: list(fn(*args))  # noqa: E731
            run.segment = fn  # outputs = fn(*inputs) (global_runner calls it directly)
            return run
        return lambda args: list(fn(*[args[k] for k in take]))
    # outputs that are inputs or literals too
    where = [
        (2, v) if type(v) is Literal else (0, made[v]) if v in made else (1, pos[v])
        for v in prog.outvars
    ]

    def run(args):
        res = fn(*[args[k] for k in take])
        return [
            res[j] if kind == 0 else args[j] if kind == 1 else _read(None, j) for kind, j in where
        ]

    return run


def _read(env, v):
    return np.asarray(v.value, v.aval.dtype) if type(v) is Literal else env[v]


_stage_cache = weakref.WeakKeyDictionary()  # program -> stages (dies with the program)


def _stages(prog):
    hit = _stage_cache.get(prog)
    if hit is not None:
        return hit
    buckets = plan_buckets(prog)
    events = schedule(prog, buckets) if buckets else [("eqn", e) for e in prog.eqns]
    after = _needed_after(prog, events)
    stages = []
    seg = []
    in_flight = 0
    for i, (kind, item) in enumerate(events):
        if kind == "eqn" and item.primitive not in collective_phases:
            seg.append(item)
            continue
        if seg:
            stages.append(_segment(prog, seg, after[i]))
            seg = []
            if in_flight:
                stages.append(("progress", None, None, None))
        if kind == "eqn":
            stages.append(("collective", item, None, None))
        else:
            stages.append((kind, item, None, None))
            in_flight += 1 if kind == "start" else -1
    if seg:
        stages.append(_segment(prog, seg, set(v for v in prog.outvars if type(v) is not Literal)))
    _stage_cache[prog] = stages
    return stages


def bucket_lines(prog):
    """The gradient-bucket schedule of a device program, one line per bucket."""
    return [b.describe() for b in plan_buckets(prog)]


def _needed_after(prog, events):
    """For each event index i: the vars read by events i.. and by the outputs."""
    needed = set(v for v in prog.outvars if type(v) is not Literal)
    out = [None] * len(events)
    for i in range(len(events) - 1, -1, -1):
        kind, item = events[i]
        eqns = [item] if kind == "eqn" else item.members if kind == "start" else []
        for e in eqns:
            needed = needed | {v for v in e.inputs if type(v) is not Literal}
        out[i] = needed
    return out


def _segment(prog, eqns, needed_later):
    defined = set()
    ins = []
    consts = dict(zip(prog.constvars, prog.consts))
    cvars, cvals = [], []
    for eqn in eqns:
        for v in eqn.inputs:
            if type(v) is Literal or v in defined:
                continue
            if v in consts:
                if v not in cvars:
                    cvars.append(v)
                    cvals.append(consts[v])
            elif v not in ins:
                ins.append(v)
        defined.update(eqn.outputs)
    outs = [v for eqn in eqns for v in eqn.outputs if v in needed_later]
    sub = Program(ins, cvars, eqns, outs, cvals)
    return ("segment", _compile(sub), ins, outs)


def _compile(sub):
    try:
        from fflow.lowering.numpy_backend import compile_program  # lazy, as in jit

        return compile_program(sub, raw=True, name="fflow_shard_segment")
    except Exception:  # noqa: BLE001  (fall back to the reference implementations)
        return _interpret(sub)


def _interpret(sub):
    def run(*args):
        env = dict(zip(sub.constvars, (np.asarray(c) for c in sub.consts)))
        env.update(zip(sub.invars, args))
        for eqn in sub.eqns:
            out = eqn.primitive.impl(*[_read(env, v) for v in eqn.inputs], **eqn.params)
            outs = out if eqn.primitive.multiple_results else [out]
            for v, o in zip(eqn.outputs, outs):
                env[v] = np.asarray(o)
        return [_read(env, v) for v in sub.outvars]

    return run


# ----------------------------------------------------------------------------
# Eager boxing of global arrays = running the identity program with another out SBP

_identity_cache = {}
CACHE_LIMIT = 4096


def run_identity(x, pl, target):
    src = x._sharding.sbp
    key = (x.shape, x.dtype, pl, src, tuple(target))
    sp = _identity_cache.get(key)
    if sp is None:
        v = Var(ShapedArray(x.shape, x.dtype))
        prog = Program([v], [], [], [v])
        sp = ShardedProgram(prog, pl, [src], [tuple(target)], allow_partial_out=True)
        if len(_identity_cache) > CACHE_LIMIT:
            _identity_cache.clear()
        _identity_cache[key] = sp
    (out,) = sp.run_global([x])
    out._weak = x._weak
    return out
