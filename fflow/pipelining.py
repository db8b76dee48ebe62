"""`fflow.pipeline`: stages on device subsets, micro-batch schedules, 3-D parallelism.

`pipeline(stages, placements, num_microbatches, schedule)` returns a function
`(params_list, batch) -> loss`. The batch is cut into micro-batches along axis 0;
stage i runs `stages[i](params_list[i], x)` on `placements[i]` (sharded inside by
`in_sbp[i]`, so data x tensor parallel stages make 3-D parallelism); activations
move between placements by point-to-point boxing (transforms/shard_transfer.py)
and the last stage's losses are averaged over the micro-batches.

Each stage is traced once and compiled as sharded programs: its forward, its
training forward (outputs and the residuals of its linearization, kept between the
micro-batch's F and B) and its backward (the transposed linear program: B does not
recompute the forward; a stage wrapped in `fflow.checkpoint` saves only its inputs
and recomputes, when memory matters more). `grad`/`value_and_grad` of the
pipeline run the training schedule (primitives/pipeline_call.py): every rank walks
the same list of operations in tick order and does the ones on its devices;
transfers are started when their value is made (MPI: buffer Isend/Irecv) and
waited on when it is used, so the ranks of other stages compute meanwhile.
Parameter gradients stay partial across micro-batches and are reduced once per
step (the data-parallel all-reduce happens once, not once per micro-batch).
"""

import numpy as np

from fflow import array as array_mod
from fflow import core
from fflow.core import Program
from fflow.errors import user_error
from fflow.pipeline_schedule import Schedule
from fflow.pipeline_step import Step, _dummy
from fflow.primitives.pipeline_call import pipeline_call_p
from fflow.sharding import (
    B,
    P,
    is_global,
    local_shape,
    placement,
    to_global,
)
from fflow.transforms import shard as shard_mod
from fflow.transforms.autodiff import Zero, backward_pass, instantiate, linearize_flat
from fflow.tree_util import tree_flatten, tree_unflatten


def _is_float(dtype):
    dtype = np.dtype(dtype)
    return dtype.kind in "fc" or dtype.name == "bfloat16"


class _Stage:
    """Stage s compiled for one (params tree, input tree): three sharded programs.

    `fwd` (inference), `fwd_res` (training: the outputs and the residuals of the
    stage's linearization, saved until the micro-batch's B) and the backward (the
    transposed linear program, fed the parameters, the residuals and the output
    cotangents: no recomputation of the forward, unless the stage asks for it with
    `fflow.checkpoint`, whose residuals are its inputs)."""

    def __init__(self, fn, pl, p_tree, x_tree, p_sbps, x_sbps, p_avals, x_avals):
        self.pl = pl
        self.p_sbps, self.x_sbps = p_sbps, x_sbps
        self.x_float = [_is_float(a.dtype) for a in x_avals]
        store = self._store = {}

        def fwd(p_list, x_list):
            out = fn(tree_unflatten(p_tree, p_list), tree_unflatten(x_tree, x_list))
            leaves, store["tree"] = tree_flatten(out)
            return leaves

        self.fwd_fn = fwd
        self.fwd = shard_mod.shard(fwd, pl, in_sbp=(p_sbps, x_sbps))
        p_dummies = [_dummy(a) for a in p_avals]
        x_dummies = [_dummy(a) for a in x_avals]
        plan = self.fwd.lower(p_dummies, x_dummies)  # traces once: the output tree
        self.out_tree = store["tree"]
        n_in = len(p_avals) + len(x_avals)
        self.fwd_sp = plan if len(plan.program.invars) == n_in else None
        self._p_avals, self._x_avals = p_avals, x_avals
        self.p_avals = p_avals
        # the backward's SBPs. Gradients come out partial on the data-parallel mesh axes
        # (where the stage's input is split and the parameter replicated), so
        # micro-batches accumulate without communication and the step reduces them
        # once; input cotangents come out in the inputs' SBPs
        xf_sbps = [s for s, f in zip(x_sbps, self.x_float) if f]
        dp_axes = {a for nd in xf_sbps for a, sb in enumerate(nd) if sb.is_split()}
        self.gp_sbps = [
            tuple(P if a in dp_axes and sb.is_broadcast() else sb for a, sb in enumerate(nd))
            for nd in p_sbps
        ]
        self.gx_sbps = [tuple(B if sb.is_partial() else sb for sb in nd) for nd in xf_sbps]
        self.gx_avals = [a for a, f in zip(x_avals, self.x_float) if f]
        self._make_forward_res(plan)
        self._bwd = {}  # need_dx -> (Sharded, planned program)
        self._ct = {}

    def _make_forward_res(self, plan):
        x_float, fwd, store = self.x_float, self.fwd_fn, self._store
        n_p = len(self._p_avals)

        def fwd_res(p_list, xf, xo):
            def f(*args):
                fi, oi = iter(args[n_p:]), iter(xo)
                return fwd(list(args[:n_p]), [next(fi) if isf else next(oi) for isf in x_float])

            outs, lin = linearize_flat(f, list(p_list) + list(xf))
            # the linear program's constants: parameters (passed again to B), values of
            # this trace (the residuals, outputs here) and concrete constants
            kinds, res = [], []
            for c in lin.consts:
                i = next((i for i, q in enumerate(p_list) if c is q), None)
                j = next((j for j, r in enumerate(res) if c is r), None)
                if i is not None:
                    kinds.append(("p", i))
                elif j is not None:
                    kinds.append(("r", j))
                elif isinstance(c, core.Tracer):
                    kinds.append(("r", len(res)))
                    res.append(c)
                else:
                    kinds.append(("c", c))
            store["lin"], store["kinds"], store["n_out"] = lin, kinds, len(outs)
            return list(outs) + res

        xf_sbps = [s for s, f in zip(self.x_sbps, x_float) if f]
        xo_sbps = [s for s, f in zip(self.x_sbps, x_float) if not f]
        self.fwd_res = shard_mod.shard(fwd_res, self.pl, in_sbp=(self.p_sbps, xf_sbps, xo_sbps))
        args = (
            [_dummy(a) for a in self._p_avals],
            [_dummy(a) for a, f in zip(self._x_avals, x_float) if f],
            [_dummy(a) for a, f in zip(self._x_avals, x_float) if not f],
        )
        rplan = self.fwd_res.lower(*args)
        n_out = store["n_out"]
        outvars = rplan.program.outvars
        self.out_avals = [v.aval for v in outvars[:n_out]]
        self.out_sbps = list(rplan.out_sbps[:n_out])
        self.res_sbps = list(rplan.out_sbps[n_out:])
        self.res_avals = [v.aval for v in outvars[n_out:]]
        self.out_float = [_is_float(a.dtype) for a in self.out_avals]
        n_in = sum(len(a) for a in args)
        self.fwd_res_sp = rplan if len(rplan.program.invars) == n_in else None
        # what a device of this stage keeps per micro-batch between F and B
        self.x_bytes = sum(
            _local_bytes(a, nd, self.pl) for a, nd in zip(self.res_avals, self.res_sbps)
        )

    def forward(self, p_vals, x):
        if self.fwd_sp is not None:
            return self.fwd_sp.run_global(list(p_vals) + list(x))
        return self.fwd(p_vals, x)

    def forward_train(self, p_vals, x):
        """(outputs, residuals) of one micro-batch."""
        xf = [v for v, f in zip(x, self.x_float) if f]
        xo = [v for v, f in zip(x, self.x_float) if not f]
        if self.fwd_res_sp is not None:
            outs = self.fwd_res_sp.run_global(list(p_vals) + xf + xo)
        else:
            outs = self.fwd_res(p_vals, xf, xo)
        n = len(self.out_avals)
        return list(outs[:n]), list(outs[n:])

    def backward(self, p_vals, res, ct, need_dx=True):
        """(parameter gradients, input cotangents; [] unless `need_dx`)."""
        if need_dx not in self._bwd:
            self._bwd[need_dx] = self._make_backward(need_dx)
        sharded, sp = self._bwd[need_dx]
        n_p = len(p_vals)
        if sp is not None:
            outs = sp.run_global(list(p_vals) + list(res) + list(ct))
            return outs[:n_p], outs[n_p:]
        return sharded(p_vals, res, ct)

    def loss_cotangent(self, scale):
        """The cotangent of the last stage's loss, a global scalar on this placement."""
        ct = self._ct.get(scale)
        if ct is None:
            aval = self.out_avals[0]
            ct = to_global(np.asarray(scale, aval.dtype), self.pl, self.out_sbps[0])
            self._ct[scale] = ct
        return ct

    def _make_backward(self, need_dx):
        out_float, store = self.out_float, self._store
        n_p = len(self._p_avals)

        def bwd(p_list, res, ct):
            lin = store["lin"]
            consts = [
                p_list[i] if k == "p" else res[i] if k == "r" else i for k, i in store["kinds"]
            ]
            prog = Program(lin.invars, lin.constvars, lin.eqns, lin.outvars, consts)
            ci = iter(ct)
            cts = [next(ci) if f else Zero(v.aval) for v, f in zip(lin.outvars, out_float)]
            g = [instantiate(c) for c in backward_pass(prog, cts)]
            # stage 0 without input gradients: their matmuls are dead code here
            return g[:n_p], (g[n_p:] if need_dx else [])

        ct_sbps = [s for s, f in zip(self.out_sbps, out_float) if f]
        in_sbp = (self.p_sbps, self.res_sbps, ct_sbps)
        args = (
            [_dummy(a) for a in self._p_avals],
            [_dummy(a) for a in self.res_avals],
            [_dummy(a) for a, f in zip(self.out_avals, out_float) if f],
        )
        gx_sbps = self.gx_sbps if need_dx else []
        out_sbp = (self.gp_sbps, gx_sbps)
        sharded = shard_mod.shard(bwd, self.pl, in_sbp=in_sbp, out_sbp=out_sbp)
        sp = sharded.lower(*args)
        n_in = sum(len(a) for a in args)
        return sharded, (sp if len(sp.program.invars) == n_in else None)


def _local_bytes(aval, nd, pl):
    shape = local_shape(aval.shape, nd, pl.hierarchy, pl.coords(0))
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(aval.dtype).itemsize


def _aval(x):
    return core.aval_of_value(x).strip_weak_type()


class Pipeline:
    """The pipelined function's state: stages, placements, schedules, compiled stages."""

    def __init__(self, stages, placements, num_microbatches, schedule, in_sbp):
        self.stages = list(stages)
        self.placements = list(placements)
        if not self.stages or not self.placements:
            raise user_error(ValueError, "fflow.pipeline needs at least one stage and placement")
        for pl in self.placements:
            if not isinstance(pl, placement):
                raise user_error(TypeError, f"pipeline placements must be fflow.placement: {pl!r}")
        n, p = len(self.stages), len(self.placements)
        if n % p:
            raise user_error(
                ValueError,
                f"{n} stages cannot be spread over {p} placements. Fix: one placement per "
                "stage, or (schedule='interleaved') a number of stages that is a multiple of "
                "the placements.",
            )
        self.m = int(num_microbatches)
        self.schedule = Schedule(schedule, p, self.m, n // p)
        self.forward_schedule = Schedule(schedule, p, self.m, n // p, forward_only=True)
        if in_sbp is not None and len(in_sbp) != n:
            raise user_error(
                ValueError, f"in_sbp has {len(in_sbp)} entries for {n} stages; give one each"
            )
        self.in_sbp = in_sbp
        self.loss_dtype = np.dtype(np.float32)
        self._compiled = {}
        self.stats = {}  # the last run: peak activation bytes per stage, bytes moved

    def placement_of(self, s):
        return self.placements[s % len(self.placements)]

    # -- compiling stages -----------------------------------------------------------
    def _leaf_sbps(self, s, which, tree_value, leaves):
        pl = self.placement_of(s)
        spec = None if self.in_sbp is None else self.in_sbp[s]
        if spec is not None:
            if not isinstance(spec, (tuple, list)) or len(spec) != 2:
                raise user_error(
                    ValueError,
                    f"in_sbp[{s}] must be a pair (params SBP, input SBP), got {spec!r}",
                )
            spec = spec[which]
        sbps = shard_mod._sbp_prefix(spec, tree_value, pl.ndim, f"in_sbp[{s}]")
        out = []
        for nd, leaf in zip(sbps, leaves):
            if nd is None:
                same = is_global(leaf) and leaf.placement == pl
                nd = tuple(leaf.sbp) if same else (B,) * pl.ndim
            out.append(tuple(nd))
        return out

    def _stage(self, s, params_s, p_leaves, p_tree, x_tree, x_leaves):
        key = (s, p_tree, x_tree, tuple(_aval(x) for x in p_leaves + x_leaves))
        st = self._compiled.get(key)
        if st is None:
            p_sbps = self._leaf_sbps(s, 0, params_s, p_leaves)
            x_sbps = self._leaf_sbps(s, 1, tree_unflatten(x_tree, x_leaves), x_leaves)
            st = _Stage(
                self.stages[s],
                self.placement_of(s),
                p_tree,
                x_tree,
                p_sbps,
                x_sbps,
                [_aval(x) for x in p_leaves],
                [_aval(x) for x in x_leaves],
            )
            self._compiled[key] = st
        return st

    # -- running a step -------------------------------------------------------------
    def run_forward(self, leaves):
        loss, _ = self._run(leaves, None)
        return loss

    def run_train(self, leaves, want):
        return self._run(leaves, want)

    def _run(self, leaves, want):
        with core.set_current_trace(array_mod.root_trace):
            return Step(self, leaves, want).run()


class PipelineFunction:
    """What `fflow.pipeline` returns: call it, differentiate it, inspect `.schedule`."""

    def __init__(self, pipe):
        self.pipe = pipe
        self.schedule = pipe.schedule

    @property
    def stats(self):
        """The last run on this process: `peak_activation_bytes` (per stage, the most
        bytes of saved residuals one device held; measured on this process' stages,
        counted at their planned size for other ranks' stages), `bytes_moved`,
        `trace` (each operation run here, timed: see fflow/pipeline_trace.py),
        `step_start`/`step_end` (perf_counter) and `transfers` (the transfer plans
        between stages of one micro-batch)."""
        return self.pipe.stats

    def describe_transfers(self):
        """Text: per stage boundary and direction, the sends of one micro-batch and their
        bytes (from the last run)."""
        lines = []
        moves = self.pipe.stats.get("transfers", {})
        for (kind, src, dst), plans in sorted(
            moves.items(), key=lambda kv: (kv[0][0] != "F", kv[0][1])
        ):
            what = "activations" if kind == "F" else "cotangents"
            total = sum(p.bytes for p in plans)
            lines.append(f"stage {src} -> {dst} {what}: {total} B per micro-batch")
            lines += [f"  {p.describe()}" for p in plans]
        return "\n".join(lines)

    def __call__(self, params_list, batch):
        leaves, tree = tree_flatten((params_list, batch))
        call = _Call(self.pipe, tree)
        if core.current_trace() is array_mod.root_trace:
            return call.run_forward(leaves)
        return pipeline_call_p.bind(*leaves, pipe=call)


class _Call:
    """The `pipe` param of pipeline_call: the pipeline plus this call's pytree structure."""

    def __init__(self, pipe, tree):
        self.pipe = pipe
        self.tree = tree

    @property
    def loss_dtype(self):
        return self.pipe.loss_dtype

    def run_forward(self, leaves):
        self.pipe._tree = self.tree
        return self.pipe.run_forward(leaves)

    def run_train(self, leaves, want):
        self.pipe._tree = self.tree
        return self.pipe.run_train(leaves, want)

    def __hash__(self):
        return hash((id(self.pipe), self.tree))

    def __eq__(self, other):
        return type(other) is _Call and other.pipe is self.pipe and other.tree == self.tree


def _pipeline_dispatch(prim, args, params):
    # global-array arguments at the root trace: run the pipeline, not shard's eager rules
    if prim is pipeline_call_p:
        return params["pipe"].run_forward(list(args))
    return NotImplemented


if _pipeline_dispatch not in array_mod.special_dispatch:
    array_mod.special_dispatch.insert(0, _pipeline_dispatch)


def pipeline(stages, placements, num_microbatches, schedule="1f1b", in_sbp=None):
    """Pipeline parallelism: `stages[i]` runs on `placements[i]`, micro-batch by micro-batch.

    Args:
        stages: functions `stage_i(params_i, x) -> x_next`; the last returns the
            micro-batch's scalar loss (the pipeline averages it over micro-batches).
            `x` may be a pytree (e.g. `(features, labels)` passed along by each stage).
        placements: one `fflow.placement` per stage; with schedule="interleaved", v
            stages per placement (stage i on `placements[i % len(placements)]`).
        num_microbatches: m; the batch is cut into m pieces along axis 0.
        schedule: "gpipe", "1f1b" (default) or "interleaved" (interleaved 1F1B).
        in_sbp: optional, per stage a pair (params SBP, input SBP) as in `fflow.shard`,
            to shard each stage over its placement (data x tensor parallel inside).

    Returns:
        A function `(params_list, batch) -> loss` (a local scalar on every rank) that
        `grad` / `value_and_grad` differentiate; gradients are global arrays on each
        stage's placement. `.schedule` prints the plan, `.stats` the last run's peak
        activation bytes per stage.

    Example:
        >>> import fflow, fflow.numpy as jnp
        >>> pls = [fflow.placement("cpu", [0]), fflow.placement("cpu", [1])]
        >>> s0 = lambda w, x: jnp.tanh(x @ w)
        >>> s1 = lambda w, x: jnp.mean((x @ w) ** 2)
        >>> f = fflow.pipeline([s0, s1], pls, num_microbatches=2)
        >>> ws = [jnp.ones((3, 4)) * 0.1, jnp.ones((4, 1))]
        >>> loss, grads = fflow.value_and_grad(f)(ws, jnp.ones((4, 3)))
        >>> round(float(loss), 4), grads[1].shape
        (1.3578, (4, 1))
    """
    pipe = Pipeline(stages, placements, num_microbatches, schedule, in_sbp)
    return PipelineFunction(pipe)


__all__ = ["pipeline", "Pipeline", "PipelineFunction"]
