"""The MPI runtime: one process per rank (started by `python -m fflow.launch -n N`).

A global array keeps only this rank's shard. Each rank runs its own device
program; at a collective it sends its messages to the other members of its group
and receives theirs (mpi4py, MPICH from PyPI). Every rank issues collectives in
program order, and message tags count collectives per placement, so the order
is the same on all ranks. Numbers equal the simulated runtime's bit for bit:
both reduce in group order.
"""

import numpy as np

from fflow.errors import FflowError
from fflow.primitives.collectives import collective_phases
from fflow.sharding import assemble


class MPIRuntime:
    """Ranks of MPI.COMM_WORLD as devices."""

    def __init__(self):
        from mpi4py import MPI  # loaded only when this runtime is used

        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.bytes_moved = 0  # bytes this rank sent in collective messages
        self.collective_count = 0
        self._tags = {}

    def device_count(self):
        return self.comm.Get_size()

    @property
    def rank(self):
        return self.comm.Get_rank()

    def describe(self):
        return f"{self.device_count()} MPI ranks"

    def _my_index(self, pl):
        try:
            return pl.ranks.index(self.rank)
        except ValueError:
            return None

    def scatter(self, value, nd_sbp, pl):
        from fflow.sharding import local_box, partial_keeper

        i = self._my_index(pl)
        if i is None:
            return {}
        coords = pl.coords(i)
        box = local_box(value.shape, nd_sbp, pl.hierarchy, coords)
        piece = np.array(value[tuple(slice(a, b) for a, b in box)])
        if not partial_keeper(nd_sbp, pl.hierarchy, coords):
            piece = np.zeros_like(piece)
        return {i: piece}

    def assemble(self, gv):
        pl = gv.sharding.placement
        everything = {}
        for part in self.comm.allgather(gv.shards):
            everything.update(part)
        return assemble(everything, gv.shape, gv.sharding.sbp, pl)

    def local_of(self, gv):
        if not gv.shards:
            raise FflowError(
                f"rank {self.rank} holds no shard of this array (not in its placement)"
            )
        return next(iter(gv.shards.values()))

    def execute(self, sp, in_shards):
        from fflow.transforms.shard_exec import device_steps

        pl = sp.placement
        i = self._my_index(pl)
        n_out = len(sp.program.outvars)
        if i is None:
            return [{} for _ in range(n_out)]
        gen = device_steps(sp.local_program(i), [s[i] for s in in_shards])
        value = None
        first = True
        while True:
            try:
                prim, x, params = next(gen) if first else gen.send(value)
            except StopIteration as stop:
                results = stop.value
                break
            first = False
            value = self.collective(pl, prim, x, params)
        return [{i: results[k]} for k in range(n_out)]

    def collective(self, pl, prim, x, params):
        self.collective_count += 1
        count = self._tags.get(pl, 0)
        self._tags[pl] = count + 1
        group = params["group"]
        state = None
        for phase_no, phase in enumerate(collective_phases[prim]):
            tag = (count * 4 + phase_no) % 30000
            msgs = phase.make(x, state, **params)
            requests = []
            for dst, payload in sorted(msgs.items()):
                self.bytes_moved += sum(a.nbytes for a in payload)
                requests.append(self.comm.isend(payload, dest=pl.ranks[group[dst]], tag=tag))
            received = {
                src: self.comm.recv(source=pl.ranks[group[src]], tag=tag)
                for src in phase.sources(params)
            }
            for r in requests:
                r.wait()
            state = phase.combine(x, state, received, **params)
        return state

    # -- point-to-point (moving arrays between placements; fflow.pipeline) --------
    def p2p_start(self, sends, recvs, tag):
        """Post buffer Isend/Irecv: sends [(rank, array)], recvs [(rank, shape, dtype)].

        Returns a handle whose `wait()` gives the received arrays in `recvs` order. The
        messages go on a duplicate of COMM_WORLD, so they never match a collective's.
        """
        if getattr(self, "_p2p_comm", None) is None:
            self._p2p_comm = self.comm.Dup()
        comm = self._p2p_comm
        requests, bufs = [], []
        for src, shape, dtype in recvs:
            buf = np.empty(shape, dtype)
            bufs.append(buf)
            requests.append(comm.Irecv(_buffer(buf), source=src, tag=tag))
        for dst, arr in sends:
            self.bytes_moved += arr.nbytes
            requests.append(comm.Isend(_buffer(arr), dest=dst, tag=tag))
        return _P2PHandle(self.MPI, requests, bufs, sends)


def _buffer(arr):
    # bfloat16 and other ml_dtypes have no MPI datatype: send their raw bytes
    if arr.dtype.kind == "V" or arr.dtype.name == "bfloat16":
        return arr.reshape(-1).view(np.uint8)
    return arr


class _P2PHandle:
    def __init__(self, MPI, requests, bufs, keep):  # noqa: N803
        self.MPI = MPI
        self.requests = requests
        self.bufs = bufs
        self._keep = keep  # send buffers stay alive until the sends complete

    def wait(self):
        self.MPI.Request.Waitall(self.requests)
        self._keep = None
        return self.bufs
