"""fflow's collectives as mpi4py buffer collectives (no pickling on the data path).

Each function gets a communicator of the collective's group (members in group
order, so communicator rank j is member j), the local NumPy value and the
primitive's params, starts the uppercase non-blocking MPI call on contiguous
buffers (`Iallreduce`, `Ialltoallv`, `Iallgatherv`, `Ireduce_scatter`, `Isend` /
`Irecv`), and waits through `fflow.mpi_faults` so a missing rank is an error, not a
hang. Data moves as raw bytes (any dtype: bfloat16, float16, bool, ...); only the
native reductions use typed buffers.

Two reduction modes (config `mpi_deterministic`, FFLOW_MPI_DETERMINISTIC):

* deterministic (the default): an all-reduce is an all-to-all of 1/p chunks, a
  reduction of the p chunks *in group order* on each rank, and an all-gather of the
  reduced chunks; a reduce-scatter is the first two steps. The arithmetic is the
  simulated runtime's (`collectives._reduce_parts`: group order, float32
  accumulation for 16-bit floats, one rounding), so results are bit-identical to it,
  at the same bytes as a ring all-reduce. 16-bit values travel as 16-bit buffers.
  Small all-reduces (value bytes x ranks <= 512 KB, config `mpi_allgather_bytes`)
  are one all-gather of the whole values and the same ordered reduction: one
  synchronization instead of two, for p-fold bytes and p-1 full-size additions. On
  a quiet machine the two-step path wins from 256 KB values at 4 ranks (value x
  ranks = 1 MB; mpi4py alone, load ~1: all-gather + ordered adds 1.50x of raw
  Allreduce, two-step 0.97x; through fflow, quiet: 1.73x on the all-gather path),
  while at 64 KB they tie (1.26-1.29x vs 1.24-1.35x). Under load (other processes on
  the cores) every synchronization costs a scheduling round and one all-gather won
  up to 1 MB moved (load ~10: 256 KB 0.84-0.97x vs 1.00-1.45x), which is why this
  was 1 MB before; the limit is set for the quiet case.
  When every member of the group shares one node (config `mpi_shared_memory`, on by
  default), deterministic all-reduces of the dtypes MPI types (not 16-bit floats) take
  the same two paths through a shared-memory window instead (fflow/mpi_shm.py): copy
  in, one `Ibarrier`, read the other members' values in place (rows: each member
  reduces everything; two-step, from value x ranks > mpi_allgather_bytes at 3+ ranks:
  each member its chunk, a second barrier, copy out). Same bits, none of the
  all-gather's / all-to-all's copies through MPI's queues. Planned calls tune between
  the window's two paths (the rows path alone up to value x ranks = mpi_allgather_bytes
  / 2) and MPI's own reduction where its bits are the same; from
  mpi_large_bytes both modes use the window, in pieces of mpi_shm.PIECE_BYTES (16 MB).
  Measured, same launch vs raw Allreduce, load 7-9 (MPI-message paths in brackets):
  4 ranks on 2 cores 64 KB 0.41x (0.55x), 256 KB 0.43x (1.34x), 1 MB 0.53x (1.08x),
  64 MB 0.97x (2.83x); 2 ranks 64 KB 0.30x (MPI's own sum, 1.18x), 16 MB 0.63x (1.05x).
  Large ones with even chunks reduce into the received buffer's own row and
  all-gather in place (one result-sized buffer). Where MPI's reduction has the same
  bits it is used instead (`exact_native`): integer sum/max/min at any group size
  and float32/float64 sums of 2 members (one IEEE addition per element, which is
  commutative; only which payload a NaN + NaN keeps may differ). Values from 2 MB on
  (config `mpi_large_bytes`), in both modes, are the two-step path in 4 MB pieces
  (PIECE_BYTES; over MPI's messages when the window is off or the ranks span nodes):
  faster here than MPICH's Allreduce, Iallreduce, chunked all-reduces
  and Reduce_scatter_block + Allgather from 2 MB to 64 MB (numbers at `_large`).
  `bytes_moved` counts the cost model's bytes of the conversion either way (what
  the simulated runtime measures).
* native: MPI's own `Iallreduce` / `Ireduce_scatter` (MPICH picks the algorithm and
  the summation order, so results can differ from the simulated runtime in the last
  bits at 3+ ranks); all-reduces from `mpi_large_bytes` on take the ordered pieces
  path of deterministic mode (it was faster). bfloat16/float16 go through a float32
  staging buffer, since MPI has no 16-bit float type and the sum must accumulate in
  float32 anyway; types MPI cannot reduce (bool, bfloat16 max/min...) use the
  deterministic path.

Why deterministic is the default: a program gives the same numbers on simulated
devices (where it is developed and tested) and on `fflow.launch` ranks, and the same
numbers at every message size and rank count (MPICH switches algorithms, and with them
the summation order, at size thresholds). What it costs: on one node, nothing (the
shared-memory window makes it faster than native mode's MPI reductions: bench_mpi.py,
same launch, load 7-11, det / native vs raw Allreduce, 4 ranks 64 KB 0.61-0.81x /
1.27-1.33x, 1 MB 0.45-0.76x / 0.94-1.10x; 2 ranks 64 KB 0.57-0.79x / 1.03-1.32x);
over MPI's messages (the window off, or ranks on several nodes) at 4 ranks on this
2-core machine 7-28% more time per all-reduce from 1 KB to 4 MB (load ~5-8: 1 KB 301
vs 249 us, 64 KB 566 vs 443 us, 1 MB 1.75 vs 1.55 ms), the price of two collectives
(all-to-all + all-gather) instead of MPI's one.
"""

import sys
import time
from itertools import accumulate
from sys import getrefcount

import numpy as np

from fflow import mpi_shm
from fflow.config import config
from fflow.primitives.collectives import _ex_combine, _reduce_parts
from fflow.sharding import balanced

_det, _small, _large, _tune = [True], [1 << 19], [2 << 20], [4]  # config (set by hooks)
_shm = [True]
_modes = {}  # (deterministic, allgather bytes, large bytes, tune calls, shm) -> a small int
mode = [0]  # the current setting's int: planned collectives (`planned`) are kept per mode


def _setter(cell, kind):
    def hook(v):
        cell[0] = kind(v)
        key = (_det[0], _small[0], _large[0], _tune[0], _shm[0])
        mode[0] = _modes.setdefault(key, len(_modes))

    return hook


# config mpi_deterministic, mirrored in _det by its update hook (read per call)
config.define("mpi_deterministic", True, hook=_setter(_det, bool))

# all-reduces of at most this many bytes (value bytes x ranks) are one all-gather and an
# ordered reduction (config mpi_allgather_bytes; see the module docstring for why 512 KB)
config.define("mpi_allgather_bytes", 1 << 19, hook=_setter(_small, int))
# calls per path timed before a planned all-reduce near that limit picks one (`_tuned`)
config.define("mpi_tune_calls", 4, hook=_setter(_tune, int))
# planned deterministic all-reduces of ranks on one node go through a shared-memory window
# (fflow/mpi_shm.py: the same ordered reduction without MPI's message copies)
config.define("mpi_shared_memory", True, hook=_setter(_shm, bool))
SHM_NATIVE_BYTES = 4 << 10  # see `all_reduce`
_NATIVE = ("float32", "float64", "int32", "int64", "uint32", "uint64", "int8", "uint8")
_HALF = ("float16", "bfloat16")
_REDUCIBLE = frozenset(_NATIVE + _HALF)


_MPI = None


def _mpi():
    global _MPI
    if _MPI is None:
        from mpi4py import MPI  # loaded only when MPI is used

        _MPI = MPI
    return _MPI


def _reduce_rows(rows, op, dtype):
    """`collectives._reduce_parts` of the rows of a fresh (p, n) buffer, accumulated in
    place into row 0 (the same additions in the same order, so the same bits, without
    a new array per step); 16-bit float sums take `_reduce_parts` (float32 accumulation)."""
    if op == "sum" and dtype.kind == "f" and dtype.itemsize < 4 or _name(dtype) == "bfloat16":
        return np.asarray(_reduce_parts(list(rows), op, dtype))
    acc = rows[0]
    fn = _REDUCE[op]
    for k in range(1, len(rows)):
        fn(acc, rows[k], out=acc)
    return acc


_REDUCE = {"sum": np.add, "max": np.maximum, "min": np.minimum}


_kept = {}  # (shape, dtype) -> the last buffer of that kind handed out
KEEP_BYTES = 256 << 20  # at most this much kept for reuse (oldest kinds dropped first)


def _empty(shape, dtype):
    """np.empty(shape, dtype), or the last buffer of this shape and dtype when nothing
    holds it any more (its result was dropped: a step's gradients, a benchmark's
    output), still in cache and without a fresh allocation's page faults. References
    are counted, so a buffer anything still refers to (an array, a view of it, a
    memoryview, an MPI request) is never handed out again."""
    key = (shape, dtype)
    buf = _kept.get(key)
    # 3 references: _kept, `buf` and getrefcount's argument
    if buf is None or sys.getrefcount(buf) > 3:
        buf = np.empty(shape, dtype)
        _kept.pop(key, None)
        total = buf.nbytes + sum(b.nbytes for b in _kept.values())
        while _kept and total > KEEP_BYTES:
            total -= _kept.pop(next(iter(_kept))).nbytes
        if total <= KEEP_BYTES:
            _kept[key] = buf
    return buf


_cells = {}  # (shape, dtype) -> [the last buffer of that kind a planned collective returned]


def _cell(shape, dtype):
    """The one-buffer cell that planned collectives with results of this shape and
    dtype share (so a program's deterministic and native plans, or two programs of the
    same shape, reuse one buffer, as `_empty` does). `buf = cell[0]` is reusable when
    getrefcount(buf) == 3 (the cell, `buf`, getrefcount's argument)."""
    key = (tuple(shape), np.dtype(dtype))
    cell = _cells.get(key)
    if cell is None:
        nbytes = int(np.prod(key[0], dtype=np.int64)) * key[1].itemsize
        if _cell_bytes[0] + nbytes > KEEP_BYTES:
            return None  # over the budget: the caller takes the general path (`_empty`)
        _cell_bytes[0] += nbytes
        cell = _cells[key] = [np.empty(key[0], key[1])]
    return cell


_cell_bytes = [0]  # bytes of the cells' buffers (at most KEEP_BYTES, as `_empty`'s)


def _raw(a):
    """A contiguous array's bytes as a 1-D uint8 view (any dtype, bfloat16 included)."""
    return a.reshape(-1).view(np.uint8)


def _contig(a):
    """C-contiguous (np.ascontiguousarray would turn a 0-d array into 1-d)."""
    a = np.asarray(a)
    return a if a.flags.c_contiguous else a.copy(order="C")


def _bounds(sizes):
    return list(accumulate(sizes, initial=0))[:-1]


_OPS = {}


def _native_op(op):
    got = _OPS.get(op)
    if got is None:
        MPI = _mpi()
        got = _OPS[op] = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[op]
    return got


_names = {}


def _name(dtype):
    """A dtype's name (cached: `dtype.name` costs microseconds per call)."""
    name = _names.get(dtype)
    if name is None:
        name = _names[dtype] = np.dtype(dtype).name
    return name


def use_native(dtype):
    if _det[0]:
        return False
    return _name(dtype) in _REDUCIBLE


_INTS = frozenset(("int32", "int64", "uint32", "uint64", "int8", "uint8"))
# all-reduces of values from this size on, in both modes, are the ordered two-step path in
# pieces of PIECE_BYTES (config mpi_large_bytes). Standalone mpi4py, 2 ranks, load 0.2,
# float32 sums vs blocking Allreduce (same-launch medians): two-step in 4 MB pieces 2 MB
# 0.71x, 4 MB 0.72x, 8 MB 0.66x, 16 MB 0.78x, 32 MB 0.26x, 64 MB 0.27x; Iallreduce+Wait
# 0.95-1.00x; MPI all-reduces in 256 KB-4 MB pieces 0.87-1.19x up to 16 MB;
# Reduce_scatter_block + Allgather 0.84-1.10x; Ialltoallv pieces ran 0.76-0.91x where
# Ialltoall ran 0.52-0.73x (even chunks). Through fflow (P -> B, load 0.5-0.8) vs raw,
# 4 MB pieces against the path before: 2 ranks 4 MB 0.69 vs 1.12x, 8 MB 1.08 vs 1.21x,
# 16 MB 1.00 vs 1.45x (native 1.32x), 32 MB 0.33 vs 1.12x; 4 ranks 4 MB 0.80 vs 0.67x,
# 16 MB 0.95 vs 0.83x (native 1.45x), 32 MB 0.31 vs 0.39x. 1 MB pieces: 1.19-1.21x at
# 8-16 MB (more synchronizations).
config.define("mpi_large_bytes", 2 << 20, hook=_setter(_large, int))
PIECE_BYTES = 4 << 20


def exact_native(dtype, op, p):
    """Whether MPI's own reduction gives the ordered reduction's bits: integers (their
    sum, max and min are exact in any order) and float32/float64 sums of 2 members (one
    IEEE addition per element, and a + b == b + a bit for bit; only which NaN's payload
    survives a NaN + NaN may differ)."""
    name = _name(dtype)
    return name in _INTS or (p == 2 and op == "sum" and name in _F3264)


_F3264 = frozenset(("float32", "float64"))


def _alltoall_chunks(rt, comm, ranks, flat, sizes, rest, what):
    """Send block j of `flat` (sizes[j] * rest elements) to member j; returns the
    received blocks stacked in group order, shape (p, sizes[me] * rest)."""
    me = comm.Get_rank()
    p = len(sizes)
    isz = flat.dtype.itemsize
    mine = sizes[me] * rest
    recv = _empty((p, mine), flat.dtype)
    send_counts = [s * rest * isz for s in sizes]
    req = comm.Ialltoallv(
        [_raw(flat), (send_counts, _bounds(send_counts)), _mpi().BYTE],
        [_raw(recv), ([mine * isz] * p, [j * mine * isz for j in range(p)]), _mpi().BYTE],
    )
    rt.wait([req], ranks, what)
    return recv


def _allgather_chunks(rt, comm, ranks, chunk, sizes, rest, what):
    isz = chunk.dtype.itemsize
    out = _empty((sum(sizes) * rest,), chunk.dtype)
    counts = [s * rest * isz for s in sizes]
    req = comm.Iallgatherv(
        [_raw(chunk), _mpi().BYTE], [_raw(out), (counts, _bounds(counts)), _mpi().BYTE]
    )
    rt.wait([req], ranks, what)
    return out


# -- all_reduce: P -> B ------------------------------------------------------------
def all_reduce(rt, comm, ranks, x, params, what):
    op = params["op"]
    if not x.flags.c_contiguous:
        x = _contig(x)
    p = comm.Get_size()
    me = comm.Get_rank()
    q, r = divmod(x.size, p)
    mine = q + (me < r)  # balanced(x.size, p)[me]
    rt.bytes_moved += ((x.size - mine) + (p - 1) * mine) * x.itemsize
    name = _name(x.dtype)
    flat = x.reshape(-1)
    large = x.nbytes >= _large[0] and x.size >= p
    exact = name in _INTS or (p == 2 and op == "sum" and name in _F3264)  # exact_native
    # (below 4 KB MPI's own reduction, where its bits are the same, is one message and
    # as fast: 2 ranks, 1 KB, 0.67x of raw Allreduce vs 0.77x on the window, load 9.5)
    det = _det[0] and not (exact and x.nbytes < SHM_NATIVE_BYTES)
    if (det or large) and _shm[0] and name in _NATIVE and x.size and p > 1:
        # the ordered paths through a shared-memory window (mpi_shm.py), in both modes
        # from mpi_large_bytes (as the pieces path below)
        if mpi_shm.on_one_node(comm, _mpi()):
            out = _empty(x.shape, x.dtype)
            two = p > 2 and x.nbytes * p > _small[0]
            if mpi_shm.all_reduce(
                rt, comm, ranks, flat, _REDUCE[op], out.reshape(-1), two, what, _mpi()
            ):
                return out
    if large:
        return _pieces_all_reduce(rt, comm, ranks, flat, op, what).reshape(x.shape)
    if exact or (not _det[0] and name in _REDUCIBLE and not (name in _HALF and op != "sum")):
        return _native_all_reduce(rt, comm, ranks, x, op, what, name)
    if x.nbytes * p <= _small[0]:
        # small: one all-gather of the whole values, then the same ordered reduction
        # (latency, not bandwidth, is what a small all-reduce costs)
        rows = _empty((p, x.size), x.dtype)
        req = comm.Iallgather([_raw(flat), _mpi().BYTE], [_raw(rows), _mpi().BYTE])
        rt.wait([req], ranks, what)
        return _reduce_rows(rows, op, x.dtype).reshape(x.shape)
    sizes = balanced(x.size, p)
    parts = _alltoall_chunks(rt, comm, ranks, flat, sizes, 1, what)
    return _gather_reduced(rt, comm, ranks, parts, sizes, op, what).reshape(x.shape)


def planned(name, comm, ranks, params, shape, dtype):
    """`run(rt, x, what) -> result` for collective `name` over `comm` on local values of
    a fixed `shape` and `dtype` (a sharded program's single collective, planned once per
    config mode, see `mode`). An all-reduce's path, result buffer and byte count are
    chosen here, so a call is the MPI call, the wait and, on the all-gather path, the
    ordered reduction; the result buffer is reused while nothing refers to the last
    result (as `_empty`). Other collectives and paths call their OPS function."""
    op = params.get("op")
    dtype = np.dtype(dtype)
    p = comm.Get_size()
    size = int(np.prod(shape, dtype=np.int64))
    nbytes, kind = size * dtype.itemsize, _name(dtype)
    typed = kind in _NATIVE and size > 0  # mpi4py maps these dtypes to MPI types
    fn = OPS[name]

    def general(rt, x, what):
        return fn(rt, comm, ranks, x, params, what)

    if name != "all_reduce" or not typed or nbytes >= _large[0] or p < 2:
        return general
    q, r = divmod(size, p)
    mine = q + (comm.Get_rank() < r)
    moved = ((size - mine) + (p - 1) * mine) * dtype.itemsize
    native = None
    if exact_native(dtype, op, p) or not _det[0]:
        native = _planned_native(comm, ranks, shape, dtype, op, moved)
        if not _det[0]:
            return native or general
    rows = two = None
    keep = _cell(shape, dtype) if _shm[0] and mpi_shm.on_one_node(comm, _mpi()) else None
    if keep is not None:  # one node: the ordered paths on a shared window (mpi_shm.py)
        args = (comm, ranks, shape, dtype, _REDUCE[op], moved, keep, _mpi())
        rows = mpi_shm.planned_rows(*args)
        # (the two-step path's second barrier does not pay below half the all-gather
        # limit: 4 ranks, 16-64 KB, rows 0.48-0.93x of raw vs two-step 0.64-0.97x; timing
        # both there can pick the slower under noise)
        if rows is not None and nbytes * p > _small[0] // 2:
            two = mpi_shm.planned_two_step(*args)
    if native is not None and rows is None:  # MPI's own reduction has the same bits
        return native
    window = rows is not None
    if rows is None and nbytes * p <= _small[0] * 8:
        rows = _planned_rows(comm, ranks, shape, dtype, op, moved)
    if not window and size % p == 0 and nbytes * p > _small[0] // 4:
        two = _planned_two_step(comm, ranks, shape, dtype, op, moved)
    static = rows if nbytes * p <= _small[0] else two
    others = [c for c in (rows, two, native) if c is not None and c is not static]
    if _tune[0] > 0 and static is not None and others:
        return _tuned(comm, ranks, [static, *others], _tune[0])
    return static or general


def _planned_native(comm, ranks, shape, dtype, op, moved):
    """MPI's own all-reduce (`Iallreduce`) into a reused result buffer, planned (None
    over the buffer budget)."""
    start, mpi_op = comm.Iallreduce, _native_op(op)
    keep = _cell(shape, dtype)
    if keep is None:
        return None

    def native(rt, x, what):
        out = keep[0]
        if getrefcount(out) > 3:  # the last result is still referred to
            out = keep[0] = np.empty(shape, dtype)
        if not x.flags.c_contiguous:
            x = _contig(x)
        rt.bytes_moved += moved
        rt.wait([start(x, out, mpi_op)], ranks, what)
        return out

    return native


def _planned_rows(comm, ranks, shape, dtype, op, moved):
    """The one-all-gather path of `all_reduce`, planned (None over the buffer budget)."""
    p, size = comm.Get_size(), int(np.prod(shape, dtype=np.int64))
    gather, fn = comm.Iallgather, _REDUCE[op]
    keep = _cell((p, size), dtype)
    if keep is None:
        return None

    def rows(rt, x, what):  # one all-gather, then the ordered reduction into row 0
        buf = keep[0]
        if getrefcount(buf) > 3:
            buf = keep[0] = np.empty((p, size), dtype)
        if not x.flags.c_contiguous:
            x = _contig(x)
        rt.bytes_moved += moved
        rt.wait([gather(x.reshape(-1), buf)], ranks, what)
        acc = buf[0]
        for k in range(1, p):
            fn(acc, buf[k], out=acc)
        return acc.reshape(shape)

    return rows


def _tuned(comm, ranks, candidates, calls):
    """Where several deterministic paths fit (both window paths, and MPI's own reduction
    where its bits are the same; without a window, near the all-gather limit: value
    bytes x ranks from a quarter to 8x of mpi_allgather_bytes) they give the same bits;
    which is faster depends on the machine and its load (quiet: the two-step path from
    256 KB values at 4 ranks; loaded: one synchronization fewer wins). The first
    `calls` calls of each run in turn and are timed; then one
    all-reduce (MAX) of each path's median time over the group picks the same path on
    every rank, used from then on. Config mpi_tune_calls (0: the limit alone decides)."""
    times = [[] for _ in candidates]
    state = [0, None]  # calls so far, the chosen path
    perf = time.perf_counter

    def tuned(rt, x, what):
        best = state[1]
        if best is not None:
            return best(rt, x, what)
        k = state[0] % len(candidates)
        state[0] += 1
        t0 = perf()
        y = candidates[k](rt, x, what)
        times[k].append(perf() - t0)
        if state[0] == calls * len(candidates):
            mine = np.array([np.median(t) for t in times])
            slowest = np.empty_like(mine)
            rt.wait([comm.Iallreduce(mine, slowest, op=_native_op("max"))], ranks, what)
            state[1] = candidates[int(np.argmin(slowest))]
        return y

    tuned.candidates = candidates
    tuned.chosen = lambda: state[1]
    return tuned


def _planned_two_step(comm, ranks, shape, dtype, op, moved):
    """The two-step path of `all_reduce` for even chunks, planned: all-to-all into a
    (p, size / p) buffer, the ordered reduction into this member's row, the all-gather
    in place; the buffer is the result (reused as in `planned`)."""
    p, me = comm.Get_size(), comm.Get_rank()
    width = int(np.prod(shape, dtype=np.int64)) // p
    a2a, gather, in_place = comm.Ialltoall, comm.Iallgather, _mpi().IN_PLACE
    keep = _cell((p, width), dtype)
    if keep is None:
        return None

    def two_step(rt, x, what):
        buf = keep[0]
        if getrefcount(buf) > 3:
            buf = keep[0] = np.empty((p, width), dtype)
        if not x.flags.c_contiguous:
            x = _contig(x)
        rt.bytes_moved += moved
        rt.wait([a2a(x.reshape(-1), buf)], ranks, what)
        _reduce_into_row(buf, me, op)
        rt.wait([gather(in_place, buf)], ranks, what)
        return buf.reshape(shape)

    return two_step


def _pieces_all_reduce(rt, comm, ranks, flat, op, what):
    """A large all-reduce as the two-step path (all-to-all of 1/p chunks, ordered
    reduction, all-gather) over consecutive pieces of PIECE_BYTES: each element is still
    reduced in group order, so the bits are `_reduce_parts`' at any piece size. Pieces
    hold a multiple of p elements (even chunks: MPICH's Ialltoall / Iallgather, faster
    than their v-variants here); the last one may be uneven. The reduced chunks are
    all-gathered straight into the result."""
    MPI = _mpi()
    p, me = comm.Get_size(), comm.Get_rank()
    dtype, n = flat.dtype, flat.size
    isz = dtype.itemsize
    step = max(p, PIECE_BYTES // isz // p * p)
    out = _empty((n,), dtype)
    raw_out = _raw(out)
    width = -(-min(step, n) // p)  # the largest chunk
    recv = _empty((p, width), dtype)
    row_at = [j * width * isz for j in range(p)]
    for a in range(0, n, step):
        piece = flat[a : a + step]
        b = a * isz
        if piece.size == p * width:  # even chunks
            req = comm.Ialltoall([_raw(piece), MPI.BYTE], [_raw(recv), MPI.BYTE])
            rt.wait([req], ranks, what)
            reduced = _contig(_reduce_rows(recv, op, dtype))
            dst = [raw_out[b : b + piece.nbytes], MPI.BYTE]
            req = comm.Iallgather([_raw(reduced), MPI.BYTE], dst)
            rt.wait([req], ranks, what)
            continue
        sizes = balanced(piece.size, p)
        mine = sizes[me]
        counts = [s * isz for s in sizes]
        req = comm.Ialltoallv(
            [_raw(piece), (counts, _bounds(counts)), MPI.BYTE],
            [_raw(recv), ([mine * isz] * p, row_at), MPI.BYTE],
        )
        rt.wait([req], ranks, what)
        reduced = _contig(_reduce_rows(recv[:, :mine], op, dtype))
        req = comm.Iallgatherv(
            [_raw(reduced), MPI.BYTE],
            [raw_out[b : b + piece.nbytes], (counts, _bounds(counts)), MPI.BYTE],
        )
        rt.wait([req], ranks, what)
    return out


def _reduce_into_row(rows, me, op):
    """rows[me] = ((rows[0] op rows[1]) op rows[2]) ... in group order (the bits of
    `_reduce_parts`), accumulating in rows[0] until row `me` is reached."""
    fn = _REDUCE[op]
    acc = rows[0]
    for k in range(1, len(rows)):
        dst = rows[me] if k >= me else acc
        fn(acc, rows[k], out=dst)
        acc = dst


def _native_all_reduce(rt, comm, ranks, x, op, what, name):
    if name in _HALF:
        buf = x.astype(np.float32)
        req = comm.Iallreduce(_mpi().IN_PLACE, buf, op=_native_op(op))
        rt.wait([req], ranks, what)
        return buf.astype(x.dtype)
    out = _empty(x.shape, x.dtype)
    req = comm.Iallreduce(x, out, op=_native_op(op))
    rt.wait([req], ranks, what)
    return out


def start_all_reduce(comm, flat, op, owned=False):
    """Start a native or deterministic all-reduce of a flat buffer; `finish_all_reduce`
    completes it (gradient buckets overlap this with the backward pass). `owned`: the
    caller gives `flat` away (a bucket's packed copy), so native mode reduces in place.
    Small buffers take the one-all-gather path of `all_reduce` (one latency)."""
    MPI = _mpi()
    p = comm.Get_size()
    sizes = balanced(flat.size, p)
    me = comm.Get_rank()
    name, exact = _name(flat.dtype), exact_native(flat.dtype, op, p)
    if _det[0] and _shm[0] and name in _NATIVE and p > 1 and flat.size:
        # one node: on a window lane of its own (mpi_shm.start), unless MPI's own
        # reduction has the same bits and the bucket is small (see `all_reduce`)
        if not (exact and flat.nbytes < SHM_NATIVE_BYTES) and mpi_shm.on_one_node(comm, MPI):
            got = mpi_shm.start(comm, flat, MPI)
            if got is not None:
                return ("window", got[0], got[1], sizes, op)
    if (use_native(flat.dtype) and _name(flat.dtype) not in _HALF) or exact_native(
        flat.dtype, op, p
    ):
        if owned:
            req = comm.Iallreduce(MPI.IN_PLACE, flat, op=_native_op(op))
            return ("native", req, flat, sizes, op)
        out = np.empty_like(flat)
        return ("native", comm.Iallreduce(flat, out, op=_native_op(op)), out, sizes, op)
    if flat.nbytes * p <= _small[0]:
        rows = np.empty((p, flat.size), flat.dtype)
        req = comm.Iallgather([_raw(flat), MPI.BYTE], [_raw(rows), MPI.BYTE])
        return ("rows", req, rows, sizes, op)
    isz = flat.dtype.itemsize
    mine = sizes[me]
    recv = _empty((p, mine), flat.dtype)
    counts = [s * isz for s in sizes]
    req = comm.Ialltoallv(
        [_raw(flat), (counts, _bounds(counts)), MPI.BYTE],
        [_raw(recv), ([mine * isz] * p, [j * mine * isz for j in range(p)]), MPI.BYTE],
    )
    return ("chunks", req, recv, sizes, op)


def finish_all_reduce(rt, comm, ranks, handle, what):
    kind, req, buf, sizes, op = handle
    rt.wait([req], ranks, what)
    if kind == "native":
        return buf
    if kind == "rows":
        return _reduce_rows(buf, op, buf.dtype).reshape(-1)
    if kind == "window":
        p, nbytes = comm.Get_size(), buf[3] * buf[4].itemsize
        two = p > 2 and nbytes * p > _small[0]
        return mpi_shm.finish(rt, comm, ranks, buf, _REDUCE[op], two, what)
    return _gather_reduced(rt, comm, ranks, buf, sizes, op, what)


def _gather_reduced(rt, comm, ranks, parts, sizes, op, what):
    """The all-gather half of a deterministic all-reduce: `parts` (p, sizes[me]) are
    the received chunks; returns the flat reduced value. Even chunks of a 32/64-bit
    type are reduced into row `me` and all-gathered in place (the received buffer is
    the result's layout: one full-size buffer instead of two)."""
    me = comm.Get_rank()
    if min(sizes) == max(sizes) and _name(parts.dtype) not in _HALF:
        _reduce_into_row(parts, me, op)
        req = comm.Iallgather(_mpi().IN_PLACE, [_raw(parts), _mpi().BYTE])
        rt.wait([req], ranks, what)
        return parts.reshape(-1)
    reduced = _contig(_reduce_rows(parts, op, parts.dtype))
    return _allgather_chunks(rt, comm, ranks, reduced, sizes, 1, what)


# -- all_gather: S(axis) -> B --------------------------------------------------------
def all_gather(rt, comm, ranks, x, params, what):
    axis, sizes = params["axis"], list(params["sizes"])
    x = _contig(x)
    rt.bytes_moved += (comm.Get_size() - 1) * x.nbytes
    # the pieces as they are (no transposed copy of the input); along axis 0 they are
    # consecutive rows of the result, along others they are joined once
    shapes = [x.shape[:axis] + (s,) + x.shape[axis + 1 :] for s in sizes]
    counts = [int(np.prod(sh, dtype=np.int64)) for sh in shapes]
    flat = None
    if _shm[0] and len(sizes) > 1 and mpi_shm.on_one_node(comm, _mpi()):  # one node
        flat = _empty((sum(counts),), x.dtype)
        if not mpi_shm.all_gather(rt, comm, ranks, x, counts, flat, what, _mpi()):
            flat = None
    if flat is None:
        flat = _allgather_chunks(rt, comm, ranks, x.reshape(-1), counts, 1, what)
    if axis == 0:
        return flat.reshape((sum(sizes),) + x.shape[1:])
    starts = _bounds(counts)
    blocks = [flat[a : a + c].reshape(sh) for a, c, sh in zip(starts, counts, shapes)]
    return np.concatenate(blocks, axis=axis)


# -- reduce_scatter: P(op) -> S(axis) ----------------------------------------------------
def reduce_scatter(rt, comm, ranks, x, params, what):
    op, axis, sizes = params["op"], params["axis"], list(params["sizes"])
    me = comm.Get_rank()
    x = np.asarray(x)
    shape = x.shape[:axis] + (sizes[me],) + x.shape[axis + 1 :]
    rest = x.size // max(sum(sizes), 1)  # elements per index along `axis`
    rt.bytes_moved += (sum(sizes) - sizes[me]) * rest * x.itemsize
    name = _name(x.dtype)
    if _det[0] and _shm[0] and name in _NATIVE and len(sizes) > 1:  # one node: the window
        if mpi_shm.on_one_node(comm, _mpi()):
            lo = sum(sizes[:me]) * rest

            def fill(dst):  # (the pieces' layout below, written into this rank's slot)
                _pieces(x, axis, sizes, dst)

            hi, fn = lo + sizes[me] * rest, _REDUCE[op]
            args = (rt, comm, ranks, fill, x.size, x.dtype, lo, hi, fn, what, _mpi())
            got = mpi_shm.reduce_scatter(*args)
            if got is not None:
                return got.reshape(shape)
    # member j's piece (along `axis`) is block j of the send buffer, in its own C
    # layout, so what this member gets back is its piece as it is: no transposed copy
    # of the whole value (moveaxis + copy: 5.5 ms for 4 MB on axis 1, vs 0.7 on axis 0)
    send = _pieces(x, axis, sizes)
    if use_native(x.dtype) and name not in _HALF:
        out = np.empty(shape, x.dtype)
        req = comm.Ireduce_scatter(send, out, [s * rest for s in sizes], op=_native_op(op))
        rt.wait([req], ranks, what)
        return out
    parts = _alltoall_chunks(rt, comm, ranks, send, sizes, rest, what)
    return _reduce_parts(list(parts), op, x.dtype).reshape(shape)


def _pieces(x, axis, sizes, out=None):
    """x's pieces along `axis` (sizes) one after another, each in C order: a view of x
    when they already are (axis 0 of a C-contiguous x), else each copied once (into
    `out`, a flat buffer of x.size elements, when given)."""
    if axis == 0 and (out is not None or x.flags.c_contiguous):
        if out is None:
            return x.reshape(-1)
        np.copyto(out.reshape(x.shape), x)
        return out
    send, k, cut = np.empty(x.size, x.dtype) if out is None else out, 0, _bounds(sizes)
    for c, s in zip(cut, sizes):
        q = x[(slice(None),) * axis + (slice(c, c + s),)]
        np.copyto(send[k : k + q.size].reshape(q.shape), q)
        k += q.size
    return send


# -- all_to_all: S(in_axis) -> S(out_axis) ------------------------------------------------
def all_to_all(rt, comm, ranks, x, params, what):
    in_axis, out_axis = params["in_axis"], params["out_axis"]
    in_sizes, out_sizes = list(params["in_sizes"]), list(params["out_sizes"])
    me = comm.Get_rank()
    x = np.asarray(x)
    isz = x.itemsize
    # member j gets my piece j along out_axis: slices of rows, packed in one send buffer
    # (row-block copies; a transposed copy of the whole input cost ~10x more)
    cut = _bounds(out_sizes)
    pieces = [x[(slice(None),) * out_axis + (slice(c, c + s),)] for c, s in zip(cut, out_sizes)]
    send = _pieces(x, out_axis, out_sizes)  # (each piece copied once, into its place)
    rt.bytes_moved += (sum(out_sizes) - out_sizes[me]) * (x.size // max(sum(out_sizes), 1)) * isz
    # from member j: its piece along in_axis, my piece along out_axis
    shapes = []
    for j in range(len(in_sizes)):
        s = list(x.shape)
        s[in_axis], s[out_axis] = in_sizes[j], out_sizes[me]
        shapes.append(tuple(s))
    recv_counts = [int(np.prod(s, dtype=np.int64)) * isz for s in shapes]
    send_counts = [q.size * isz for q in pieces]
    recv = np.empty(sum(recv_counts) // isz, x.dtype)
    req = comm.Ialltoallv(
        [_raw(send), (send_counts, _bounds(send_counts)), _mpi().BYTE],
        [_raw(recv), (recv_counts, _bounds(recv_counts)), _mpi().BYTE],
    )
    rt.wait([req], ranks, what)
    if in_axis == 0:  # the blocks are consecutive rows of the result
        return recv.reshape((sum(in_sizes),) + shapes[0][1:])
    starts = [c // isz for c in _bounds(recv_counts)]
    blocks = [recv[a : a + c // isz].reshape(sh) for a, c, sh in zip(starts, recv_counts, shapes)]
    return np.concatenate(blocks, axis=in_axis)


# -- exchange: point to point slice intersections -------------------------------------------
def exchange(rt, comm, ranks, x, params, what):
    _TAG = 11
    recvs = {}
    reqs = []
    for src, out_box in params["recvs"]:
        buf = np.empty(tuple(hi - lo for lo, hi in out_box), x.dtype)
        recvs.setdefault(src, []).append(buf)
        reqs.append(comm.Irecv([_raw(buf), _mpi().BYTE], source=src, tag=_TAG))
    keep = []
    for dst, in_box in params["sends"]:
        piece = _contig(x[tuple(slice(lo, hi) for lo, hi in in_box)])
        keep.append(piece)  # alive until the send completes
        rt.bytes_moved += piece.nbytes
        reqs.append(comm.Isend([_raw(piece), _mpi().BYTE], dest=dst, tag=_TAG))
    rt.wait(reqs, ranks, what)
    return _ex_combine(x, None, recvs, **params)


OPS = {
    "all_reduce": all_reduce,
    "all_gather": all_gather,
    "reduce_scatter": reduce_scatter,
    "all_to_all": all_to_all,
    "exchange": exchange,
}
