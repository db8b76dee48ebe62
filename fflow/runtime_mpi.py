"""The MPI runtime: one process per rank (started by `python -m fflow.launch -n N`).

A global array keeps only this rank's shard. Each rank runs its own device program;
its collectives are mpi4py buffer collectives (fflow/mpi_ops.py) on a communicator
per group of ranks (one per mesh-axis group of a placement, created on first use by
its members only, `Create_group`, and cached). Every rank issues collectives in
program order. In the default deterministic mode the numbers equal the simulated
runtime's bit for bit (see mpi_ops.py for the native mode).

Safety (fflow/mpi_faults.py): every wait notices a rank that left or a timeout. The
first call of every sharded program on a rank checks a fingerprint across the
placement's ranks (the program, its input shapes/dtypes/SBPs, the calling line), so
ranks running different programs or shapes get an error naming both; with config
`debug_collectives` (FFLOW_DEBUG_COLLECTIVES) every collective is checked too.
"""

import time
import weakref
import zlib

import numpy as np

from fflow import mpi_ops
from fflow.array import Array
from fflow.config import config
from fflow.core import Literal
from fflow.errors import FflowError, user_source_info
from fflow.mpi_faults import RankError, control
from fflow.primitives.collectives import exchange_p, run_phases_single
from fflow.printing import pp_program
from fflow.sharding import B, GlobalValue, balanced, local_piece, make_global
from fflow.transforms.shard_exec import _stages, device_steps, run_identity

_debug = [False]  # config debug_collectives, mirrored by its update hook (read per call)
config.define("debug_collectives", False, hook=lambda v: _debug.__setitem__(0, bool(v)))


class _What:
    """A collective's description, formatted only when an error or a wait needs it."""

    __slots__ = ("rt", "count", "prim", "x", "ranks", "sp")

    def __init__(self, rt, count, prim, x, ranks, sp):
        self.rt, self.count, self.prim, self.x, self.ranks, self.sp = rt, count, prim, x, ranks, sp

    def __str__(self):
        dt = np.dtype(self.x.dtype).name
        prog = f" of sharded program '{self.sp.name}'" if self.sp is not None else ""
        return (
            f"collective #{self.count} ({self.prim.name} {dt}{list(np.shape(self.x))} over "
            f"ranks {list(self.ranks)}){prog}"
        )


def _crc(text):
    return zlib.crc32(text.encode()) & 0x7FFFFFFF


class MPIRuntime:
    """Ranks of MPI.COMM_WORLD as devices."""

    def __init__(self):
        from mpi4py import MPI  # loaded only when this runtime is used

        self.MPI = MPI
        self.world = MPI.COMM_WORLD
        self.comm = self.world  # control and setup only; data goes on group communicators
        self.control = control()
        self.wait = self.control.wait  # (reqs, ranks, what): every collective's wait
        self.bytes_moved = 0  # bytes this rank sent in collective messages
        self.collective_count = 0
        # wall time inside collectives, bucket starts and polls (benchmarks/bench_mpi.py)
        self.comm_seconds = 0.0
        self.bucket_wait_seconds = 0.0  # of which waiting for started gradient buckets
        self._comms = {}
        self._group_of = {}  # (placement ranks, group) -> (world ranks, communicator)
        self._in_flight = []  # requests of started gradient buckets
        self._sp = None  # the sharded program running now (for messages)

    def device_count(self):
        return self.world.Get_size()

    @property
    def rank(self):
        return self.world.Get_rank()

    def describe(self):
        return f"{self.device_count()} MPI ranks"

    def _my_index(self, pl):
        try:
            return pl.ranks.index(self.rank)
        except ValueError:
            return None

    def group_comm(self, ranks):
        """The communicator of world `ranks` (in this order); members only, cached."""
        ranks = tuple(ranks)
        comm = self._comms.get(ranks)
        if comm is None:
            self.control.check_group(ranks, f"creating a communicator over ranks {list(ranks)}")
            group = self.world.Get_group().Incl(list(ranks))
            comm = self.world.Create_group(group, tag=7)
            group.Free()
            self._comms[ranks] = comm
        return comm

    # -- global arrays ------------------------------------------------------------
    def scatter(self, value, nd_sbp, pl):

        i = self._my_index(pl)
        if i is None:
            return {}
        return {i: local_piece(value, nd_sbp, pl, i)}

    def assemble(self, gv):
        """The logical value on every rank: box to broadcast (only what is missing moves,
        nothing for a broadcast array), then ranks outside the placement get a Bcast."""

        pl = gv.sharding.placement
        i = self._my_index(pl)
        full = (B,) * pl.ndim
        if gv.sharding.sbp != full:
            x = make_global(gv.shape, gv.dtype, pl, gv.sharding.sbp, gv.shards)
            counted = self.bytes_moved  # reads are not program traffic (as simulated)
            gv = run_identity(x, pl, full)._value
            self.bytes_moved = counted
        value = gv.shards[i] if i is not None else np.empty(gv.shape, gv.dtype)
        if pl.size < self.world.Get_size():
            value = np.array(value, order="C")
            self.world.Bcast([mpi_ops._raw(value), self.MPI.BYTE], root=pl.ranks[0])
        return value

    def local_of(self, gv):
        if not gv.shards:
            raise FflowError(
                f"rank {self.rank} holds no shard of this array (not in its placement)"
            )
        return next(iter(gv.shards.values()))

    def local_shards(self, pl, value):
        """{flat index: shard} of this rank (empty outside the placement)."""
        i = self._my_index(pl)
        return {} if i is None else {i: value(i)}

    def gather_shard_infos(self, pl, shards):
        """Every device's (shape, dtype name), by one Allgather over all ranks (ranks
        outside the placement take part too, so every rank learns the global shape)."""
        size = self.world.Get_size()
        comm = self.group_comm(range(size))
        local = next(iter(shards.values()), None)
        info = ""
        if local is not None:
            info = f"{np.dtype(local.dtype).name}:{','.join(str(d) for d in np.shape(local))}"
        mine = np.frombuffer(info.encode().ljust(128)[:128], np.uint8).copy()
        everyone = np.empty((size, 128), np.uint8)
        req = comm.Iallgather([mine, self.MPI.BYTE], [everyone, self.MPI.BYTE])
        self.wait([req], range(size), "make_global_array's shape check")
        out = []
        for r in pl.ranks:
            dt, _, dims = bytes(everyone[r]).decode().strip().partition(":")
            out.append((tuple(int(d) for d in dims.split(",") if d), dt))
        return out

    # -- running sharded programs ---------------------------------------------------
    def execute(self, sp, in_shards):
        run = getattr(sp, "_mpi_run", None)
        if run is None or _debug[0]:
            run = self._prepare(sp, in_shards)
        i, local, one, direct = run
        if i is None:
            return [{} for _ in sp.program.outvars]
        if direct is not None:  # one MPI collective, input to output: set up once
            (k, eqn, outs), (ranks, comm, fn) = one, direct
            x = in_shards[k][i]
            self.collective_count += 1
            what = _What(self, self.collective_count, eqn.primitive, x, ranks, sp)
            if self.control.left:
                self.control.check_group(ranks, what)
            t0 = time.perf_counter()
            y = fn(self, comm, ranks, x, eqn.params, what)
            self.comm_seconds += time.perf_counter() - t0
            return [{i: y if o is None else in_shards[o][i]} for o in outs]
        self._sp = sp
        if one is not None:  # one collective, input to output: no generator
            k, eqn, outs = one
            y = self.collective(sp.placement, eqn.primitive, in_shards[k][i], eqn.params)
            self._sp = None
            return [{i: y if o is None else in_shards[o][i]} for o in outs]
        pl = sp.placement
        gen = device_steps(local, [s[i] for s in in_shards])
        value = None
        first = True
        while True:
            try:
                req = next(gen) if first else gen.send(value)
            except StopIteration as stop:
                results = stop.value
                break
            first = False
            value = self.run_request(pl, req)
        self._sp = None
        return [{i: r} for r in results]

    def _prepare(self, sp, in_shards):
        """(this rank's device index, its local program, its single collective or None)
        of `sp`, after the first call's fingerprint check (every call's with
        debug_collectives); kept on `sp`."""
        pl = sp.placement
        i = self._my_index(pl)
        if i is None:
            sp._mpi_run = (None, None, None, None)
            return sp._mpi_run
        self.check_program(sp, pl, [s[i] for s in in_shards])
        local = sp.local_program(i)
        one = _single_collective(local)
        direct = None
        if one is not None and type(self).collective is MPIRuntime.collective and not _debug[0]:
            # MPI's own collectives (not a subclass's, e.g. NCCL): communicator found once
            params = one[1].params
            ranks = tuple(pl.ranks[j] for j in params["group"])
            if len(ranks) > 1:
                direct = (ranks, self.group_comm(ranks), mpi_ops.OPS[one[1].primitive.name])
        sp._mpi_run = (i, local, one, direct)
        if direct is not None:
            sp._fast = (self, self._runner(sp, i, one, direct))
        return sp._mpi_run

    def _runner(self, sp, i, one, direct):
        """`sp.run_global` for a one-collective program (a P -> B all-reduce, ...) after
        its first call: global Arrays in, global Arrays out, with the collective planned
        once per config mode (`mpi_ops.planned`) and the outputs' metadata ready; None
        (run_global's general path) while debug_collectives is on."""
        (k, eqn, outs), (ranks, comm, _) = one, direct
        meta = sp._out_meta or sp._init_meta(self)
        aval = sp.local_program(i).invars[k].aval
        shape, dtype = tuple(aval.shape), np.dtype(aval.dtype)
        name, params, plans, mode = eqn.primitive.name, eqn.params, {}, mpi_ops.mode
        what = _What(self, 0, eqn.primitive, np.broadcast_to(np.zeros((), dtype), shape), ranks, sp)
        control, perf, of = self.control, time.perf_counter, GlobalValue.of
        single = meta[0] if outs == [None] else None
        if single is not None:  # (its fields as locals: read on every call)
            s_shape, s_dtype, s_weak, s_sh = single
            new, gv_t = object.__new__, GlobalValue

        def run(args):
            if _debug[0]:
                return None
            fn = plans.get(mode[0])
            if fn is None:
                fn = plans[mode[0]] = mpi_ops.planned(name, comm, ranks, params, shape, dtype)
            what.count = self.collective_count = self.collective_count + 1
            if control.left:
                control.check_group(ranks, what)
            t0 = perf()
            y = fn(self, args[k]._value.shards[i], what)
            self.comm_seconds += perf() - t0
            if single is not None:  # (GlobalValue.of written out: a call less)
                gv = new(gv_t)
                gv.shape, gv.dtype, gv.sharding, gv.shards = s_shape, s_dtype, s_sh, {i: y}
                out = Array(gv, s_weak)
                out._sharding = s_sh
                return [out]
            res = []
            for (shape_o, dtype_o, weak, sh), o in zip(meta, outs):
                v = y if o is None else args[o]._value.shards[i]
                res.append(Array(of(shape_o, dtype_o, sh, {i: v}), weak))
                res[-1]._sharding = sh
            return res

        return run

    def run_request(self, pl, req):
        if req[0] == "start":  # a gradient bucket: started now, finished at "wait"
            _, prim, x, params, owned = req
            ranks, comm, what = self._setup(pl, prim, x, params)
            self.bytes_moved += _all_reduce_bytes(x.size, comm, x.itemsize)
            t0 = time.perf_counter()
            # (MPI may already move data here: a peer's part that arrived first)
            handle = mpi_ops.start_all_reduce(comm, x, params["op"], owned)
            self.comm_seconds += time.perf_counter() - t0
            self._in_flight.append(handle[1])
            started = (handle, comm, ranks, what)
            if not config.grad_overlap:  # (transforms/shard_buckets.py)
                return ("done", self.run_request(pl, ("wait", started)))
            return started
        if req[0] == "progress":  # let MPI move bucket data while Python computes
            t0 = time.perf_counter()
            self.MPI.Request.Testall(self._in_flight)
            self.comm_seconds += time.perf_counter() - t0
            return None
        if req[0] == "wait":
            if req[1][0] == "done":  # finished when it started (grad_overlap off)
                return req[1][1]
            handle, comm, ranks, what = req[1]
            t0 = time.perf_counter()
            out = mpi_ops.finish_all_reduce(self, comm, ranks, handle, what)
            self._in_flight.remove(handle[1])
            dt = time.perf_counter() - t0
            self.comm_seconds += dt
            self.bucket_wait_seconds += dt
            return out
        prim, x, params = req
        return self.collective(pl, prim, x, params)

    def _setup(self, pl, prim, x, params):
        self.collective_count += 1
        key = (pl.ranks, params["group"])
        hit = self._group_of.get(key)
        if hit is None:
            ranks = tuple(pl.ranks[j] for j in params["group"])
            hit = self._group_of[key] = (ranks, self.group_comm(ranks))
        ranks, comm = hit
        what = _What(self, self.collective_count, prim, x, ranks, self._sp)
        if self.control.left:
            self.control.check_group(ranks, what)
        if _debug[0]:
            self.check_collective(comm, ranks, prim, x, params, what)
        return ranks, comm, what

    def collective(self, pl, prim, x, params):
        ranks, comm, what = self._setup(pl, prim, x, params)
        if len(ranks) == 1:
            return run_phases_single(prim, x, params)
        t0 = time.perf_counter()
        out = mpi_ops.OPS[prim.name](self, comm, ranks, np.asarray(x), params, what)
        self.comm_seconds += time.perf_counter() - t0
        return out

    # -- fingerprints: ranks running different programs or shapes -----------------------
    def check_program(self, sp, pl, args):
        fp = getattr(sp, "_fingerprint", None)
        if fp is None:
            text = f"{pp_program(sp.exec_program)} in={sp.in_sbps} out={sp.out_sbps}"
            fp = sp._fingerprint = _crc(text)
        where = user_source_info()
        desc = (
            f"sharded program '{sp.name}' called at {where.short() if where else '?'} with "
            "inputs "
            + ", ".join(
                f"{np.dtype(v.aval.dtype).name}{list(v.aval.shape)}{tuple(s)}"
                for v, s in zip(sp.program.invars, sp.in_sbps)
            )
            + " computing "
            + ", ".join(
                f"{np.dtype(v.aval.dtype).name}{list(v.aval.shape)}" for v in sp.program.outvars
            )
            + f" by {len(sp.exec_program.eqns)} equations ("
            + " ".join(e.primitive.name for e in sp.exec_program.eqns[:6])
            + (" ...)" if len(sp.exec_program.eqns) > 6 else ")")
        )
        self._agree(pl.ranks, np.array([fp, _crc(desc)], np.int64), desc, "ran different programs")

    def check_collective(self, comm, ranks, prim, x, params, what):
        keep = {k: v for k, v in params.items() if k not in ("index", "placement")}
        if prim is exchange_p:
            keep = {"out": len(params["group"])}
        desc = f"{what.count}:{prim.name}:{np.dtype(x.dtype).name}:{sorted(keep.items())}"
        self._agree(ranks, np.array([_crc(desc), 0], np.int64), str(what), "diverged")

    def _agree(self, ranks, fp, desc, verb):
        comm = self.group_comm(ranks)
        everyone = np.empty((len(ranks), 2), np.int64)
        req = comm.Iallgather(fp, everyone)
        self.wait([req], ranks, f"the program fingerprint check ({desc})")
        if (everyone == everyone[0]).all():
            return
        descs = comm.allgather(desc)  # metadata only, and only on the error path
        j = next(j for j in range(len(ranks)) if (everyone[j] != everyone[0]).any())
        raise RankError(
            f"ranks {verb}: rank {ranks[0]} runs {descs[0]}, but rank {ranks[j]} runs "
            f"{descs[j]}. Every rank must run the same sharded calls with the same shapes "
            "and dtypes. Fix: give every rank the same program and per-rank data of the "
            "same shape (fflow.make_global_array checks this).",
            reporter=ranks[0],
        )

    # -- point-to-point (moving arrays between placements; fflow.pipeline) ----------
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
        peers = sorted({r for r, *_ in recvs} | {r for r, _ in sends} | {self.rank})
        return _P2PHandle(self, requests, bufs, sends, peers)


_single = weakref.WeakKeyDictionary()


def _single_collective(prog):
    """(input index, eqn, per output: None for the collective's result or the input
    index it returns) when `prog` is one collective of an input (a boxing such as a
    P -> B all-reduce), else None; cached per program."""
    hit = _single.get(prog)
    if hit is None:
        hit = False
        stages = _stages(prog)
        if len(stages) == 1 and stages[0][0] == "collective" and not prog.constvars:
            eqn = stages[0][1]
            x, y = eqn.inputs[0], eqn.outputs[0]
            where = {v: k for k, v in enumerate(prog.invars)}
            if type(x) is not Literal and x in where:
                outs = []
                for v in prog.outvars:
                    if v is y:
                        outs.append(None)
                    elif type(v) is not Literal and v in where:
                        outs.append(where[v])
                    else:
                        break
                else:
                    hit = (where[x], eqn, outs)
        _single[prog] = hit
    return hit or None


def _all_reduce_bytes(size, comm, itemsize):
    p = comm.Get_size()
    sizes = balanced(size, p)
    me = comm.Get_rank()
    return ((size - sizes[me]) + (p - 1) * sizes[me]) * itemsize


def _buffer(arr):
    # bfloat16 and other ml_dtypes have no MPI datatype: send their raw bytes
    if arr.dtype.kind == "V" or arr.dtype.name == "bfloat16":
        return arr.reshape(-1).view(np.uint8)
    return arr


class _P2PHandle:
    def __init__(self, rt, requests, bufs, keep, peers):
        self.rt = rt
        self.requests = requests
        self.bufs = bufs
        self._keep = keep  # send buffers stay alive until the sends complete
        self.peers = peers

    def wait(self):
        self.rt.wait(self.requests, self.peers, f"a transfer between ranks {self.peers}")
        self._keep = None
        return self.bufs
