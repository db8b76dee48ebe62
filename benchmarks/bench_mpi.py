"""MPI: (1) an all-reduce of 1 KB ... 64 MB through a sharded program (P -> B) vs raw
mpi4py `comm.Allreduce` on the same buffers, at 2 and 4 ranks, in fflow's
deterministic mode (default: bit-identical to the simulated runtime) and native mode
(MPI's own reduction), the three interleaved call by call; (2) data-parallel MLP step
(784-1024-1024-10) weak scaling: n ranks x 1 BLAS thread at per-rank batch B vs 1
process x 1 thread at batch B (rank 0 alone in the same launch, interleaved), next to
a hand-written DP step (jit gradients + one raw Allreduce of them all + jit update: what
MPI and fflow's kernels allow), with the time fflow's step spent blocked in
communication (collectives, bucket starts, polls and waits), and the same step with its
gradient buckets waited for right after they start (config grad_overlap=False):
"hidden" is the blocked time overlap removed, and "blocked in bucket waits" how long
the buckets' own waits took with and without overlap (with overlap their data moves
earlier, inside the polls and the other collectives' waits); and every rank running the
1-process step at once without communication (the floor of weak scaling here: the
ranks share the machine's memory bandwidth and caches).

    python benchmarks/bench_mpi.py [--tiny]     # launches itself with fflow.launch
    python benchmarks/bench_mpi.py --allreduce-only [--ranks 4]   # the all-reduce table

Times are medians (max over ranks per repetition); ratios are fflow / raw MPI.
The last DP row runs with MPICH's progress thread (MPIR_CVAR_ASYNC_PROGRESS=1), which
moves bucket data while Python computes; otherwise MPI progresses only when fflow
polls the bucket requests between compiled segments (shard_exec "progress" stages)
and inside every other MPI call.

Measured 2026-12-02 on the shared 2-core machine (fflow / raw comm.Allreduce, same
launch; det = deterministic mode, nat = native):

| all-reduce | ranks | before (quiet, load 0) det / nat | after, load ~1 det / nat |
|---|---|---|---|
| 1 KB | 2 | 37x / 22x (233 / 138 us vs 6 us) | 18x / 17x (137 / 126 us vs 8 us) |
| 64 KB | 2 | 9.5x (272 vs 29 us) | 5.3x / 4.7x (214 / 188 vs 40 us) |
| 1 MB | 2 | 2.2x (664 vs 297 us) | 1.3x / 1.3x (556 / 567 vs 425 us) |
| 1 KB | 4 | 68x (4.6 ms floor) | 6.0x / 5.0x (0.79 / 0.66 ms vs 0.13 ms) |
| 64 KB | 4 | 4.6 ms floor | 12x / 4.9x (3.4 / 1.4 ms vs 0.29 ms) |
| 1 MB | 4 | 4.6 ms floor | 0.7x / 0.6x (5.1 / 4.4 ms vs 7.5 ms) |

The 4-rank floor was the wait loop spinning 2 ms before yielding the core to a peer
on it (4 ranks on 2 cores): waits now yield after every 16 tests. DP MLP step
(784-1024-1024-10, batch 256 per rank): before, quiet: 1 process 17.2 ms, 2 ranks
56.9 ms (3.3x), 4 ranks 119 ms (6.9x). Part of it was each rank running 2 GEMM
threads on 2 shared cores (fixed: fflow.launch gives each rank its share,
FFLOW_RANKS_PER_NODE).

Session 4 (cache-hit calls on a cheap key, NumPy inputs borrowed instead of copied,
one-collective programs without the generator, in-place ordered reduction), load ~1-2:
2 ranks det / nat vs raw: 1 KB 5.9x / 4.9x (43 / 36 vs 7 us), 64 KB 2.9x / 1.9x,
1 MB 1.5x / 1.3x, 4 MB 1.4x / 1.2x, 16 MB 2.2x / 2.1x, 64 MB 1.35x / 1.3x; 4 ranks
1 KB 4.4x, 1 MB 1.6x, 64 MB 1.2x. DP MLP: 2 ranks 1.84x of 1 process (48.5 vs 26.3
ms, 17% communication), 4 ranks 5.1x.

Session 5 (leaner call path, MPI's own sum where its bits are the ordered sum's,
reused result buffers, one all-gather up to 1 MB moved, two-step sums from 32 MB), det
/ raw, three runs at load 2.3-4.9 (08:39-08:41 UTC; the rest of the session was at load
5-21): 2 ranks 1 KB 1.39-1.64x (7 vs 4-5 us), 16 KB 1.27-1.29x, 64 KB 1.21-1.22x,
256 KB 1.11-1.30x, 1 MB 1.03-1.05x, 4 MB 0.86-0.94x, 16 MB 1.08-2.00x (MPICH's
Iallreduce at 16 MB swings against its blocking Allreduce), 64 MB 1.01-1.08x (two-step
since: 0.48-0.49x in a same-launch A/B); 4 ranks (det / native) 1 KB 1.88-2.62x /
1.56-2.16x, 64 KB 1.27-2.08x / 1.37-2.05x, 256 KB 1.06-1.91x / 1.21-1.67x, 1 MB
1.32-3.19x / 1.00-2.79x, 4 MB-64 MB 0.48-1.11x. DP MLP, 2 ranks vs 1 process: fflow
1.28x / 1.45x / 1.31x, hand DP (one raw Allreduce) 1.43x / 1.61x / 1.37x: fflow's
step is faster than the hand-written one; under load 4-13 both were 1.5-2.2x. 4 ranks
share 2 cores (2.7-4.7x: not a weak-scaling setup here). "Hidden" (blocked time
without overlap minus with) was -1.4 to 0.8 ms at 2 ranks: one 4 MB bucket, which
also progresses inside the planner's other blocking collectives.

Session 5, later (all-reduces from 2 MB: the ordered two-step path in 4 MB pieces in
both modes, mpi_ops.mpi_large_bytes), one run at load 1.3-1.8, det / native vs raw:
2 ranks 64 KB 1.16 / 1.15x, 256 KB 1.09 / 1.08x, 1 MB 1.03x, 4 MB 0.78 / 0.79x, 16 MB
1.06 / 1.03x (was 1.33-1.50x), 64 MB 0.29 / 0.28x; 4 ranks 64 KB 1.30 / 1.16x, 256 KB
2.21 / 1.19x (the one-all-gather path), 1 MB 0.99 / 1.12x, 4 MB 0.74x, 16 MB 0.96 /
0.83x, 64 MB 0.35 / 0.34x. DP MLP 2 ranks: fflow 1.23x of 1 process, hand DP 1.31x.

Session 6 (a one-collective program's cache hit runs a planned runner: runtime_mpi._runner,
mpi_ops.planned; all-gather path up to 512 KB moved, so 4 ranks x 256 KB take the two-step
path). Load 5-12 all session (no quiet run; 4-rank rows were scheduler slices), 2 ranks,
same launch, det / raw: before vs after (two alternating launches each, load 5-6): 1 KB
1.23x vs 1.05-1.09x, 64 KB 1.17x vs 1.09x, 256 KB 1.11x vs 1.04x; same program with the
runner disabled vs enabled in one launch: 1 KB 1.82 vs 1.30x, 64 KB 1.32 vs 1.17x, 256 KB
1.12 vs 1.05x. DP table: new column "every rank alone, no comm": the weak-scaling floor.

Session 7, DP table (ranks at autogroup nice -20 in the measuring scripts, machine load
7-9 from other sessions; same-launch medians): bucket starts and polls now count as
blocked; gradients of >= 1 MB held by nothing else are reduced in place (no 4 MB pack
copy): 2 ranks 1.18-1.24x of 1 process (packed in the same launches 1.19-1.24x, 6 of 7
pairs slower), floor 1.01-1.02x there. The bucket's own wait is 0.00 ms with overlap vs
0.8-1.5 ms without, yet "hidden" stays -0.25..0.08 ms: its data moves inside the layer-1
collectives' waits (MPI moves data only inside MPI calls, and its shared-memory copies
take the ranks' own CPUs; the overlap probe table shows a polling thread emptying the
wait and slowing the GEMM more). 4 ranks (2 per core): overlap 2.91 / 3.46x vs waited at
start 3.34 / 3.69x (there a waiting rank yields its core to one that computes).

Session 7 (deterministic all-reduces, reduce-scatters and all-gathers of ranks on one
node through an MPI shared-memory window: fflow/mpi_shm.py; this table in 5 rounds of
40 interleaved calls, ratios as the median (min-max) of the per-round ratios). The
machine was loaded by other work all session (load 6-11). det / raw Allreduce, six
launches at 4 ranks (14:54-15:17): 1 KB 0.74-1.37x, 16 KB 0.44-0.95x, 64 KB
0.40-0.81x, 256 KB 0.35-0.73x, 1 MB 0.29-0.76x, 4 MB 0.47-0.57x, 16 MB 0.54-0.70x,
64 MB 0.27-0.51x; in five of them without the window (MPI's messages): 64 KB
0.56-1.51x, 256 KB 0.79-1.79x, 1 MB 0.76-1.50x, 16 MB 2.16-3.53x. 2 ranks, the quietest
launch (raw 1 KB 4 us): 1 KB 1.02x, 64 KB 0.57x, 256 KB 0.49x, 1 MB 0.58x, 4 MB 0.19x,
16 MB 0.81x, 64 MB 0.50x (MPI's own sum, native mode: 0.97-1.03x up to 1 MB).
A later launch (15:46, raw 64 KB 214 us: out of the time-slice regime) gave 4 ranks
64 KB 1.16x (16 KB 1.20x); forced paths right after: rows 0.48x, two-step 0.64x, so
below 64 KB + 1 at 4 ranks the window's rows path is now used without tuning (e8957d9);
after it, 64 KB det 0.43 / 0.50x (two launches, time slices) and 0.72-0.74x in two
short probes with raw at 209-217 us (MPI-message rows path there: 1.19-1.34x).

Session 7 (dpcost): ranks plan with the CPU_MPI profile by default (fflow/device_profile.py),
which gives this step plain data parallelism; the column "CPU-profile plan" is the plan of
the simulated-device profile (layer 1's update split: all_to_all + 2 all_gathers at 2 ranks,
reduce_scatter + all_gather at 4) in the same launch. Load 6-10, 25 steps per variant, x of
1 process: 2 ranks, planner (now plain DP) vs CPU-profile plan: 1.40/1.53, 1.33/1.43,
1.26/1.26, 1.53/1.61, 1.26/1.34, 1.99/2.01, 1.85/1.86 (faster in 7 of 7); plain DP forced
1.24, 1.36, 1.14, 1.53, 1.17, 1.96, 1.79 (the same collectives, but dW1 transposed before
its all-reduce; the planner all-reduces it first, then its update reads dW1 transposed: a
tie in the model, 3-8% slower in three more launches, 1.33/1.27/1.34 vs 1.29/1.23/1.24
(old plan 1.37/1.36/1.36), and 1-6% slower on 2 simulated devices, so not MPI). 4 ranks
(2 per core) the other way: planner 2.48, 2.62, 2.42, 2.39, 3.20 vs CPU-profile plan 2.22,
2.38, 2.27, 2.10, 2.78.
"""

import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
from common import ROOT, parse_args

SIZES = [1 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def _rounds(comm, fns, reps, rounds):
    """Per name, one median per round of the slowest rank's time for a call of
    fns[name] = (setup, fn) (setup runs untimed before each call). Within a round the
    calls are interleaved one by one and the order rotates every repetition, so every
    variant sees the same share of a machine whose load changes (4 ranks on 2 cores are
    oversubscribed: a rank waits for a peer's time slice); the rounds show the spread."""
    for setup, fn in fns.values():
        setup()
        for _ in range(3):
            fn()
    names = list(fns)
    out = {name: [] for name in names}
    for _ in range(rounds):
        times = {name: [] for name in names}
        for r in range(reps):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                setup, fn = fns[name]
                setup()
                comm.Barrier()
                t0 = time.perf_counter()
                fn()
                dt = time.perf_counter() - t0
                times[name].append(comm.allreduce(dt, op=_max()))
        for name in names:
            out[name].append(statistics.median(times[name]))
    return out


def _max():
    from mpi4py import MPI

    return MPI.MAX


def _mode(deterministic, shared=True):
    import fflow

    def setup():
        fflow.config.update("mpi_deterministic", deterministic)
        fflow.config.update("mpi_shared_memory", shared)

    return setup


def allreduce_rows(sizes, tiny=False):
    """Per size: raw comm.Allreduce, fflow's P -> B in deterministic mode (the default),
    the same without the shared-memory window (MPI messages only) and in native mode,
    interleaved call by call; per variant the per-round medians (5 rounds of 40 calls
    up to 1 MB, fewer for the large sizes)."""
    import fflow
    from fflow.sharding import B, P, runtime

    rt = runtime()
    comm = rt.world
    n = comm.Get_size()
    pl = fflow.placement("cpu", list(range(n)))
    ident = fflow.shard(lambda g: g, pl, in_sbp=P, out_sbp=B)
    rows = []
    for nbytes in sizes:
        count = nbytes // 4
        rounds, reps = (2, 4) if tiny else (5, 40) if nbytes <= 1 << 20 else (5, 8)
        if nbytes >= 64 << 20 and not tiny:
            rounds, reps = 3, 4
        local = np.random.default_rng(comm.Get_rank()).normal(size=count).astype(np.float32)
        g = fflow.make_global_array(local, pl, P)
        out = np.empty_like(local)
        fns = {
            "raw": (_mode(True), lambda a=local, o=out: comm.Allreduce(a, o)),
            "deterministic": (_mode(True), lambda g=g: ident(g)),
            "det_messages": (_mode(True, False), lambda g=g: ident(g)),
            "native": (_mode(False), lambda g=g: ident(g)),
        }
        row = _rounds(comm, fns, reps, rounds)
        _mode(True)()
        row["bytes"] = nbytes
        rows.append(row)
    return rows


def mlp_params(sizes):
    rng = np.random.default_rng(0)
    return [
        (
            (rng.normal(size=(a, b)) * np.sqrt(2.0 / a)).astype(np.float32),
            np.zeros(b, np.float32),
        )
        for a, b in zip(sizes[:-1], sizes[1:])
    ]


def _solo(comm, fn):
    """Rank 0 runs fn alone (the other ranks sleep, not spin, until it is done): the
    1-process baseline measured in the same launch, at the same machine load."""
    t0 = time.perf_counter()
    if comm.Get_rank() == 0:
        fn()
    dt = time.perf_counter() - t0
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.0005)
    return dt


def dp_rows(batch, dims, steps):
    """Data-parallel SGD step at per-rank `batch`, interleaved in one launch: 1 process
    (rank 0 alone, jit), fflow on every rank (shard), and a hand-written DP step (jit
    gradients, one raw comm.Allreduce of all of them packed, jit update), fflow with
    each bucket waited for at its start, and every rank running the 1-process step. Also
    the time fflow's step spent blocked in communication and in its buckets' own waits,
    with and without overlap (runtime_mpi's comm_seconds, bucket_wait_seconds)."""
    from fflow.transforms.shard import with_sbp
    from fflow.transforms.shard_buckets import plan_buckets

    import fflow
    import fflow.numpy as jnp
    from fflow.sharding import CPU, B, P, S, runtime

    def loss(params, x, y):
        h = x
        for w, b in params[:-1]:
            h = jnp.maximum(h @ w + b, 0.0)
        w, b = params[-1]
        logits = h @ w + b
        logp = logits - jnp.log(jnp.sum(jnp.exp(logits), axis=-1, keepdims=True))
        return -jnp.mean(jnp.sum(y * logp, axis=-1))

    def update(params, grads):
        return [(w - 0.01 * gw, b - 0.01 * gb) for (w, b), (gw, gb) in zip(params, grads)]

    def step(params, x, y):
        value, grads = fflow.value_and_grad(loss)(params, x, y)
        return value, update(params, grads)

    def plain_step(params, x, y):  # plain data parallelism: every gradient P -> B
        value, grads = fflow.value_and_grad(loss)(params, x, y)
        grads = fflow.tree_util.tree_map(lambda g: with_sbp(with_sbp(g, P), B), grads)
        return value, update(params, grads)

    rt = runtime()
    comm = rt.world
    n = comm.Get_size()
    rng = np.random.default_rng(comm.Get_rank())
    x = rng.normal(size=(batch, dims[0])).astype(np.float32)
    y = np.eye(dims[-1], dtype=np.float32)[rng.integers(0, dims[-1], batch)]
    params = mlp_params(dims)
    one = fflow.jit(step)
    pl = fflow.placement("cpu", list(range(n)))
    dp = fflow.shard(step, pl, in_sbp=(B, S(0), S(0)), out_sbp=B)
    plain = fflow.shard(plain_step, pl, in_sbp=(B, S(0), S(0)), out_sbp=B)
    # the plan of the simulated-device profile (what ranks got before CPU_MPI)
    sim_plan = fflow.shard(step, pl, in_sbp=(B, S(0), S(0)), out_sbp=B, profile=CPU)
    gx, gy = fflow.make_global_array(x, pl, S(0)), fflow.make_global_array(y, pl, S(0))
    grad_fn, update_fn = fflow.jit(fflow.value_and_grad(loss)), fflow.jit(update)
    flat = np.empty(sum(a.size for layer in params for a in layer), np.float32)
    summed = np.empty_like(flat)

    def hand():
        _, grads = grad_fn(params, x, y)
        leaves = [np.asarray(g) for layer in grads for g in layer]
        np.concatenate([g.reshape(-1) for g in leaves], out=flat)
        comm.Allreduce(flat, summed)
        out, k = [], 0
        for layer in params:
            out.append(tuple(summed[k : (k := k + a.size)].reshape(a.shape) for a in layer))
        return update_fn(params, out)

    def fflow_dp(overlap):
        def run():
            fflow.config.update("grad_overlap", overlap)
            try:
                dp(params, gx, gy)
            finally:
                fflow.config.update("grad_overlap", True)

        return run

    variants = {
        "fflow": fflow_dp(True),
        "no_overlap": fflow_dp(False),
        # the planner's plan vs plain data parallelism (one bucket of every gradient)
        "plain": lambda: plain(params, gx, gy),
        "cpu_profile": lambda: sim_plan(params, gx, gy),
        "hand": hand,
        # every rank runs the 1-process step at once, no communication: the floor of
        # weak scaling on this machine (the ranks share memory bandwidth and caches)
        "concurrent": lambda: one(params, x, y),
    }
    for _ in range(2):
        one(params, x, y)
        for run in variants.values():
            run()
    samples = {k: [] for k in ("one", *variants)}
    blocked = {"fflow": [], "no_overlap": []}
    bucket_wait = {"fflow": [], "no_overlap": []}
    names = list(variants)
    for r in range(steps):
        samples["one"].append(_solo(comm, lambda: one(params, x, y)))
        k = r % len(names)
        for name in names[k:] + names[:k]:
            c0, w0 = rt.comm_seconds, rt.bucket_wait_seconds
            comm.Barrier()
            t0 = time.perf_counter()
            variants[name]()
            dt = time.perf_counter() - t0
            samples[name].append(comm.allreduce(dt, op=_max()))
            if name in blocked:
                blocked[name].append(comm.allreduce(rt.comm_seconds - c0, op=_max()))
                waited = rt.bucket_wait_seconds - w0
                bucket_wait[name].append(comm.allreduce(waited, op=_max()))
    med = {k: statistics.median(v) for k, v in samples.items()}
    med.update({f"blocked_{k}": statistics.median(v) for k, v in blocked.items()})
    med.update({f"bucket_wait_{k}": statistics.median(v) for k, v in bucket_wait.items()})
    med["buckets"] = [b.nbytes for b in plan_buckets(dp.plan(params, gx, gy).local_program(0))]
    med["profile"] = dp.plan(params, gx, gy).plan.profile.name
    med["collectives"] = sorted(
        {c for *_, bp in dp.plan(params, gx, gy).boxings() if bp.bytes for c in bp.collectives()}
    )
    return med


def overlap_probe(reps, n_floats=1 << 20, gemm=(512, 784)):
    """What overlap can hide on this machine, without fflow: every rank starts an
    in-place Iallreduce of a 4 MB bucket, runs a GEMM (~the DP step's layer-1 weight
    gradient), then waits; with no progress during the GEMM (MPI moves data only inside
    MPI calls, as fflow's polls between compiled segments), with a thread calling
    MPI's progress engine (an Iprobe that matches nothing) every 50 us while the GEMM
    runs with the GIL released, and all-reduce then GEMM. Medians of the slowest
    rank's GEMM, wait after it and total, in seconds."""
    import threading

    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    g = np.random.default_rng(0).random(n_floats, np.float32)
    a = np.random.default_rng(1).random(gemm, np.float32)
    on, stop = threading.Event(), []

    def poll():
        while not stop:
            on.wait(0.05)
            while on.is_set():
                comm.Iprobe(source=MPI.ANY_SOURCE, tag=31999)
                time.sleep(50e-6)

    threading.Thread(target=poll, daemon=True).start()

    def one(mode):
        comm.Barrier()
        t0 = time.perf_counter()
        if mode == "sequential":
            comm.Allreduce(MPI.IN_PLACE, g)
            t1 = time.perf_counter()
            a.T @ a
            t2 = time.perf_counter()
            return t2 - t1, t1 - t0, t2 - t0
        req = comm.Iallreduce(MPI.IN_PLACE, g)
        if mode == "thread":
            on.set()
        t1 = time.perf_counter()
        a.T @ a
        t2 = time.perf_counter()
        on.clear()
        while not req.Test():
            pass
        t3 = time.perf_counter()
        return t2 - t1, t3 - t2, t3 - t0

    modes = ("none", "thread", "sequential")
    out = {m: [] for m in modes}
    for r in range(reps + 1):
        for m in modes:
            times = [comm.allreduce(t, op=_max()) for t in one(m)]
            if r:  # (the first round warms up)
                out[m].append(times)
    stop.append(True)
    return {m: [statistics.median(t[i] for t in v) for i in range(3)] for m, v in out.items()}


def worker(tiny):
    import fflow

    sizes = SIZES[:3] if tiny else SIZES
    dims = (784, 64, 10) if tiny else (784, 1024, 1024, 10)
    batch = 16 if tiny else 256
    result = {}
    if "--dp-only" not in sys.argv:
        result["allreduce"] = allreduce_rows(sizes, tiny)
    if "--allreduce-only" not in sys.argv:
        result["dp"] = dp_rows(batch, dims, 3 if tiny else 25)
        if "--dp-only" not in sys.argv:
            result["probe"] = overlap_probe(3 if tiny else 40)
    if fflow.process_index() == 0:
        print("RESULT " + json.dumps(result), flush=True)


def launch(n, tiny, extra_env=None, dp_only=False, allreduce_only=False):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.update(extra_env or {})
    env.pop("FFLOW_RUNTIME", None)
    me = os.path.abspath(__file__)
    args = [me, "--worker"] + (["--tiny"] if tiny else []) + (["--dp-only"] if dp_only else [])
    args += ["--allreduce-only"] if allreduce_only else []
    cmd = [sys.executable, "-m", "fflow.launch", "-n", str(n), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"bench_mpi: the {n}-rank run failed:\n{proc.stderr[-3000:]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def _size(b):
    return f"{b >> 20} MB" if b >= 1 << 20 else f"{b >> 10} KB"


def _us(t):
    return f"{t * 1e6:.0f} us" if t < 0.01 else _ms(t)


def _ms(t):
    return f"{t * 1e3:.1f} ms"


def main():
    if "--worker" in sys.argv:
        worker("--tiny" in sys.argv)
        return
    only = "--allreduce-only" in sys.argv
    ranks = [2, 4]
    if "--ranks" in sys.argv:  # (taken out before the common options are parsed)
        k = sys.argv.index("--ranks")
        ranks = [int(r) for r in sys.argv[k + 1].split(",")]
        del sys.argv[k : k + 2]
    sys.argv = [a for a in sys.argv if a != "--allreduce-only"]
    args = parse_args(__doc__.split("\n")[0])
    runs = {n: launch(n, args.tiny, allreduce_only=only) for n in ranks}
    print("\nall-reduce (f32) through a sharded program (P -> B) vs raw comm.Allreduce, same")
    print("launch, calls interleaved; times: median of the per-round medians; ratios: median")
    print("(min-max) over the rounds of fflow / raw; 'MPI messages': mpi_shared_memory off")
    print(
        "| workload | ranks | raw MPI | fflow deterministic | ratio | deterministic, MPI "
        "messages | ratio | fflow native | ratio |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for n, res in runs.items():
        for row in res["allreduce"]:
            raw = row["raw"]
            cells = [f"all-reduce {_size(row['bytes'])}", str(n), _us(statistics.median(raw))]
            for name in ("deterministic", "det_messages", "native"):
                ratios = [t / r for t, r in zip(row[name], raw)]
                cells.append(_us(statistics.median(row[name])))
                cells.append(
                    f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
                )
            print("| " + " | ".join(cells) + " |")
    if only:
        return
    # MPICH's progress thread moves bucket data while Python computes the backward pass
    # (without it MPI progresses only when fflow polls between compiled segments)
    async_run = launch(2, args.tiny, {"MPIR_CVAR_ASYNC_PROGRESS": "1"}, dp_only=True)
    print("\ndata-parallel MLP step, weak scaling (1 BLAS thread per process; the 1-process")
    print("step is rank 0 alone in the same launch, interleaved with the n-rank steps)")
    print(
        "| ranks | 1 process | fflow DP | vs 1 process | hand DP (jit + 1 Allreduce) | vs 1 "
        "process | every rank alone, no comm (floor) | fflow blocked in comm | without "
        "overlap: step / blocked | hidden | blocked in bucket waits: overlap / without | "
        "fflow, plain DP forced | fflow, CPU-profile plan | planner's profile: collectives |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = [(n, res["dp"]) for n, res in runs.items()]
    rows.append(("2, MPICH async progress", async_run["dp"]))
    for n, d in rows:
        t1 = d["one"]
        hidden = d["blocked_no_overlap"] - d["blocked_fflow"]
        print(
            f"| {n} | {_ms(t1)} | {_ms(d['fflow'])} | {d['fflow'] / t1:.2f}x | "
            f"{_ms(d['hand'])} | {d['hand'] / t1:.2f}x | {d['concurrent'] / t1:.2f}x | "
            f"{_ms(d['blocked_fflow'])} "
            f"({d['blocked_fflow'] / d['fflow'] * 100:.0f}%) | {_ms(d['no_overlap'])} / "
            f"{_ms(d['blocked_no_overlap'])} | {_ms(hidden)} ({len(d['buckets'])} buckets, "
            f"{sum(d['buckets']) / 2**20:.1f} MB) | {_ms(d['bucket_wait_fflow'])} / "
            f"{_ms(d['bucket_wait_no_overlap'])} | {d['plain'] / t1:.2f}x | "
            f"{d['cpu_profile'] / t1:.2f}x | {d['profile']}: {'+'.join(d['collectives'])} |"
        )
    print("\nwhat overlap can hide here: a 4 MB bucket's Iallreduce started before a GEMM on")
    print("every rank (mpi4py; MPI's shared-memory transport copies with the ranks' own CPUs)")
    print("| ranks | progress during the GEMM | GEMM | wait after it | total |")
    print("|---|---|---|---|---|")
    labels = {
        "none": "none (MPI moves data only inside MPI calls)",
        "thread": "a thread polling MPI every 50 us",
        "sequential": "none; Allreduce first, then the GEMM (wait = the Allreduce)",
    }
    for n, res in runs.items():
        for mode, (gemm, wait, total) in res["probe"].items():
            print(f"| {n} | {labels[mode]} | {_ms(gemm)} | {_ms(wait)} | {_ms(total)} |")


if __name__ == "__main__":
    main()
