"""NCCL for GPU placements: the MPI runtime's collectives, with the data moved by NCCL.

`NCCLRuntime` is `fflow.runtime_mpi.MPIRuntime` (one process per rank, started by
`FFLOW_RUNTIME=nccl python -m fflow.launch -n N`) where every rank drives one GPU
and collectives run on CuPy arrays through `cupy.cuda.nccl`, on the current stream
(ordered with compute on it), one communicator per group of ranks:

* all_reduce -> ncclAllReduce (any dtype NCCL has, bfloat16/float16 native);
* all_gather / reduce_scatter -> ncclAllGather / ncclReduceScatter along the split
  axis moved to the front; uneven pieces are padded to the largest piece, so no
  size headers are ever exchanged;
* all_to_all and exchange -> ncclSend/ncclRecv inside one ncclGroupStart/End, every
  message's shape computed from the collective's params;
* point to point between placements (`p2p_start`: fflow.pipeline, `to_global` /
  `with_sbp` onto other devices) -> ncclSend/ncclRecv on a communicator per pair of
  ranks, posted on the current stream in one group: the host goes on while they move,
  and `wait()` synchronizes the stream.

Communicators are created lazily per group: rank 0 of the group makes the NCCL
unique id and sends it to the members over MPI (metadata only). CuPy loads only
here. NCCL's ring reductions do not reduce in group order, so results may differ
from the MPI/simulated runtimes in the last bits. CI runs this whole module with a
stand-in `cupy.cuda.nccl` implemented over MPI (tests/fake_nccl.py). Not done yet:
the compute between collectives still runs the NumPy segments of
transforms/shard_exec.py (results come back to the host before them).
"""

import numpy as np
from fflow.primitives.collectives import run_phases_single

from fflow.runtime_mpi import MPIRuntime
from fflow.sbp import balanced

_OPS = {"sum": "NCCL_SUM", "max": "NCCL_MAX", "min": "NCCL_MIN", "prod": "NCCL_PROD"}
_DTYPES = {
    "float16": "NCCL_FLOAT16",
    "float32": "NCCL_FLOAT32",
    "float64": "NCCL_FLOAT64",
    "int32": "NCCL_INT32",
    "int64": "NCCL_INT64",
    "uint8": "NCCL_UINT8",
    "int8": "NCCL_INT8",
    "uint32": "NCCL_UINT32",
    "uint64": "NCCL_UINT64",
    "bfloat16": "NCCL_BFLOAT16",
}


class NcclGroup:
    """An NCCL communicator over some MPI ranks (one GPU per rank)."""

    def __init__(self, mpi_comm, ranks, nccl, cupy):
        self.nccl = nccl
        self.cupy = cupy
        self.ranks = list(ranks)
        me = mpi_comm.Get_rank()
        root = self.ranks[0]
        uid = nccl.get_unique_id() if me == root else None
        # only the group's members take part; the id travels point to point from its root
        if me == root:
            for r in self.ranks[1:]:
                mpi_comm.send(uid, dest=r, tag=29999)
        else:
            uid = mpi_comm.recv(source=root, tag=29999)
        self.me = self.ranks.index(me)
        self.comm = nccl.NcclCommunicator(len(self.ranks), uid, self.me)

    def _kind(self, x):
        return getattr(self.nccl, _DTYPES[np.dtype(x.dtype).name])

    def _stream(self):
        return self.cupy.cuda.get_current_stream().ptr

    def all_reduce(self, x, op="sum"):
        out = self.cupy.empty(x.shape, x.dtype)
        op_code = getattr(self.nccl, _OPS[op])
        self.comm.allReduce(
            x.data.ptr, out.data.ptr, x.size, self._kind(x), op_code, self._stream()
        )
        return out

    def all_gather(self, xs, sizes):
        """xs: this member's piece along axis 0; returns every member's, concatenated."""
        cp = self.cupy
        n, m = len(sizes), max(sizes)
        padded = cp.zeros((m,) + xs.shape[1:], xs.dtype)
        padded[: xs.shape[0]] = xs
        out = cp.empty((n * m,) + xs.shape[1:], xs.dtype)
        kind = self._kind(xs)
        self.comm.allGather(padded.data.ptr, out.data.ptr, padded.size, kind, self._stream())
        out = out.reshape((n, m) + xs.shape[1:])
        return cp.concatenate([out[j, : sizes[j]] for j in range(n)], axis=0)

    def reduce_scatter(self, xs, sizes, op="sum"):
        """xs: the full value with the scattered axis first; returns this member's piece."""
        cp = self.cupy
        n, m = len(sizes), max(sizes)
        padded = cp.zeros((n, m) + xs.shape[1:], xs.dtype)
        start = 0
        for j, s in enumerate(sizes):
            padded[j, :s] = xs[start : start + s]
            start += s
        out = cp.empty((m,) + xs.shape[1:], xs.dtype)
        op_code = getattr(self.nccl, _OPS[op])
        kind = self._kind(xs)
        self.comm.reduceScatter(
            padded.data.ptr, out.data.ptr, out.size, kind, op_code, self._stream()
        )
        return out[: sizes[self.me]]

    def exchange(self, sends, recvs):
        """Point to point: sends [(member, array)]; recvs [(member, shape, dtype)]."""
        cp = self.cupy
        stream = self._stream()
        out = [cp.empty(shape, dtype) for _, shape, dtype in recvs]
        keep = [cp.ascontiguousarray(a) for _, a in sends]  # alive until the group ends
        self.nccl.groupStart()
        for (j, _), a in zip(sends, keep):
            self.comm.send(a.data.ptr, a.size, self._kind(a), j, stream)
        for (j, _, _), a in zip(recvs, out):
            self.comm.recv(a.data.ptr, a.size, self._kind(a), j, stream)
        self.nccl.groupEnd()
        return out


class NCCLRuntime(MPIRuntime):
    """MPI ranks as GPUs: collectives over NCCL, in the MPI runtime's order."""

    def __init__(self):
        super().__init__()
        import cupy  # loaded only when this runtime is used
        from cupy.cuda import nccl

        self.cupy = cupy
        self.nccl = nccl
        cupy.cuda.Device(self.rank % cupy.cuda.runtime.getDeviceCount()).use()
        self._groups = {}

    def describe(self):
        return f"{self.device_count()} MPI ranks with one GPU each (NCCL)"

    def group(self, ranks):
        key = tuple(ranks)
        g = self._groups.get(key)
        if g is None:
            g = self._groups[key] = NcclGroup(self.world, key, self.nccl, self.cupy)
        return g

    def p2p_start(self, sends, recvs, tag):
        """Post sends [(rank, array)] and recvs [(rank, shape, dtype)] over NCCL; the
        handle's `wait()` returns the received arrays (host) in `recvs` order.

        NCCL has no tags: messages of one pair match in posting order, which is the
        same on both ranks (every rank walks the same transfers in the same order).
        """
        cp = self.cupy
        me = self.rank
        # pair communicators are made in sorted pair order on every rank: no deadlock
        for r in sorted({r for r, _ in sends} | {r for r, *_ in recvs}):
            self.group(sorted((me, r)))
        stream = cp.cuda.get_current_stream()
        keep = [cp.ascontiguousarray(cp.asarray(a)) for _, a in sends]
        out = [cp.empty(shape, dtype) for _, shape, dtype in recvs]
        self.nccl.groupStart()
        for (r, _), a in zip(sends, keep):
            g = self.group(sorted((me, r)))
            g.comm.send(a.data.ptr, a.size, g._kind(a), g.ranks.index(r), stream.ptr)
            self.bytes_moved += a.nbytes
        for (r, _, _), a in zip(recvs, out):
            g = self.group(sorted((me, r)))
            g.comm.recv(a.data.ptr, a.size, g._kind(a), g.ranks.index(r), stream.ptr)
        self.nccl.groupEnd()
        return _NcclP2P(stream, out, keep)

    def assemble(self, gv):
        value = super().assemble(gv)
        return value.get() if hasattr(value, "get") else value

    def run_request(self, pl, req):
        """Gradient buckets: the bucket's all-reduce is queued on the stream when it
        starts (NCCL runs it while the host queues the rest of the backward pass; the
        stream orders it before every later kernel), so its wait has nothing to do."""
        if req[0] == "start":
            _, prim, x, params, _owned = req
            return self.collective(pl, prim, x, params)
        if req[0] == "wait":
            return req[1]
        if req[0] == "progress":
            return None
        return super().run_request(pl, req)

    def collective(self, pl, prim, x, params):
        ranks, _, _ = self._setup(pl, prim, x, params)
        if len(ranks) == 1:
            return run_phases_single(prim, x, params)
        cp = self.cupy
        g = self.group(ranks)
        x = cp.ascontiguousarray(cp.asarray(x))
        p, me, isz = len(ranks), g.me, x.dtype.itemsize
        name = prim.name
        if name == "all_reduce":
            sizes = balanced(x.size, p)
            self.bytes_moved += ((x.size - sizes[me]) + (p - 1) * sizes[me]) * isz
            return g.all_reduce(x, params["op"])
        if name == "all_gather":
            axis, sizes = params["axis"], list(params["sizes"])
            xs = cp.ascontiguousarray(cp.moveaxis(x, axis, 0))
            self.bytes_moved += (p - 1) * xs.nbytes
            return cp.moveaxis(g.all_gather(xs, sizes), 0, axis)
        if name == "reduce_scatter":
            axis, sizes = params["axis"], list(params["sizes"])
            xs = cp.ascontiguousarray(cp.moveaxis(x, axis, 0))
            self.bytes_moved += (xs.size - sizes[me] * (xs.size // max(sum(sizes), 1))) * isz
            return cp.moveaxis(g.reduce_scatter(xs, sizes, params["op"]), 0, axis)
        if name == "all_to_all":
            return self._all_to_all(g, x, params)
        return self._exchange(g, x, params)

    def _all_to_all(self, g, x, params):
        in_axis, out_axis = params["in_axis"], params["out_axis"]
        in_sizes, out_sizes = list(params["in_sizes"]), list(params["out_sizes"])
        me = g.me
        bounds = np.cumsum([0] + out_sizes)
        sends, recvs = [], []
        for j in range(len(out_sizes)):
            idx = [slice(None)] * x.ndim
            idx[out_axis] = slice(int(bounds[j]), int(bounds[j + 1]))
            if j != me:
                piece = x[tuple(idx)]
                sends.append((j, piece))
                self.bytes_moved += piece.nbytes
            shape = list(x.shape)
            shape[out_axis] = out_sizes[me]
            shape[in_axis] = in_sizes[j]
            recvs.append((j, tuple(shape), x.dtype))
        own_idx = [slice(None)] * x.ndim
        own_idx[out_axis] = slice(int(bounds[me]), int(bounds[me + 1]))
        got = g.exchange(sends, [r for r in recvs if r[0] != me])
        parts = iter(got)
        pieces = [x[tuple(own_idx)] if j == me else next(parts) for j in range(len(out_sizes))]
        return self.cupy.concatenate(pieces, axis=in_axis)

    def _exchange(self, g, x, params):
        cp = self.cupy

        def box(b):
            return tuple(slice(lo, hi) for lo, hi in b)

        sends = [(dst, x[box(b)]) for dst, b in params["sends"]]
        self.bytes_moved += sum(a.nbytes for _, a in sends)
        recvs = [(src, tuple(hi - lo for lo, hi in b), x.dtype) for src, b in params["recvs"]]
        got = g.exchange(sends, recvs)
        out = cp.zeros(params["out_shape"], x.dtype)
        pieces = [(x[box(ib)], ob) for ib, ob in params["local"]]
        pieces += [(a, ob) for a, (_, ob) in zip(got, params["recvs"])]
        for piece, ob in pieces:
            if params["accumulate"]:
                out[box(ob)] += piece
            else:
                out[box(ob)] = piece
        return out


class _NcclP2P:
    """Transfers posted on a stream: `wait()` synchronizes it, returns host arrays."""

    def __init__(self, stream, out, keep):
        self.stream = stream
        self.out = out
        self._keep = keep  # send buffers stay alive until the stream has sent them

    def wait(self):
        self.stream.synchronize()
        self._keep = None
        return [a.get() for a in self.out]


__all__ = ["NCCLRuntime", "NcclGroup"]
