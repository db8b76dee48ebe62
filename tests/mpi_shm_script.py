"""Run by tests/test_mpi_shm.py under `python -m fflow.launch -n N` and on N simulated
devices: planned P -> B all-reduces (cache hits of a one-collective program) on every
deterministic path, with the shared-memory window (fflow/mpi_shm.py) on and off; prints
each call's result as JSON (rank 0).

Each case calls one program CALLS times on new data and keeps every result (so result
buffers must not be reused while held). A last section makes rank N-1 slow after every
barrier of the window and alternates the two window paths call by call on one window:
a member that overwrote the slots a slow member still reads would change the numbers.
"""

import json
import sys
import time

import numpy as np

import fflow
import fflow.numpy as jnp
from fflow.sharding import B, P, S, partial_max, partial_min, runtime

CALLS = 6
# (mpi_allgather_bytes, mpi_tune_calls): the all-gather / rows path, the two-step path,
# both timed in turn (the tuner)
LIMITS = [(1 << 19, 0), (1 << 4, 0), (1 << 19, 2)]
KINDS = [("float32", P), ("float32", partial_max), ("float32", partial_min), ("float64", P)]
SHAPES = [(9, 7), (8, 8), (3,), (1,), (0,)]


def parts(seed, shape, dtype, n, src):
    """The per-device partial values of draw `seed` (distinct per device)."""
    x = np.random.default_rng(seed).normal(size=shape).astype(dtype) * 8
    return [(x * dtype((k + 1) / (n + 1)) + dtype(k * 0.25)).astype(dtype) for k in range(n)]


def global_of(vals, pl, src, mpi, rt):
    if mpi:
        return fflow.make_global_array(vals[pl.ranks.index(rt.rank)], pl, src)
    return fflow.make_global_array(vals, pl, src)


def set_config(mpi, **kv):
    if mpi:  # (the MPI options exist once fflow.mpi_ops is loaded, on MPI ranks)
        for k, v in kv.items():
            fflow.config.update(k, v)


def main(n):
    rt = runtime()
    mpi = hasattr(rt, "world")
    pl = fflow.placement("cpu", list(range(n)))
    out = {}
    case = 0
    for shm in (True, False):
        for limit, tune in LIMITS:
            set_config(mpi, mpi_shared_memory=shm, mpi_allgather_bytes=limit, mpi_tune_calls=tune)
            for (dt, src), shape in [(k, s) for k in KINDS for s in SHAPES]:
                case += 1
                f = fflow.shard(lambda a: a, pl, in_sbp=src, out_sbp=B)
                dtype = np.dtype(dt).type
                gs = [
                    global_of(parts([case, c], shape, dtype, n, src), pl, src, mpi, rt)
                    for c in range(CALLS)
                ]
                kept = [f(g) for g in gs]
                key = f"{shm}_{limit}_{tune}_{dt}_{src}_{shape}"
                out[key] = [np.asarray(r).tolist() for r in kept]
    set_config(mpi, mpi_shared_memory=True, mpi_allgather_bytes=1 << 19, mpi_tune_calls=4)

    # a slow member: rank n-1 sleeps after every barrier of a new window, while the rows
    # path (one barrier) and the two-step path alternate on that window call by call
    if mpi:
        from fflow import mpi_shm

        base = mpi_shm._Window

        class Slow(base):
            def __init__(self, *a):
                super().__init__(*a)
                sync = self.sync

                def slow(rt_, ranks, what):
                    sync(rt_, ranks, what)
                    if rt_.rank == n - 1:
                        time.sleep(0.003)

                self.sync = slow

        mpi_shm._Window = Slow
    f = fflow.shard(lambda a: a, pl, in_sbp=P, out_sbp=B)
    rs = fflow.shard(lambda a: a, pl, in_sbp=P, out_sbp=S(0))
    ag = fflow.shard(lambda a: a, pl, in_sbp=S(0), out_sbp=B)
    # (inputs made first: making one may synchronize; each kind's calls back to back)
    gp = [global_of(parts([999, c], (48, 40), np.float32, n, P), pl, P, mpi, rt) for c in range(16)]
    wholes = [parts([997, c], (40 * n, 40), np.float32, 1, B)[0] for c in range(16)]
    gs = [global_of([w[40 * k : 40 * k + 40] for k in range(n)], pl, S(0), mpi, rt) for w in wholes]
    slow = []
    for c, g in enumerate(gp):
        set_config(mpi, mpi_tune_calls=0, mpi_allgather_bytes=(1 << 4) if c % 2 else 1 << 30)
        slow.append(f(g))
    slow_rs = [rs(g) for g in gp]
    slow_ag = [ag(g) for g in gs]
    for key, vals in [("slow", slow), ("slow_rs", slow_rs), ("slow_ag", slow_ag)]:
        out[key] = [np.asarray(v).tolist() for v in vals]
    if mpi:
        mpi_shm._Window = base
        out["windows"] = sorted({w.cap for w in mpi_shm._windows.values()})
        out["slow_class"] = [type(w).__name__ for w in mpi_shm._windows.values()].count("Slow")
        # one member short of /dev/shm room: every member takes MPI's messages (agreed)
        room = mpi_shm._shm_room
        mpi_shm._shm_room = (lambda: 0) if rt.rank == n - 1 else room
    f = fflow.shard(lambda a: a, pl, in_sbp=partial_min, out_sbp=B)
    vals = parts([996], (5000,), np.float32, n, partial_min)
    out["room"] = [np.asarray(f(global_of(vals, pl, partial_min, mpi, rt))).tolist()]
    out["room"] += [np.asarray(f(global_of(vals, pl, partial_min, mpi, rt))).tolist()]
    if mpi:
        mpi_shm._shm_room = room
        out["refused"] = sorted(key[1] for key in mpi_shm._refused)
        budget, mpi_shm.SHM_BYTES = mpi_shm.SHM_BYTES, mpi_shm._used[0]  # no room left
    # over the window budget: a new size class takes MPI's messages (planned and not)
    f = fflow.shard(lambda a: a, pl, in_sbp=partial_max, out_sbp=B)
    vals = parts([998], (3000,), np.float32, n, partial_max)
    out["budget"] = [np.asarray(f(global_of(vals, pl, partial_max, mpi, rt))).tolist()]
    out["budget"] += [np.asarray(f(global_of(vals, pl, partial_max, mpi, rt))).tolist()]
    if mpi:
        out["windows_after"] = sorted({w.cap for w in mpi_shm._windows.values()})
        mpi_shm.SHM_BYTES = budget
    # gradient buckets: one per weight (several in flight, each on its own lane of one
    # size class's windows; 7.5-8 KB each, so 2-rank sums take the window too), ten steps
    # back to back, every gradient kept
    rw = np.random.default_rng(31)
    ws = [rw.normal(size=(32, 60 + c)).astype(np.float32) for c in range(4)]
    xb = rw.normal(size=(512 * n, 32)).astype(np.float32)
    gx = global_of([xb[512 * k : 512 * k + 512] for k in range(n)], pl, S(0), mpi, rt)

    def lin(w0, w1, w2, w3, x):
        return sum(jnp.sum(jnp.tanh(x @ w)) for w in (w0, w1, w2, w3))

    set_config(mpi, mpi_allgather_bytes=1 << 19, mpi_tune_calls=4)  # (rows: one barrier)
    fflow.config.update("grad_bucket_mb", 0.0001)
    if mpi:  # rank n-1 reads its buckets' slots late (after their barrier)
        finish = mpi_shm.finish

        def late(rt_, *a):
            if rt_.rank == n - 1:
                time.sleep(0.02)
            return finish(rt_, *a)

        mpi_shm.finish = late
    g = fflow.jit(fflow.grad(fflow.shard(lin, pl, in_sbp=(B,) * 4 + (S(0),)), argnums=(0, 1, 2, 3)))
    kept = [g(*ws, gx) for _ in range(10)]
    fflow.config.update("grad_bucket_mb", 25.0)
    if mpi:
        mpi_shm.finish = finish
    out["buckets"] = [[np.asarray(a).tolist() for a in step] for step in kept]
    if rt.rank == 0:
        print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main(int(sys.argv[1]))
