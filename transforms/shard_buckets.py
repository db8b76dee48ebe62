"""Gradient bucketing: the P -> B all-reduces of a device program fused into buckets,
started early and waited for late (PyTorch DDP's buckets, on the SPMD program).

`grad(shard(f))` makes every gradient of a broadcast parameter partial and boxes it
to broadcast with one all_reduce(sum) per gradient, placed where the gradient is
read (usually the program's end, after the whole backward pass). Here the
all-reduces of one group and dtype are taken in the order their inputs become
ready (the backward pass produces the last layer's gradient first) and packed into
buckets of up to `grad_bucket_mb` MB (config, FFLOW_GRAD_BUCKET_MB, default 25 as
in DDP; 0 turns bucketing off). A bucket *starts* (one non-blocking all-reduce of
its members' flat values concatenated) right after its last member's input is
computed and is *waited for* just before the first equation that reads one of its
results. The all-reduce is elementwise, so buckets change no number.

While Python computes between a start and its wait, MPI makes progress when
fflow polls the request between compiled segments (`("progress",)` requests), inside
every other MPI call (the waits of the collectives after the start), or continuously
with MPICH's progress thread (MPIR_CVAR_ASYNC_PROGRESS=1; mpi4py initialises MPI with
MPI_THREAD_MULTIPLE, which that needs). Nothing moves inside a compiled segment.

What that hides depends on who copies the bytes. MPICH's shared-memory transport
copies with the ranks' own CPUs, so where every core computes (benchmarks/bench_mpi.py,
2 ranks x 2 cores) overlap moves a bucket's work into the next waits without hiding
it: the DP MLP's 4 MB bucket waits 0.00 ms instead of ~1 ms, and the step takes
as long as with `grad_overlap=False` (which waits for each bucket where it starts; with
packed buckets overlap was ~1% slower: the bucket interleaves with the layer-1
collectives right after its start). A thread polling MPI during a 3 ms GEMM empties
the wait and slows the GEMM by ~1 ms (in the DP step: 2-7% slower); smaller buckets
(1 MB, as DDP's first) cut the backward segment: ~2% slower. With 4 ranks on 2 cores
overlap hides 4-7 ms of a DP step (a waiting rank yields its core to one that computes),
and on a link that progresses by itself (NCCL, RDMA, a spare core for the progress
thread) it is real too.

The planner's cost model reads `grad_bucket_mb` too (transforms/shard_cost.py), so
another bucket size may give another plan, with other last bits; one plan runs with
the same numbers under every bucket setting (tests/test_shard_buckets.py).
"""

import numpy as np
from fflow.primitives.collectives import all_reduce_p

from fflow.config import config
from fflow.core import Literal

config.define("grad_bucket_mb", 25.0)
# False: the MPI runtime waits for a bucket right after starting it (no overlap with the
# backward pass; benchmarks/bench_mpi.py measures what overlap hides this way)
config.define("grad_overlap", True)
SPLIT_BYTES = [1 << 20]  # a bucket member this large, held by nothing else: reduced alone


class Bucket:
    """All-reduces fused into one: members' eqns, when it starts and when it is needed."""

    def __init__(self, number, params, dtype):
        self.number = number
        self.params = params  # of the first member (op, group, index, placement)
        self.dtype = np.dtype(dtype)
        self.members = []
        self.ready = -1  # starts after this equation index (-1: at the program start)
        self.wait = None  # waited for before this equation index (len(eqns): the end)
        self.nbytes = 0

    def add(self, eqn, ready, first_use):
        self.members.append(eqn)
        self.ready = max(self.ready, ready)
        self.wait = first_use if self.wait is None else min(self.wait, first_use)
        self.nbytes += int(np.prod(eqn.inputs[0].aval.shape, dtype=np.int64)) * self.dtype.itemsize

    def pack(self, values):
        """The members' values as one flat buffer (a view, no copy, for one member)."""
        if len(values) == 1:
            return np.ascontiguousarray(values[0]).reshape(-1)
        return np.concatenate([np.asarray(v).reshape(-1) for v in values])

    def parts(self, taken):
        """[(member indices, flat value, owned)] all-reduced one by one: a member of at
        least SPLIT_BYTES[0] whose array only this bucket holds (`taken`: [(value,
        alone)]) goes alone and is reduced in place, as DDP's gradient_as_bucket_view
        (no 4 MB pack copy, 0.23 ms a step in bench_mpi's DP MLP); the others are packed
        into one buffer. The sum is elementwise: the parts change no number. Which
        members go alone depends on their sizes only, never on who holds the arrays, so
        every member of the group splits the bucket the same way (a big member that
        something else holds is copied first)."""
        alone = [k for k, (x, own) in enumerate(taken) if x.nbytes >= SPLIT_BYTES[0]]
        rest = [k for k in range(len(taken)) if k not in alone]
        out = []
        if rest:
            x = self.pack([taken[k][0] for k in rest])
            out.append((rest, x, len(rest) > 1 or taken[rest[0]][1]))
        for k in alone:
            x, own = taken[k]
            out.append(([k], (x if own else np.array(x, order="C")).reshape(-1), True))
        return out

    def unpack(self, flat, idx=None):
        """The values of members `idx` (default: all) from their part's flat result."""
        out, start = [], 0
        for k in range(len(self.members)) if idx is None else idx:
            shape = self.members[k].outputs[0].aval.shape
            n = int(np.prod(shape, dtype=np.int64))
            out.append(flat[start : start + n].reshape(shape))
            start += n
        return out

    def describe(self):
        return (
            f"bucket {self.number}: {len(self.members)} all_reduce, {self.nbytes} bytes "
            f"{self.dtype.name} over group {list(self.params['group'])}; starts after "
            f"equation {self.ready}, waited before equation {self.wait}"
        )


def _bucketable(eqn):
    return (
        eqn.primitive is all_reduce_p
        and eqn.params["op"] == "sum"
        and len(eqn.params["group"]) > 1
        and type(eqn.inputs[0]) is not Literal
    )


def plan_buckets(prog, limit_bytes=None):
    """The buckets of `prog` (a device program), or [] when bucketing is off."""
    if limit_bytes is None:
        limit_bytes = float(config.grad_bucket_mb) * (1 << 20)
    if limit_bytes <= 0:
        return []
    eqns = prog.eqns
    defined = {}
    for k, eqn in enumerate(eqns):
        for v in eqn.outputs:
            defined[v] = k
    candidates = [k for k, e in enumerate(eqns) if _bucketable(e)]
    produced_by_candidate = {eqns[k].outputs[0] for k in candidates}
    candidates = [k for k in candidates if eqns[k].inputs[0] not in produced_by_candidate]
    if not candidates:
        return []
    later = {}
    for k in candidates:  # first use of the result after the all-reduce itself
        out = eqns[k].outputs[0]
        uses = [j for j in range(k + 1, len(eqns)) if out in eqns[j].inputs]
        later[k] = uses[0] if uses else len(eqns)
    order = sorted(candidates, key=lambda k: (defined.get(eqns[k].inputs[0], -1), k))
    open_buckets, buckets = {}, []
    for k in order:
        eqn = eqns[k]
        key = (eqn.params["group"], np.dtype(eqn.inputs[0].aval.dtype).name)
        ready = defined.get(eqn.inputs[0], -1)
        b = open_buckets.get(key)
        size = int(np.prod(eqn.inputs[0].aval.shape, dtype=np.int64)) * np.dtype(key[1]).itemsize
        if b is not None and (
            b.nbytes + size > limit_bytes or max(b.ready, ready) >= min(b.wait, later[k])
        ):
            b = None
        if b is None:
            b = Bucket(len(buckets), eqn.params, key[1])
            buckets.append(b)
            open_buckets[key] = b
        b.add(eqn, ready, later[k])
    # a lone all-reduce with no equation to hide behind gains nothing from a bucket (a
    # P -> B boxing right after its input, at the end): it stays a plain collective
    members = {id(e) for b in buckets for e in b.members}
    buckets = [
        b
        for b in buckets
        if len(b.members) > 1
        or any(id(eqns[j]) not in members for j in range(b.ready + 1, min(b.wait, len(eqns))))
    ]
    for number, b in enumerate(buckets):
        b.number = number
    return buckets


def schedule(prog, buckets):
    """The program's events in order: ("eqn", eqn), ("start", bucket), ("wait", bucket)."""
    members = {id(e) for b in buckets for e in b.members}
    events = []
    n = len(prog.eqns)
    for j in range(n + 1):
        events += [("start", b) for b in buckets if b.ready == j - 1]
        events += [("wait", b) for b in buckets if b.wait == j]
        if j < n and id(prog.eqns[j]) not in members:
            events.append(("eqn", prog.eqns[j]))
    return events
