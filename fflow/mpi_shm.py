"""Deterministic all-reduces through an MPI shared-memory window, for a group whose
ranks share one node (what MPICH and NCCL do inside a node, with fflow's order).

Each member copies its value into its own slot of a window (`MPI.Win.Allocate_shared`
over the group's communicator), the group synchronizes once (`Ibarrier`, waited on
through `fflow.mpi_faults`, so a missing rank is an error, not a hang), and then reads
the other members' slots directly:

* `rows`: every member reduces all p slots in group order into its own result: one
  synchronization, p-1 full-size additions (the one-all-gather path of `mpi_ops`
  without the all-gather's copies through MPI's shared-memory queues);
* `two_step`: member j reduces chunk j of the p slots in group order into a shared
  result, a second synchronization, and every member copies the result out (the
  two-step path: 1/p of the additions, two synchronizations).

The additions are `mpi_ops._reduce_rows`' (acc = slot 0; acc = acc op slot k for k =
1..p-1), so the bits are the simulated runtime's. Windows are kept per (communicator,
capacity class) and shared by every plan of that class; each call toggles the window's
parity (two input slots per member), so a member writing call k+2's value never
overwrites what a slower member still reads of call k: it passed call k+1's barrier,
which every member reached only after reading call k's slots. Window creation is
collective; it happens while a program is planned, which every member does at the
same call. `Win_sync` around each barrier orders the stores for MPI's unified memory
model. Budget: SHM_BYTES per rank (over it, `mpi_ops` keeps its MPI paths).

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

from sys import getrefcount

import numpy as np

SHM_BYTES = 64 << 20  # window bytes per rank at most (every rank counts the same way)
_MIN_CAP = 4 << 10

_node = {}  # id(comm) -> (comm, whether every member is on this node)
_windows = {}  # (id(comm), capacity) -> _Window
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
    """A shared window of `cap`-byte slots: per member two input slots (parities) and
    one result area; member 0's result area holds the two-step path's result."""

    def __init__(self, comm, cap, MPI):
        self.comm, self.cap = comm, cap
        self.win = MPI.Win.Allocate_shared(3 * cap, 1, comm=comm)
        self.win.Lock_all(MPI.MODE_NOCHECK)
        self.parity = [0]
        self.slots = []  # per member: (input parity 0, input parity 1, result) uint8 views
        for r in range(comm.Get_size()):
            buf, _ = self.win.Shared_query(r)
            raw = np.frombuffer(buf, np.uint8, 3 * cap)
            self.slots.append(tuple(raw[j * cap : (j + 1) * cap] for j in range(3)))
        win, ibarrier = self.win, comm.Ibarrier

        def sync(rt, ranks, what):
            win.Sync()
            rt.wait([ibarrier()], ranks, what)
            win.Sync()

        self.sync = sync


def window(comm, nbytes, MPI):
    """The shared window of `comm` for values of up to `nbytes` (capacity: the next
    power of two), created on first use; None over SHM_BYTES."""
    cap = max(_MIN_CAP, 1 << max(0, nbytes - 1).bit_length())
    key = (id(comm), cap)
    w = _windows.get(key)
    if w is None:
        if _used[0] + 3 * cap > SHM_BYTES:
            return None
        _used[0] += 3 * cap
        w = _windows[key] = _Window(comm, cap, MPI)
    return w


def _views(w, nbytes, dtype, size):
    p = w.comm.Get_size()
    ins = [[w.slots[r][b][:nbytes].view(dtype) for b in (0, 1)] for r in range(p)]
    return ins, w.slots[0][2][:nbytes].view(dtype)[:size]


def planned_rows(comm, ranks, shape, dtype, fn, moved, keep, MPI):
    """All-reduce `run(rt, x, what)` on the window: copy in, one barrier, every member
    reduces the p slots in group order into its result (None: no window)."""
    size = int(np.prod(shape, dtype=np.int64))
    w = window(comm, size * dtype.itemsize, MPI)
    if w is None:
        return None
    p, me = comm.Get_size(), comm.Get_rank()
    ins, _ = _views(w, size * dtype.itemsize, dtype, size)
    mine = [ins[me][b].reshape(shape) for b in (0, 1)]
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
    chunk j (balanced sizes) of the p slots in group order into the shared result, a
    barrier, copy out (None: no window)."""
    size = int(np.prod(shape, dtype=np.int64))
    w = window(comm, size * dtype.itemsize, MPI)
    if w is None:
        return None
    p, me = comm.Get_size(), comm.Get_rank()
    ins, res = _views(w, size * dtype.itemsize, dtype, size)
    q, r = divmod(size, p)
    lo = me * q + min(me, r)
    hi = lo + q + (me < r)
    mine = [ins[me][b].reshape(shape) for b in (0, 1)]
    parts = [[ins[k][b][lo:hi] for k in range(p)] for b in (0, 1)]
    dst, whole = res[lo:hi], res.reshape(shape)
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
        fn(rows[0], rows[1], out=dst)
        for k in range(2, p):
            fn(dst, rows[k], out=dst)
        sync(rt, ranks, what)
        np.copyto(out, whole)
        return out

    return two_step
