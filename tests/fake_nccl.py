"""A stand-in for `cupy.cuda.nccl` over MPI on host buffers, with NCCL's call
signatures (device pointers, element counts, NCCL dtype/op constants, a stream
argument, groupStart/groupEnd), so CI runs fflow's NCCL runtime
(lowering/cuda_nccl.py) for real on machines without GPUs. Use it together with
tests/fake_cupy.py (arrays whose `.data.ptr` is a host address): `install()`.

A communicator finds its MPI ranks through its unique id: the id names the world
rank of the process that made it; members report their world rank to it, point to
point, and all members then create one MPI communicator (Create_group).
"""

import ctypes
import itertools
import sys
import types

import numpy as np

NCCL_INT8, NCCL_UINT8, NCCL_INT32, NCCL_UINT32 = 0, 1, 2, 3
NCCL_INT64, NCCL_UINT64, NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64, NCCL_BFLOAT16 = 4, 5, 6, 7, 8, 9
NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN = 0, 1, 2, 3

_TYPES = {
    NCCL_INT8: "int8",
    NCCL_UINT8: "uint8",
    NCCL_INT32: "int32",
    NCCL_UINT32: "uint32",
    NCCL_INT64: "int64",
    NCCL_UINT64: "uint64",
    NCCL_FLOAT16: "float16",
    NCCL_FLOAT32: "float32",
    NCCL_FLOAT64: "float64",
    NCCL_BFLOAT16: "bfloat16",
}
_ids = itertools.count()
_group = []  # pending (kind, comm, buffer, peer) inside groupStart/groupEnd
_depth = [0]
calls = []  # (method, count, dtype) of every call, for tests


def _mpi():
    from mpi4py import MPI

    return MPI


def _dtype(code):
    name = _TYPES[code]
    if name == "bfloat16":
        from ml_dtypes import bfloat16

        return np.dtype(bfloat16)
    return np.dtype(name)


def _view(ptr, count, code):
    dt = _dtype(code)
    raw = (ctypes.c_char * (count * dt.itemsize)).from_address(ptr)
    return np.frombuffer(raw, dtype=dt, count=count)


def _op(code):
    MPI = _mpi()
    return {NCCL_SUM: MPI.SUM, NCCL_PROD: MPI.PROD, NCCL_MAX: MPI.MAX, NCCL_MIN: MPI.MIN}[code]


def get_unique_id():
    return (_mpi().COMM_WORLD.Get_rank(), next(_ids))


class NcclCommunicator:
    def __init__(self, ndev, uid, rank):
        MPI = _mpi()
        world = MPI.COMM_WORLD
        root, _ = uid
        me = world.Get_rank()
        tag = 28000
        if me == root:
            members = {rank: me}
            for _ in range(ndev - 1):
                r, w = world.recv(source=MPI.ANY_SOURCE, tag=tag)
                members[r] = w
            order = [members[r] for r in range(ndev)]
            for w in order:
                if w != me:
                    world.send(order, dest=w, tag=tag + 1)
        else:
            world.send((rank, me), dest=root, tag=tag)
            order = world.recv(source=root, tag=tag + 1)
        group = world.Get_group().Incl(order)
        self.comm = world.Create_group(group, tag=tag + 2)
        self._rank = rank
        self._size = ndev

    def rank_id(self):
        return self._rank

    def size(self):
        return self._size

    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):  # noqa: N802
        calls.append(("allReduce", count, _TYPES[datatype]))
        x, out = _view(sendbuf, count, datatype), _view(recvbuf, count, datatype)
        if x.dtype.name in ("float16", "bfloat16"):  # MPI has no 16-bit floats
            acc = x.astype(np.float32)
            self.comm.Allreduce(_mpi().IN_PLACE, acc, op=_op(op))
            out[...] = acc.astype(x.dtype)
        else:
            self.comm.Allreduce(x.copy(), out, op=_op(op))

    def allGather(self, sendbuf, recvbuf, count, datatype, stream):  # noqa: N802
        calls.append(("allGather", count, _TYPES[datatype]))
        x = _view(sendbuf, count, datatype).copy()
        out = _view(recvbuf, count * self._size, datatype)
        self.comm.Allgather(x.view(np.uint8), out.view(np.uint8))

    def reduceScatter(self, sendbuf, recvbuf, recvcount, datatype, op, stream):  # noqa: N802
        calls.append(("reduceScatter", recvcount, _TYPES[datatype]))
        x = _view(sendbuf, recvcount * self._size, datatype).copy()
        out = _view(recvbuf, recvcount, datatype)
        wide = x.dtype.name in ("float16", "bfloat16")
        acc = x.astype(np.float32) if wide else x
        res = np.empty(recvcount, acc.dtype)
        self.comm.Reduce_scatter_block(acc, res, op=_op(op))
        out[...] = res.astype(x.dtype) if wide else res

    def send(self, sendbuf, count, datatype, peer, stream):
        calls.append(("send", count, _TYPES[datatype]))
        self._queue(("send", _view(sendbuf, count, datatype).copy(), peer))

    def recv(self, recvbuf, count, datatype, peer, stream):
        calls.append(("recv", count, _TYPES[datatype]))
        self._queue(("recv", _view(recvbuf, count, datatype), peer))

    def _queue(self, op):
        _group.append((self,) + op)
        if not _depth[0]:
            groupEnd()


def groupStart():  # noqa: N802
    _depth[0] += 1


def groupEnd():  # noqa: N802
    _depth[0] = max(0, _depth[0] - 1)
    if _depth[0]:
        return
    reqs = []
    for comm, kind, buf, peer in _group:
        raw = buf.view(np.uint8)
        if kind == "send":
            reqs.append(comm.comm.Isend(raw, dest=peer, tag=5))
        else:
            reqs.append(comm.comm.Irecv(raw, source=peer, tag=5))
    _group.clear()
    _mpi().Request.Waitall(reqs)


def install():
    """Install tests/fake_cupy.py as `cupy` and this module as `cupy.cuda.nccl`."""
    import fake_cupy

    fake_cupy.install()
    cupy = sys.modules["cupy"]
    mod = sys.modules[__name__]
    cupy.cuda.nccl = mod
    # groupEnd completes the calls on the host, so the stream has nothing to wait for
    cupy.cuda.get_current_stream = lambda: types.SimpleNamespace(ptr=0, synchronize=lambda: None)
    # the few array functions the NCCL runtime uses, returning the stand-in's arrays
    wrap = fake_cupy._wrap
    cupy.zeros = lambda shape, dtype=np.float32: wrap(np.zeros(shape, dtype))
    cupy.moveaxis = lambda a, src, dst: wrap(np.moveaxis(a, src, dst))
    cupy.concatenate = lambda arrays, axis=0: wrap(np.concatenate(arrays, axis=axis))
    sys.modules["cupy.cuda"] = cupy.cuda
    sys.modules["cupy.cuda.nccl"] = mod
    return mod
