"""NCCL for GPU placements: the MPI runtime's collectives, with the data moved by NCCL.

`NCCLRuntime` is `fflow.runtime_mpi.MPIRuntime` (one process per rank, started by
`python -m fflow.launch -n N`) where every rank drives one GPU and shards are CuPy
arrays. It issues the same collectives in the same order as the MPI runtime:

* all_reduce, and all_gather / reduce_scatter of equal pieces along axis 0, map to
  ncclAllReduce / ncclAllGather / ncclReduceScatter on a communicator per group;
* everything else (uneven pieces, all_to_all, exchange) runs the primitive's own
  message phases (primitives/collectives.py): the small shape/dtype headers go over
  MPI, the arrays over ncclSend/ncclRecv inside one ncclGroupStart/End.

Communicators are created lazily per group: rank 0 of the group makes the NCCL
unique id and broadcasts it over MPI. CuPy (cupy.cuda.nccl) loads only here.
Unlike MPI/simulated runs, NCCL's ring reductions do not reduce in group order, so
results may differ from them in the last bits.
"""

import numpy as np

from fflow.runtime_mpi import MPIRuntime

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

    def __init__(self, mpi_comm, ranks, nccl):
        self.nccl = nccl
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
        self.comm = nccl.NcclCommunicator(len(self.ranks), uid, self.ranks.index(me))

    def _kind(self, x):
        return getattr(self.nccl, _DTYPES[np.dtype(x.dtype).name])

    def all_reduce(self, x, op="sum"):
        import cupy

        out = cupy.empty_like(x)
        stream = cupy.cuda.get_current_stream().ptr
        self.comm.allReduce(
            x.data.ptr, out.data.ptr, x.size, self._kind(x), getattr(self.nccl, _OPS[op]), stream
        )
        return out

    def all_gather(self, x):
        import cupy

        out = cupy.empty((len(self.ranks),) + x.shape, x.dtype)
        stream = cupy.cuda.get_current_stream().ptr
        self.comm.allGather(x.data.ptr, out.data.ptr, x.size, self._kind(x), stream)
        return out.reshape((len(self.ranks) * x.shape[0],) + x.shape[1:])

    def reduce_scatter(self, x, op="sum"):
        import cupy

        n = len(self.ranks)
        out = cupy.empty((x.shape[0] // n,) + x.shape[1:], x.dtype)
        stream = cupy.cuda.get_current_stream().ptr
        self.comm.reduceScatter(
            x.data.ptr, out.data.ptr, out.size, self._kind(x), getattr(self.nccl, _OPS[op]), stream
        )
        return out

    def exchange(self, sends, recvs):
        """Point to point: sends {member: array}; recvs {member: (shape, dtype)} -> arrays."""
        import cupy

        stream = cupy.cuda.get_current_stream().ptr
        out = {j: cupy.empty(shape, dtype) for j, (shape, dtype) in recvs.items()}
        self.nccl.groupStart()
        for j, a in sorted(sends.items()):
            a = cupy.ascontiguousarray(a)
            sends[j] = a  # keep alive until the group ends
            self.comm.send(a.data.ptr, a.size, self._kind(a), j, stream)
        for j, a in sorted(out.items()):
            self.comm.recv(a.data.ptr, a.size, self._kind(a), j, stream)
        self.nccl.groupEnd()
        return out


class NCCLRuntime(MPIRuntime):
    """MPI ranks as GPUs: collectives over NCCL, in the MPI runtime's order."""

    def __init__(self):
        super().__init__()
        import cupy
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
            g = self._groups[key] = NcclGroup(self.comm, key, self.nccl)
        return g

    def collective(self, pl, prim, x, params):
        self.collective_count += 1
        count = self._tags.get(pl, 0)
        self._tags[pl] = count + 1
        ranks = [pl.ranks[j] for j in params["group"]]
        g = self.group(ranks)
        n = len(ranks)
        x = self.cupy.asarray(x)
        name = prim.name
        even = lambda: x.ndim and params.get("axis") == 0 and len(set(params["sizes"])) == 1  # noqa: E731
        if name == "all_reduce" and params["op"] in _OPS:
            self.bytes_moved += 2 * (n - 1) * x.nbytes // n
            return g.all_reduce(x, params["op"])
        if name == "all_gather" and even():
            self.bytes_moved += x.nbytes * (n - 1)
            return g.all_gather(x)
        if name == "reduce_scatter" and params["op"] in _OPS and even():
            self.bytes_moved += x.nbytes * (n - 1) // n
            return g.reduce_scatter(x, params["op"])
        return self._phases(g, pl, prim, x, params, count)

    def _phases(self, g, pl, prim, x, params, count):
        from fflow.primitives.collectives import collective_phases

        state = None
        group = params["group"]
        for phase_no, phase in enumerate(collective_phases[prim]):
            tag = (count * 4 + phase_no) % 29000
            msgs = phase.make(x, state, **params)
            sends, requests = {}, []
            for dst, payload in sorted(msgs.items()):
                (a,) = payload  # every phase sends one array per destination
                a = self.cupy.asarray(a)
                sends[dst] = a
                self.bytes_moved += a.nbytes
                header = (a.shape, a.dtype.str)
                requests.append(self.comm.isend(header, dest=pl.ranks[group[dst]], tag=tag))
            recvs = {}
            for src in phase.sources(params):
                shape, dtype = self.comm.recv(source=pl.ranks[group[src]], tag=tag)
                recvs[src] = (shape, np.dtype(dtype))
            for r in requests:
                r.wait()
            got = g.exchange(sends, recvs)
            state = phase.combine(x, state, {j: [a] for j, a in got.items()}, **params)
        return state


__all__ = ["NCCLRuntime", "NcclGroup"]
