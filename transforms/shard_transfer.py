"""Moving a global array between placements: point-to-point boxing.

`to_global(x, other_placement, sbp)` and the stage-to-stage sends of
`fflow.pipeline` convert (placement A, SBP a) -> (placement B, SBP b) in up to
two steps:

1. on A, partial values are reduced first (P -> B or P -> S(k), whichever makes
   the whole move cheapest), with the ordinary boxing collectives;
2. every device of B receives the slice of the logical array it holds under b
   (for b partial-sum: only the keeping device, the others hold zeros), in pieces
   cut by the intersection with A's shards, one send per piece. A piece held by
   several devices of A (replicas) comes from the one on the same rank if there is
   one, else from the replicas in turn, so sends are spread over A.

A `TransferPlan` lists the messages and their bytes (`plan.bytes` counts step 1's
collectives and every message between different ranks). The simulated runtime
copies the pieces in this process; the MPI runtime sends them with buffer
Isend/Irecv (`MPIRuntime.p2p_start`), so a transfer can be started and waited on
later while the devices compute.
"""

import itertools
import math
import time

import numpy as np
from fflow.transforms.shard_boxing import boxing_bytes

from fflow import sharding
from fflow.array import Array
from fflow.sharding import (
    B,
    GlobalValue,
    Sharding,
    Split,
    _fits,
    local_box,
    local_shape,
    partial_keeper,
    runtime,
)


class Message:
    __slots__ = ("src", "dst", "src_slice", "dst_slice", "nbytes")

    def __init__(self, src, dst, src_slice, dst_slice, nbytes):
        self.src = src  # flat index in the source placement
        self.dst = dst  # flat index in the destination placement
        self.src_slice = src_slice  # slices of the source shard
        self.dst_slice = dst_slice  # slices of the destination shard
        self.nbytes = nbytes


class TransferPlan:
    """How one array moves from (src_pl, src_sbp) to (dst_pl, dst_sbp)."""

    def __init__(self, shape, dtype, src_pl, src_sbp, dst_pl, dst_sbp, pre_sbp, messages):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.src_pl, self.src_sbp = src_pl, tuple(src_sbp)
        self.dst_pl, self.dst_sbp = dst_pl, tuple(dst_sbp)
        self.pre_sbp = tuple(pre_sbp)  # SBP on the source placement before the sends
        self.messages = messages
        self.pre_bytes = boxing_bytes(
            self.shape, self.dtype, src_pl.hierarchy, self.src_sbp, self.pre_sbp
        )
        self.p2p_bytes = sum(
            m.nbytes for m in messages if src_pl.ranks[m.src] != dst_pl.ranks[m.dst]
        )
        self.bytes = self.pre_bytes + self.p2p_bytes

    def describe(self):
        pre = "" if self.pre_sbp == self.src_sbp else f" (first {self.src_sbp}->{self.pre_sbp})"
        sends = sum(
            1 for m in self.messages if self.src_pl.ranks[m.src] != self.dst_pl.ranks[m.dst]
        )
        return (
            f"send_recv[{list(self.src_pl.ranks)}{self.src_sbp} -> "
            f"{list(self.dst_pl.ranks)}{self.dst_sbp}]{pre}: {sends} messages, {self.bytes} B"
        )

    __repr__ = describe


_plan_cache = {}


def plan_transfer(shape, dtype, src_pl, src_sbp, dst_pl, dst_sbp):
    """The cheapest TransferPlan (cached per shapes, placements and SBPs)."""
    key = (tuple(shape), np.dtype(dtype), src_pl, tuple(src_sbp), dst_pl, tuple(dst_sbp))
    plan = _plan_cache.get(key)
    if plan is None:
        best = None
        for pre in _pre_candidates(key[0], src_pl.hierarchy, key[3]):
            msgs = _messages(key[0], key[1].itemsize, src_pl, pre, dst_pl, key[5])
            cand = TransferPlan(key[0], key[1], src_pl, key[3], dst_pl, key[5], pre, msgs)
            if best is None or cand.bytes < best.bytes:
                best = cand
        if len(_plan_cache) > 4096:
            _plan_cache.clear()
        plan = _plan_cache[key] = best
    return plan


def _pre_candidates(shape, hierarchy, sbp):
    """Source SBPs without partial axes: each P becomes B or a split that fits."""
    options = []
    for s in sbp:
        if s.is_partial():
            options.append([B] + [Split(k) for k in range(len(shape))])
        else:
            options.append([s])
    out = []
    for combo in itertools.product(*options):
        if _fits(tuple(shape), tuple(combo), tuple(hierarchy)):
            out.append(tuple(combo))
    return out


def _messages(shape, itemsize, src_pl, src_sbp, dst_pl, dst_sbp):
    holders = {}  # source box -> flat indices of the devices holding it
    for i in range(src_pl.size):
        box = local_box(shape, src_sbp, src_pl.hierarchy, src_pl.coords(i))
        holders.setdefault(box, []).append(i)
    msgs = []
    turn = 0
    for j in range(dst_pl.size):
        coords = dst_pl.coords(j)
        if not partial_keeper(dst_sbp, dst_pl.hierarchy, coords):
            continue  # holds zeros
        out_box = local_box(shape, dst_sbp, dst_pl.hierarchy, coords)
        for box, hs in holders.items():
            inter = tuple((max(a0, b0), min(a1, b1)) for (a0, a1), (b0, b1) in zip(box, out_box))
            if any(hi <= lo for lo, hi in inter):
                continue
            same = [h for h in hs if src_pl.ranks[h] == dst_pl.ranks[j]]
            if same:
                src = same[0]
            else:
                src = hs[turn % len(hs)]
                turn += 1
            src_slice = tuple(slice(lo - s0, hi - s0) for (lo, hi), (s0, _) in zip(inter, box))
            dst_slice = tuple(slice(lo - o0, hi - o0) for (lo, hi), (o0, _) in zip(inter, out_box))
            nbytes = math.prod(hi - lo for lo, hi in inter) * itemsize
            msgs.append(Message(src, j, src_slice, dst_slice, nbytes))
    return msgs


# ----------------------------------------------------------------------------
# Running a transfer


class PendingTransfer:
    """A started transfer; `wait()` returns the global array on the new placement."""

    def __init__(self, plan, weak, out_shards, fill, handle=None):
        self.plan = plan
        self.weak = weak
        self._out = out_shards
        self._fill = fill  # [(dst flat, dst slice or None: all, recv index)] when received
        self._handle = handle
        self._result = None

    def wait(self):
        if self._result is None:
            if self._handle is not None:
                _nap_until_done(self._handle)
                received = self._handle.wait()
                for j, sl, k in self._fill:
                    if sl is None:  # the whole shard
                        self._out[j] = received[k]
                    else:
                        self._out[j][sl] = received[k]
            p = self.plan
            sh = p.dst_sharding
            self._result = Array(GlobalValue(p.shape, p.dtype, sh, self._out), self.weak)
            self._result._sharding = sh
        return self._result


# Waiting for a transfer: spin this long, then poll every NAP seconds while asleep, for
# at most NAP_FOR seconds (then the runtime's own wait: spinning, peer checks, timeout).
SPIN, NAP, NAP_FOR = 5e-5, 1e-4, 1.0


def _nap_until_done(handle):
    """Wait for an MPI transfer without holding a core. A pipeline stage often waits
    long (fill and drain) while ranks outnumber free cores; a rank spinning in its wait
    takes turns on the core with the rank computing what it waits for. 4 ranks on 2
    cores at load 15-17, 1F1B m=8 (benchmarks/bench_pipeline.py's model): width 512
    step 233-295 -> 108-158 ms, width 16 39-49 -> 25-31 ms (3 interleaved runs each)."""
    reqs = getattr(handle, "requests", None)
    mpi = getattr(getattr(handle, "rt", None), "MPI", None)
    if reqs is None or mpi is None:
        return
    test = mpi.Request.Testall
    start = time.perf_counter()
    while not test(reqs):
        waited = time.perf_counter() - start
        if waited > NAP_FOR:
            return
        if waited > SPIN:
            time.sleep(NAP)


class _Route:
    """What start_transfer needs of one (source sharding, shape, dtype, destination),
    worked out once: the plan, the SBP to box to first, this process' destination
    shards and their shapes, and for simulated devices the copies to make."""

    def __init__(self, x, dst_pl, dst_sbp, rt):
        src = x._sharding
        self.plan = plan = plan_transfer(x.shape, x.dtype, src.placement, src.sbp, dst_pl, dst_sbp)
        if not hasattr(plan, "dst_sharding"):
            plan.dst_sharding = Sharding(dst_pl, plan.dst_sbp)
        self.pre = plan.pre_sbp if plan.pre_sbp != src.sbp else None
        self.mpi = hasattr(rt, "p2p_start")
        mine = _my_dst_indices(rt, dst_pl)
        self.shapes = [
            (j, local_shape(plan.shape, plan.dst_sbp, dst_pl.hierarchy, dst_pl.coords(j)))
            for j in mine
        ]
        # simulated: a destination shard that one message fills whole is a copy of it
        by_dst = {}
        for m in plan.messages:
            by_dst.setdefault(m.dst, []).append(m)
        self.whole = {}
        for j, shape in self.shapes:
            msgs = by_dst.get(j, [])
            if len(msgs) == 1 and tuple(sl.stop - sl.start for sl in msgs[0].dst_slice) == shape:
                self.whole[j] = msgs[0]


_routes = {}


def start_transfer(x, dst_pl, dst_sbp, tag=0):
    """Start moving global array `x` onto (dst_pl, dst_sbp); returns a PendingTransfer.

    Every rank calls this in the same order (ranks outside both placements do nothing);
    `tag` tells apart transfers in flight between the same two ranks.
    """
    rt = runtime()
    key = (x._sharding, x.shape, x.dtype, dst_pl, tuple(dst_sbp), id(rt))
    route = _routes.get(key)
    if route is None:
        if len(_routes) > 4096:
            _routes.clear()
        route = _routes[key] = _Route(x, dst_pl, dst_sbp, rt)
    plan = route.plan
    if route.pre is not None:
        x = x.to_global(sbp=route.pre)
    shards = x._value.shards
    out = {}
    if not route.mpi:  # simulated devices: every shard is here
        for j, shape in route.shapes:
            m = route.whole.get(j)
            if m is not None:
                out[j] = np.array(shards[m.src][m.src_slice], plan.dtype)
            else:
                out[j] = np.zeros(shape, plan.dtype)
        for m in plan.messages:
            if m.dst not in route.whole:
                out[m.dst][m.dst_slice] = shards[m.src][m.src_slice]
        rt.bytes_moved += plan.p2p_bytes
        return PendingTransfer(plan, x._weak, out, [])
    for j, shape in route.shapes:
        if j not in route.whole:  # (a shard one message fills is its receive buffer)
            out[j] = np.zeros(shape, plan.dtype)
    me = rt.rank
    sends, recvs, fill = [], [], []
    for m in plan.messages:
        s_rank, d_rank = plan.src_pl.ranks[m.src], dst_pl.ranks[m.dst]
        whole = route.whole.get(m.dst) is m
        if s_rank == me and d_rank == me:
            piece = _host(shards[m.src][m.src_slice])
            if whole:
                out[m.dst] = np.array(piece, plan.dtype)
            else:
                out[m.dst][m.dst_slice] = piece
        elif s_rank == me:
            sends.append((d_rank, np.ascontiguousarray(_host(shards[m.src][m.src_slice]))))
        elif d_rank == me:
            shape = tuple(s.stop - s.start for s in m.dst_slice)
            fill.append((m.dst, None if whole else m.dst_slice, len(recvs)))
            recvs.append((s_rank, shape, plan.dtype))
    handle = rt.p2p_start(sends, recvs, tag) if sends or recvs else None
    return PendingTransfer(plan, x._weak, out, fill, handle)


def _host(a):
    # the NCCL runtime's shards are device arrays; the transfer's buffers are on the host
    return a.get() if hasattr(a, "get") else a


def _my_dst_indices(rt, pl):
    if not hasattr(rt, "p2p_start"):
        return list(range(pl.size))
    return [i for i, r in enumerate(pl.ranks) if r == rt.rank]


_tag_counter = itertools.count()


def transfer(x, dst_pl, dst_sbp):
    """Move global array `x` onto (dst_pl, dst_sbp) and wait for it (eager to_global)."""
    # tags 20000.. (fflow.pipeline's transfers in flight use the ones below)
    return start_transfer(x, dst_pl, dst_sbp, tag=20000 + next(_tag_counter) % 10000).wait()


if transfer not in sharding.placement_movers:
    sharding.placement_movers.insert(0, transfer)
