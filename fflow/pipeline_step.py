"""One call of `fflow.pipeline`: walking the schedule on this process.

Every rank walks the schedule's operations in the same (tick, device) order. It runs
the operations of stages on its devices; for an operation of another rank's stage it
only posts the receives of the values that come to its own stages (and compiles the
stage once, for the values' shapes and SBPs). Transfers start when their value is
made (MPI: buffer Isend/Irecv) and are waited on where they are used, so a rank
computes while its messages travel; the walk order is a topological order of the
schedule, so the waits cannot deadlock. Each operation a process runs is timed into
`stats["trace"]`: wall timestamps (`time.perf_counter`, one clock for every process
of a machine) of when it began waiting for its inputs, when they were there and when
it ended, and the CPU seconds of its thread in between (benchmarks/bench_pipeline.py
turns traces into measured bubbles).
"""

import time

import numpy as np

from fflow import array as array_mod
from fflow.errors import user_error
from fflow.sharding import B, is_global, make_global, placement, runtime, to_global
from fflow.transforms.shard_transfer import plan_transfer, start_transfer
from fflow.tree_util import tree_flatten, tree_unflatten

TAGS = 20000  # pipeline transfers use tags below this; eager to_global the ones above


class TracedOp:
    """One operation this process ran: `wait` (began waiting for its inputs), `start`
    (inputs there), `end` (outputs made, their sends started) in perf_counter seconds,
    and `cpu` (this thread's CPU seconds from start to end)."""

    __slots__ = ("kind", "stage", "mb", "wait", "start", "end", "cpu")

    def __init__(self, kind, stage, mb, wait, start, end, cpu):
        self.kind, self.stage, self.mb = kind, stage, mb
        self.wait, self.start, self.end, self.cpu = wait, start, end, cpu

    def key(self):
        return (self.kind, self.stage, self.mb)

    def __repr__(self):
        busy = (self.end - self.start) * 1e3
        return f"{self.kind}(stage={self.stage}, mb={self.mb}, {busy:.3f} ms)"


def _local_ranks():
    """None on simulated devices (every device is here), else this process' rank."""
    rt = runtime()
    return rt.rank if hasattr(rt, "p2p_start") else None


class Step:
    """One call of the pipeline: walks the schedule's operations in (tick, device) order."""

    def __init__(self, pipe, leaves, want):
        self.pipe = pipe
        self.train = want is not None
        self.want = want
        params_list, batch = tree_unflatten(pipe._tree, leaves)
        n = len(pipe.stages)
        if not isinstance(params_list, (list, tuple)) or len(params_list) != n:
            raise user_error(
                ValueError,
                f"the pipeline has {n} stages, so params_list must be a list of {n} parameter "
                f"pytrees (one per stage), got {type(params_list).__name__}",
            )
        self.params_list = list(params_list)
        self.batch = batch
        self.n_param_leaves = len(leaves) - len(tree_flatten(batch)[0])
        self.rank = _local_ranks()

    def mine(self, pl):
        return self.rank is None or self.rank in pl.ranks

    def run(self):
        pipe = self.pipe
        n, m = len(pipe.stages), pipe.m
        sched = pipe.schedule if self.train else pipe.forward_schedule
        self.p_leaves, self.p_trees = [], []
        for s in range(n):
            leaves, tree = tree_flatten(self.params_list[s])
            self.p_leaves.append(leaves)
            self.p_trees.append(tree)
        b_leaves, self.b_tree = tree_flatten(self.batch)
        arrays = [np.asarray(b) for b in b_leaves]
        for a in arrays:
            if a.ndim == 0 or a.shape[0] % m:
                raise user_error(
                    ValueError,
                    f"the batch is cut into {m} micro-batches along axis 0, but a batch leaf "
                    f"has shape {a.shape}. Fix: a batch size divisible by num_microbatches.",
                )
        size = arrays[0].shape[0] // m if arrays else 0
        self.micro = [[a[k * size : (k + 1) * size] for a in arrays] for k in range(m)]
        self.stages = [None] * n  # the _Stage of each stage, made when first reached
        self.inbox = {}  # ("F"|"B", stage, mb) -> [PendingTransfer or array per leaf]
        self.sends = []  # started transfers to other ranks: completed at the end
        self.saved = {}  # (stage, mb) -> residuals
        self.alive = [0] * n
        self.peak = [0] * n
        self.grads = [None] * n
        self.losses = []
        self.dx = [None] * m
        self.tag = 0  # advanced the same on every rank: transfers match by tag
        self.transfers = {}  # (F|B, from stage, to stage) -> TransferPlans of one micro-batch
        self.trace = []
        rt = runtime()
        before = rt.bytes_moved
        start = time.perf_counter()
        self._stage0_inputs()
        for op in sched.ops_in_order():
            if self.mine(pipe.placement_of(op.stage)):
                t_wait = time.perf_counter()
                if op.kind == "F":
                    self._forward(op.stage, op.mb, t_wait)
                else:
                    self._backward(op.stage, op.mb, t_wait)
            else:
                self._post_receives(op)
        for t in self.sends:
            t.wait()
        loss = self._finish_loss()
        grads = self._finish_grads() if self.train else None
        pipe.stats = {
            "peak_activation_bytes": list(self.peak),
            "bytes_moved": rt.bytes_moved - before,
            "trace": self.trace,
            "step_start": start,
            "step_end": time.perf_counter(),
            "transfers": self.transfers,
        }
        return loss, grads

    # -- stages ---------------------------------------------------------------------
    def _stage_for(self, s, x_tree, x_leaves):
        if self.stages[s] is None:
            st = self.pipe._stage(
                s, self.params_list[s], self.p_leaves[s], self.p_trees[s], x_tree, x_leaves
            )
            self.stages[s] = st
            st.p_vals = [to_global(a, st.pl, nd) for a, nd in zip(self.p_leaves[s], st.p_sbps)]
        return self.stages[s]

    def _next_stage(self, s):
        st, t = self.stages[s], s + 1
        if self.stages[t] is None:
            self._stage_for(t, st.out_tree, [_dummy(a) for a in st.out_avals])
        return self.stages[t]

    def _stage0_inputs(self):
        st = self._stage_for(0, self.b_tree, self.micro[0])
        if not self.mine(st.pl):
            return
        for k, mb in enumerate(self.micro):
            self.inbox[("F", 0, k)] = [to_global(a, st.pl, nd) for a, nd in zip(mb, st.x_sbps)]

    # -- transfers ------------------------------------------------------------------
    def _take(self, key):
        return [x.wait() if hasattr(x, "wait") else x for x in self.inbox.pop(key)]

    def _route(self, values, src, dst, key):
        """Start moving `values` (None: another rank's, only their receives) from
        (placement, sbps, avals) `src` onto `dst`, for operation `key`."""
        src_pl, src_sbps, src_avals = src
        dst_pl, dst_sbps = dst
        tag = self.tag
        self.tag += len(dst_sbps)
        kind, stage, _ = key  # the values go to `stage`'s F (activations) or B (cotangents)
        edge = (kind, stage - 1 if kind == "F" else stage + 1, stage)
        if edge not in self.transfers:  # the plans of one micro-batch, known on every rank
            self.transfers[edge] = [
                plan_transfer(a.shape, a.dtype, src_pl, s_nd, dst_pl, d_nd)
                for a, s_nd, d_nd in zip(src_avals, src_sbps, dst_sbps)
            ]
        dst_mine = self.mine(dst_pl)
        if values is None:
            if not dst_mine:
                return
            values = _empty(src_avals, src_pl, src_sbps)
        pending = [
            start_transfer(v, dst_pl, nd, tag=(tag + j) % TAGS)
            for j, (v, nd) in enumerate(zip(values, dst_sbps))
        ]
        if dst_mine:
            self.inbox[key] = pending
        else:
            self.sends.extend(pending)

    def _forward_route(self, s, k, y):
        st, nxt = self.stages[s], self._next_stage(s)
        src = (st.pl, st.out_sbps, st.out_avals)
        self._route(y, src, (nxt.pl, nxt.x_sbps), ("F", s + 1, k))

    def _backward_route(self, s, k, gx):
        st, prev = self.stages[s], self.stages[s - 1]
        dst = [nd for nd, f in zip(prev.out_sbps, prev.out_float) if f]
        self._route(gx, (st.pl, st.gx_sbps, st.gx_avals), (prev.pl, dst), ("B", s - 1, k))

    def _post_receives(self, op):
        """Another rank's operation: post the receives of what it sends to this rank
        (and count its saved residuals at their planned size, for `stats`)."""
        s, k, last = op.stage, op.mb, len(self.pipe.stages) - 1
        st = self.stages[s]
        if op.kind == "F":
            if self.train:
                self._hold(s, st.x_bytes)
            if s < last:
                self._forward_route(s, k, None)
        else:
            self._hold(s, -st.x_bytes)
            if s > 0:
                self._backward_route(s, k, None)

    def _hold(self, s, nbytes):
        self.alive[s] += nbytes
        self.peak[s] = max(self.peak[s], self.alive[s])

    # -- operations -----------------------------------------------------------------
    def _record(self, kind, s, k, t_wait, t_start, c_start):
        end = time.perf_counter()
        cpu = time.thread_time() - c_start
        self.trace.append(TracedOp(kind, s, k, t_wait, t_start, end, cpu))

    def _forward(self, s, k, t_wait):
        n = len(self.pipe.stages)
        x = self._take(("F", s, k))
        t_start, c_start = time.perf_counter(), time.thread_time()
        x_tree = self.b_tree if s == 0 else self.stages[s - 1].out_tree
        st = self._stage_for(s, x_tree, x)
        if self.train:
            y, res = st.forward_train(st.p_vals, x)
            self.saved[(s, k)] = res
            self._hold(s, _held_bytes(res))
        else:
            y = st.forward(st.p_vals, x)
        if s == n - 1:
            if len(y) != 1 or y[0].shape != ():
                raise user_error(
                    ValueError,
                    f"the last pipeline stage must return the micro-batch's scalar loss, got "
                    f"{len(y)} outputs of shapes {[tuple(v.shape) for v in y]}",
                )
            self.losses.append(y[0])
        else:
            self._forward_route(s, k, y)
        self._record("F", s, k, t_wait, t_start, c_start)

    def _backward(self, s, k, t_wait):
        n = len(self.pipe.stages)
        st = self.stages[s]
        ct = [st.loss_cotangent(1.0 / self.pipe.m)] if s == n - 1 else self._take(("B", s, k))
        t_start, c_start = time.perf_counter(), time.thread_time()
        res = self.saved.pop((s, k))
        self._hold(s, -_held_bytes(res))
        gp, gx = st.backward(st.p_vals, res, ct, need_dx=s > 0 or self._want_batch())
        acc = self.grads[s]
        if acc is None:  # a copy of its own, then accumulated in place
            self.grads[s] = [_add(g, None) for g in gp]
        else:
            self.grads[s] = [_add(a, g) for a, g in zip(acc, gp)]
        if s > 0:
            self._backward_route(s, k, gx)
        elif self._want_batch():
            self.dx[k] = gx
        self._record("B", s, k, t_wait, t_start, c_start)

    def _want_batch(self):
        return any(self.want[self.n_param_leaves :])

    # -- the step's results ---------------------------------------------------------
    def _finish_loss(self):
        st = self.stages[-1]
        # summed shard by shard: a partial sum stays one (a partial max becomes B first)
        sbp = tuple(B if sb.is_partial() and sb.op != "sum" else sb for sb in st.out_sbps[0])
        shards = {}
        if self.mine(st.pl):
            total = None
            for v in self.losses:
                v = v if tuple(v._sharding.sbp) == sbp else to_global(v, sbp=sbp)
                total = _add(v, None) if total is None else _add(total, v)
            scale = 1.0 / self.pipe.m
            shards = {i: a * np.asarray(scale, a.dtype) for i, a in total._value.shards.items()}
        aval = st.out_avals[0]
        self.pipe.loss_dtype = np.dtype(aval.dtype)
        return _to_every_rank(make_global((), aval.dtype, st.pl, sbp, shards))

    def _finish_grads(self):
        out = []
        for s, st in enumerate(self.stages):
            grads = self.grads[s]
            if grads is None:  # another rank's stage
                grads = _empty(st.p_avals, st.pl, st.gp_sbps)
            # one reduction per step: partial sums over micro-batches become the
            # parameters' own SBP here
            for g, nd in zip(grads, st.p_sbps):
                out.append(to_global(g, sbp=_grad_sbp(nd)))
        if not self._want_batch():
            return out + [None] * (len(self.want) - len(out))
        st = self.stages[0]
        j = 0
        for f in st.x_float:
            if not f:
                out.append(None)
                continue
            pieces = []
            for k in range(self.pipe.m):
                if self.dx[k] is not None:
                    g = self.dx[k][j]
                else:
                    g = _empty([st.gx_avals[j]], st.pl, [st.gx_sbps[j]])[0]
                pieces.append(np.asarray(_to_every_rank(g)))
            out.append(array_mod.Array(np.concatenate(pieces, axis=0)))
            j += 1
        return out


def _empty(avals, pl, sbps):
    """Global arrays of another rank's stage: shapes and SBPs, no shards here."""
    return [make_global(a.shape, a.dtype, pl, nd, {}) for a, nd in zip(avals, sbps)]


def _held_bytes(values):
    """Bytes one device holds of `values` (the first of its devices this process has)."""
    total = 0
    for v in values:
        shards = v._value.shards
        if shards:
            total += np.asarray(shards[min(shards)]).nbytes
    return total


def _dummy(aval):
    return array_mod.Array(np.zeros(aval.shape, aval.dtype))


def _grad_sbp(nd):
    return tuple(B if s.is_partial() else s for s in nd)


def _add(a, b):
    """a + b of two global arrays with one sharding, shard by shard into a's buffers
    (no boxing, no new arrays: `a` must be the step's own); b None: a copy of a."""
    sh = a._sharding
    if b is not None and (
        b._sharding != sh or any(s.is_partial() and s.op != "sum" for s in sh.sbp)
    ):
        return a + b
    if b is None:
        shards = {i: np.array(v) for i, v in a._value.shards.items()}
        return make_global(a.shape, a.dtype, sh.placement, sh.sbp, shards)
    for i, v in a._value.shards.items():
        np.add(v, b._value.shards[i], out=v)
    return a


def _to_every_rank(x):
    """A local array of a global value, sent to every rank with buffer sends."""
    if not is_global(x):
        return x
    world = placement("cpu", list(range(runtime().device_count())))
    y = start_transfer(x, world, (B,), tag=TAGS - 1).wait()
    return array_mod.Array(np.array(runtime().local_of(y._value)))
