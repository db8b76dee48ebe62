"""Deterministic all-reduces through an MPI shared-memory window, for a group whose
ranks share one node (what MPICH and NCCL do inside a node, with fflow's order).

Each member copies its value into its own slot of a window (`MPI.Win.Allocate_shared`
over the group's communicator), the group synchronizes once (`Ibarrier`, waited on
through `fflow.mpi_faults`, so a missing rank is an error, not a hang), and then reads
the other members' slots directly:

* rows: every member reduces all p slots in group order into its own result: one
  synchronization, p-1 full-size additions (the one-all-gather path of `mpi_ops`
  without the all-gather's copies through MPI's shared-memory queues);
* two-step: member j reduces chunk j (balanced sizes) of the p slots in group order,
  in place into member 0's slot (each chunk of every slot is read by its one owner
  only), a second synchronization, and every member copies member 0's slot out: 1/p
  of the additions, two synchronizations.

Gradient buckets (`start` / `finish`, non-blocking) copy in and start an `Ibarrier` at
start, and reduce at finish; each bucket in flight has a window lane of its own.

A reduce-scatter (P -> S) is the first half of the rows path with each member reading
only its own range (one barrier, no copy out); an all-gather (S -> B, any dtype: bytes)
is copy in, one barrier, copy every member's slot out.

The additions are `mpi_ops._reduce_rows`' (acc = slot 0; acc = acc op slot k for k =
1..p-1), so the bits are the simulated runtime's. Windows are kept per (communicator,
capacity: a power of two up to PIECE_BYTES; larger values go in pieces of it) and are
shared by every plan; each member has two slots (parities) and every call or piece
toggles the window's parity, so a member writing call k+2's value never overwrites what
a slower member still reads of call k: it passed a barrier of call k+1, which every
member reached only after it was done with call k. Window creation is collective; it
happens while a program is planned or at a collective's first call of a size class,
which every member does at the same point. `Win_sync` around each barrier orders the
stores for MPI's unified memory model. Budget: SHM_BYTES per rank (over it, `mpi_ops`
keeps its MPI paths).

Example (under `python -m fflow.launch -n 4`; a P -> B all-reduce's cache hits take
this path when the ranks share a node and `mpi_shared_memory` is on)::

    import numpy as np, fflow
    from fflow.sharding import B, P
    pl = fflow.placement("cpu", list(range(fflow.process_count())))
    f = fflow.shard(lambda g: g, pl, in_sbp=P, out_sbp=B)
    g = fflow.make_global_array(np.ones(1000, np.float32), pl, P)
    for _ in range(3):
        y = f(g)  # 4.0 everywhere, the simulated runtime's bits
"""

import os
from sys import getrefcount

import numpy as np

SHM_BYTES = 128 << 20  # window bytes per rank at most (every rank counts the same way)
PIECE_BYTES = 16 << 20  # the largest window capacity: larger values go in pieces of it
_MIN_CAP = 4 << 10

_node = {}  # id(comm) -> (comm, whether every member is on this node)
_windows = {}  # (id(comm), capacity, lane) -> _Window
_used = [0]


def on_one_node(comm, MPI):
    """Whether every member of `comm` shares this node's memory (collective on the
    first call per communicator: every member gets the same answer)."""
    got = _node.get(id(comm))
    if got is None:
        local = comm.Split_type(MPI.COMM_TYPE_SHARED)
        same = local.Get_size() == comm.Get_size()
        local.Free()
        got = _node[id(comm)] = (comm, same)
    return got[1]


class _Window:
    """A shared window of two `cap`-byte slots (parities) per member."""

    def __init__(self, comm, cap, MPI):
        self.comm, self.cap = comm, cap
        self.win = MPI.Win.Allocate_shared(2 * cap, 1, comm=comm)
        self.win.Lock_all(MPI.MODE_NOCHECK)
        self.parity = [0]
        self.slots = []  # per member: (parity 0, parity 1) uint8 views
        for r in range(comm.Get_size()):
            buf, _ = self.win.Shared_query(r)
            raw = np.frombuffer(buf, np.uint8, 2 * cap)
            self.slots.append((raw[:cap], raw[cap:]))
        win, ibarrier = self.win, comm.Ibarrier

        def sync(rt, ranks, what):
            win.Sync()
            rt.wait([ibarrier()], ranks, what)
            win.Sync()

        self.sync = sync


def window(comm, nbytes, MPI, lane=0):
    """The shared window of `comm` for values of up to `nbytes` (capacity: the next
    power of two), created on first use; None over SHM_BYTES, or when the node's shared
    memory (/dev/shm) has not twice the room for the group's slots on some member
    (agreed by all members, once per size class: containers often mount 64 MB)."""
    cap = max(_MIN_CAP, 1 << max(0, nbytes - 1).bit_length())
    key = (id(comm), cap, lane)
    w = _windows.get(key)
    if w is None:
        if key in _refused or _used[0] + 2 * cap > SHM_BYTES:
            return None
        room = _shm_room() >= 2 * 2 * cap * comm.Get_size()
        if not comm.allreduce(room, op=MPI.LAND):
            _refused.add(key)
            return None
        _used[0] += 2 * cap
        w = _windows[key] = _Window(comm, cap, MPI)
    return w


_refused = set()  # (id(comm), capacity, lane) the members agreed not to allocate


def _shm_room():
    """Free bytes of the node's POSIX shared memory (where MPICH puts the window)."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:  # no /dev/shm: MPI allocates elsewhere, assume room
        return 1 << 62
    return st.f_bavail * st.f_frsize


def _views(w, nbytes, dtype):
    """Per member, its two slots' first `nbytes` as `dtype` arrays."""
    p = w.comm.Get_size()
    return [[w.slots[r][b][:nbytes].view(dtype) for b in (0, 1)] for r in range(p)]


def _planned_window(comm, shape, dtype, MPI):
    """(window, size, p, this member, every member's two slot views, this member's two
    slots shaped as the value) for a planned path, or None: no window."""
    size = int(np.prod(shape, dtype=np.int64))
    w = window(comm, size * dtype.itemsize, MPI)
    if w is None:
        return None
    p, me = comm.Get_size(), comm.Get_rank()
    ins = _views(w, size * dtype.itemsize, dtype)
    return w, size, p, me, ins, [ins[me][b].reshape(shape) for b in (0, 1)]


def planned_rows(comm, ranks, shape, dtype, fn, moved, keep, MPI):
    """All-reduce `run(rt, x, what)` on the window: copy in, one barrier, every member
    reduces the p slots in group order into its result (None: no window)."""
    got = _planned_window(comm, shape, dtype, MPI)
    if got is None:
        return None
    w, size, p, me, ins, mine = got
    parity, sync = w.parity, w.sync

    def rows(rt, x, what):
        out = keep[0]
        if getrefcount(out) > 3:  # the last result is still referred to
            out = keep[0] = np.empty(shape, dtype)
        b = parity[0] = parity[0] ^ 1
        np.copyto(mine[b], x)
        rt.bytes_moved += moved
        sync(rt, ranks, what)
        flat = out.reshape(-1)
        fn(ins[0][b], ins[1][b], out=flat)
        for k in range(2, p):
            fn(flat, ins[k][b], out=flat)
        return out

    return rows


def planned_two_step(comm, ranks, shape, dtype, fn, moved, keep, MPI):
    """All-reduce `run(rt, x, what)` on the window: copy in, a barrier, member j reduces
    chunk j (balanced sizes) of the p slots in group order into member 0's slot, a
    barrier, copy member 0's slot out (None: no window)."""
    got = _planned_window(comm, shape, dtype, MPI)
    if got is None:
        return None
    w, size, p, me, ins, mine = got
    q, r = divmod(size, p)
    lo = me * q + min(me, r)
    hi = lo + q + (me < r)
    parts = [[ins[k][b][lo:hi] for k in range(p)] for b in (0, 1)]
    whole = [ins[0][b].reshape(shape) for b in (0, 1)]
    parity, sync = w.parity, w.sync

    def two_step(rt, x, what):
        out = keep[0]
        if getrefcount(out) > 3:
            out = keep[0] = np.empty(shape, dtype)
        b = parity[0] = parity[0] ^ 1
        np.copyto(mine[b], x)
        rt.bytes_moved += moved
        sync(rt, ranks, what)
        rows = parts[b]
        acc = rows[0]  # (this chunk of every slot is read by this member only)
        for k in range(1, p):
            fn(acc, rows[k], out=acc)
        sync(rt, ranks, what)
        np.copyto(out, whole[b])
        return out

    return two_step


def all_reduce(rt, comm, ranks, flat, fn, out, two_step, what, MPI):
    """out = the ordered reduction of the members' 1-D `flat` (fn: np.add, np.maximum or
    np.minimum), through the window in pieces of its capacity (PIECE_BYTES at most): the
    rows path, or with `two_step` the two-step path. False when there is no window (the
    caller takes MPI's path)."""
    isz, dtype = flat.dtype.itemsize, flat.dtype
    w = window(comm, min(flat.nbytes, PIECE_BYTES), MPI)
    if w is None:
        return False
    p, me, step = comm.Get_size(), comm.Get_rank(), w.cap // isz
    for a in range(0, flat.size, step):
        src, dst = flat[a : a + step], out[a : a + step]
        m = src.size
        b = w.parity[0] = w.parity[0] ^ 1
        ins = [w.slots[r][b][: m * isz].view(dtype) for r in range(p)]
        np.copyto(ins[me], src)
        w.sync(rt, ranks, what)
        if two_step:  # my chunk, reduced in place into member 0's slot
            q, r = divmod(m, p)
            lo = me * q + min(me, r)
            ins = [v[lo : lo + q + (me < r)] for v in ins]
            acc = ins[0]
            for k in range(1, p):
                fn(acc, ins[k], out=acc)
            w.sync(rt, ranks, what)
            np.copyto(dst, w.slots[0][b][: m * isz].view(dtype))
            continue
        fn(ins[0], ins[1], out=dst)
        for k in range(2, p):
            fn(dst, ins[k], out=dst)
    return True


def reduce_scatter(rt, comm, ranks, fill, size, dtype, lo, hi, fn, what, MPI):
    """Elements lo:hi of the ordered reduction of the members' flat values of `size`
    elements (`fill(dst)` writes this member's into its slot): one barrier, this member
    reads its range of every slot. None without a window (or over PIECE_BYTES)."""
    nbytes = size * dtype.itemsize
    w = window(comm, nbytes, MPI) if 0 < nbytes <= PIECE_BYTES else None
    if w is None:
        return None
    p, me = comm.Get_size(), comm.Get_rank()
    b = w.parity[0] = w.parity[0] ^ 1
    ins = [w.slots[r][b][:nbytes].view(dtype) for r in range(p)]
    fill(ins[me])
    w.sync(rt, ranks, what)
    out = np.empty(hi - lo, dtype)
    fn(ins[0][lo:hi], ins[1][lo:hi], out=out)
    for k in range(2, p):
        fn(out, ins[k][lo:hi], out=out)
    return out


def all_gather(rt, comm, ranks, x, counts, out, what, MPI):
    """`out` (1-D, x's dtype) = the members' contiguous values of counts[j] elements,
    in group order: one barrier, every member copies the others' slots. False without
    a window (or over PIECE_BYTES)."""
    isz = x.dtype.itemsize
    nbytes = max(counts) * isz
    w = window(comm, nbytes, MPI) if 0 < nbytes <= PIECE_BYTES else None
    if w is None:
        return False
    b = w.parity[0] = w.parity[0] ^ 1
    np.copyto(w.slots[comm.Get_rank()][b][: x.nbytes], x.reshape(-1).view(np.uint8))
    w.sync(rt, ranks, what)
    raw, a = out.view(np.uint8), 0
    for r, c in enumerate(counts):
        raw[a : a + c * isz] = w.slots[r][b][: c * isz]
        a += c * isz
    return True


_busy = {}  # id(comm) -> the window lanes of gradient buckets in flight


def start(comm, flat, MPI):
    """Start a bucket's all-reduce (non-blocking, `finish` completes it): copy `flat`
    into this member's slot of a window lane of its own and start an `Ibarrier`; the
    data is then in place, so nothing has to progress while the backward pass computes.
    A lane is the smallest one (from 1; lane 0 is the blocking collectives') no bucket
    of this communicator has in flight: every member starts and finishes buckets in the
    same order, so all pick the same lane, and a lane is reused only after this member
    finished its last bucket, whose barrier every member passed. Returns (request,
    state), or None without a window (or over PIECE_BYTES)."""
    busy = _busy.setdefault(id(comm), set())
    lane = next(k for k in range(1, len(busy) + 2) if k not in busy)
    nbytes = flat.nbytes
    w = window(comm, nbytes, MPI, lane) if 0 < nbytes <= PIECE_BYTES else None
    if w is None:
        return None
    busy.add(lane)
    b = w.parity[0] = w.parity[0] ^ 1
    np.copyto(w.slots[comm.Get_rank()][b][:nbytes].view(flat.dtype), flat)
    w.win.Sync()
    return comm.Ibarrier(), (w, b, lane, flat.size, flat.dtype)


def finish(rt, comm, ranks, state, fn, two_step, what):
    """The flat result of a bucket `start`ed on the window, after its barrier was waited
    for: the rows path (every member reduces the p slots in group order), or with
    `two_step` this member's chunk into member 0's slot, a barrier, and a copy out."""
    w, b, lane, size, dtype = state
    w.win.Sync()
    _busy[id(comm)].discard(lane)
    p, me = comm.Get_size(), comm.Get_rank()
    ins = [w.slots[r][b][: size * dtype.itemsize].view(dtype) for r in range(p)]
    out = np.empty(size, dtype)
    if two_step:
        q, r = divmod(size, p)
        lo = me * q + min(me, r)
        part = [v[lo : lo + q + (me < r)] for v in ins]
        for k in range(1, p):
            fn(part[0], part[k], out=part[0])
        w.sync(rt, ranks, what)
        np.copyto(out, ins[0])
        return out
    fn(ins[0], ins[1], out=out)
    for k in range(2, p):
        fn(out, ins[k], out=out)
    return out
