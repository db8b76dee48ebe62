"""Pipeline parallelism: measured bubble fractions, activation memory and step time.

    python benchmarks/bench_pipeline.py                          # 4 simulated devices
    python -m fflow.launch -n 4 benchmarks/bench_pipeline.py     # 4 MPI ranks
    python -m fflow.launch -n 2 benchmarks/bench_pipeline.py     # p=2 (a core per rank
                                                                 # on a 2-core machine)

One 8-layer tanh MLP over p=4 pipeline devices (p=2 with 2 ranks): GPipe and 1F1B with 4 stages of 2
layers, interleaved 1F1B with 8 stages of 1 layer (v=2 per device); m in {4, 8, 16}
micro-batches. The step takes the gradient of the parameters and of the input
features (as when the pipeline's input comes from a layer before it), so stage 0's
backward does the same work as the others': the textbook figures assume equal
stages, and with parameter gradients only stage 0's backward is 3/4 of the others'
(1/2 with one layer per stage), which alone puts the bottleneck 3-10% under the
theory. Every figure below is measured from what the step did: each process
records every operation it runs (`stats["trace"]`: when it began waiting for its
inputs, when they arrived, when it ended, from `time.perf_counter`, which is one clock
for all processes of a machine, and its thread's CPU seconds), and
`fflow.pipeline_trace.StepTrace` gathers the traces of every rank.

1. Bubble fraction = idle time / (lanes x the step's length), a lane being a device
   (simulated) or a rank (MPI). Theory: (p-1)/(m+p-1) for GPipe and 1F1B,
   (p-1)/(v*m+p-1) for interleaved.
   * "ticks": the operations as executed (each lane's own order, each operation as
     early as the values it consumed allow, one tick each). What a simulated
     runtime can measure of the schedule: its devices run one after the other in
     one process, so wall time says nothing about overlap.
   * "cpu": the same executed dependencies with each operation taking the CPU
     seconds its thread spent on it: the step's timeline if every lane had a core
     of its own and messages were free. An operation's cost is the least CPU
     seconds of its lane, kind and stage over >= 64 runs (m per step; they do the
     same work): its cost on an undisturbed core. On a busy machine a run's CPU time
     grows with the cache misses other processes cause (under MPI the middle ranks,
     busiest at once, grow most: medians made stage imbalances of 1.15 out of equal
     stages). "cpu raw" uses every operation's own seconds (median of the steps'
     figures). "bottleneck" is the idle fraction of the lane with the
     most work: the stages are not equal (stage 0's backward skips the input
     gradient; "imbalance" = busiest lane's work / mean), the other lanes also wait
     for the bottleneck, so its idle time is the fill-and-drain bubble the theory
     describes (a little below it: the lighter lanes feed it early), and "mean"
     adds the imbalance.
   * "wall" (MPI only): per rank, from its timestamps: the window runs from the
     first operation's start to the last one's end over all ranks; busy = the time
     inside the rank's own operations; idle = window - busy (waiting for inputs, and
     walking the schedule between its operations). Real time, so it holds what the
     machine adds: with fewer free cores than ranks the ranks take turns on a core
     (busy time stretches while everyone computes, less so in fill and drain) and a
     message waits for its receiver to be scheduled. The header prints the cores
     and the load; the figure describes the schedule only with a free core per rank.
2. Peak activation bytes per stage (the residuals a device of the stage holds between
   a micro-batch's F and B, measured on the rank holding the stage): 1F1B <= p/m of
   GPipe on stage 0.
3. Seconds per training step (medians, interleaved runs): the same 8-layer model's
   jitted value_and_grad on one process (under MPI rank 0 alone, the others asleep)
   next to each pipeline, every matrix product on one thread. "wall time" is what
   this machine gave; "CPU work" the CPU seconds of the pipeline's operations
   summed over lanes (the reference: its thread's CPU seconds), "CPU span" the
   length of the "cpu" timeline above, i.e. the step's time with a free core per
   lane and free messages; "vs no pipeline (CPU)" = CPU span / the reference's CPU
   seconds.
"""

import os
import statistics
import time

import numpy as np
from common import parse_args

import fflow
import fflow.numpy as jnp
from fflow.pipeline_trace import StepTrace, op_costs
from fflow.sharding import runtime

P_DEVICES = 4
LAYERS = 8


def layer(p, x):
    return jnp.tanh(x @ p["w"] + p["b"])


def mid(ps, xy):
    x, y = xy
    for p in ps:
        x = layer(p, x)
    return x, y


def last(ps, xy):
    x, y = mid(ps, xy)
    return jnp.mean((x - y) ** 2)


def make(width, seed=0):
    rng = np.random.default_rng(seed)
    w = lambda: (rng.normal(size=(width, width)) / np.sqrt(width)).astype(np.float32)
    return [{"w": w(), "b": np.zeros(width, np.float32)} for _ in range(LAYERS)]


def per_stage(layers, n_stages):
    k = LAYERS // n_stages
    return [layers[i * k : (i + 1) * k] for i in range(n_stages)]


def plain(layers, xy):
    return last(layers, xy)


def quiet_barrier(rt):
    """A barrier whose waiting ranks sleep (MPI's own spins and takes a core)."""
    if not hasattr(rt, "comm"):
        return
    req = rt.comm.Ibarrier()
    while not req.Test():
        time.sleep(2e-4)


def timed(fn, rt):
    """(wall seconds, this thread's CPU seconds) of fn()."""
    quiet_barrier(rt)
    t0, c0 = time.perf_counter(), time.thread_time()
    fn()
    t, c = time.perf_counter() - t0, time.thread_time() - c0
    quiet_barrier(rt)
    return t, c


def measure_bubbles(f, vg, args, steps):
    """Per step: ticks, cpu (least costs), cpu (raw) and wall Timelines."""
    traces = []
    rt = runtime()
    for _ in range(steps):
        quiet_barrier(rt)
        vg(*args)
        traces.append(StepTrace.gather(f))
    least = op_costs(traces)
    return [(t.ticks(), t.cpu_timeline(least), t.cpu_timeline(), t.wall()) for t in traces]


def median_of(values):
    return statistics.median(values)


def stage_peaks(f, rt):
    """Per stage: the peak measured on a rank holding it."""
    peaks = f.stats["peak_activation_bytes"]
    if not hasattr(rt, "comm"):
        return peaks
    every = rt.comm.allgather(peaks)
    return [every[f.pipe.placement_of(s).ranks[0]][s] for s in range(len(peaks))]


def pct(x, ref):
    return f"{(x - ref) / ref:+.1%}"


def table(title, header, rows, note=""):
    lines = [f"## {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    if note:
        lines += ["", note]
    print("\n".join(lines) + "\n", flush=True)


def main():
    args = parse_args(__doc__.split("\n")[0])
    # one thread per matrix product: CPU seconds of one thread are then the work of
    # one core (a GEMM pool's threads would not count in the caller's thread_time)
    fflow.config.update("blas_threads", 1)
    rt = runtime()
    mpi = hasattr(rt, "comm")
    rank0 = rt.rank == 0
    width, rows_per_mb = (16, 4) if args.tiny else (512, 32)
    reps = args.reps or (1 if args.tiny else 5)
    p = min(P_DEVICES, rt.device_count())  # fflow.launch -n 2: a 2-device pipeline
    pls = [fflow.placement("cpu", [i]) for i in range(p)]
    ms = (4, 8) if args.tiny else (4, 8, 16)
    layers = make(width)
    # gradients of the parameters and the inputs (see the docstring), both ways
    ref = fflow.jit(fflow.value_and_grad(plain, argnums=(0, 1)))

    bubble_rows, memory_rows, time_rows, pictures = [], [], [], []
    for m in ms:
        rng = np.random.default_rng(m)
        n = m * rows_per_mb
        batch = (
            rng.normal(size=(n, width)).astype(np.float32),
            rng.normal(size=(n, width)).astype(np.float32),
        )
        peaks, steps, spans, works = {}, {}, {}, {}
        for kind, n_stages in (("gpipe", p), ("1f1b", p), ("interleaved", 2 * p)):
            f = fflow.pipeline([mid] * (n_stages - 1) + [last], pls, m, schedule=kind)
            params = per_stage(layers, n_stages)
            vg = fflow.value_and_grad(f, argnums=(0, 1))
            steps[kind] = lambda vg=vg, params=params, batch=batch: vg(params, batch)
            vg(params, batch)  # compile the stages
            # at least 64 runs of each operation (m per step) for its least cost
            runs = measure_bubbles(f, vg, (params, batch), 1 if args.tiny else max(4, 64 // m))
            ticks, cpu = runs[0][0], runs[0][1]  # the least costs are over all steps
            raw_bn = median_of([c.bottleneck for _, _, c, _ in runs])
            spans[kind] = cpu.span
            works[kind] = median_of([sum(c.busy) for _, _, c, _ in runs])
            th = f.schedule.theory()
            row = [
                f"{kind} m={m}" + (" v=2" if kind == "interleaved" else ""),
                f"{th:.3f}",
                f"{ticks.mean_idle:.3f}",
                f"{cpu.bottleneck:.3f}",
                pct(cpu.bottleneck, th),
                f"{cpu.mean_idle:.3f}",
                f"{cpu.imbalance():.2f}",
                f"{raw_bn:.3f}",
            ]
            if mpi:
                wall_bn = median_of([w.bottleneck for *_, w in runs])
                wall_mean = median_of([w.mean_idle for *_, w in runs])
                row += [f"{wall_bn:.3f}", pct(wall_bn, th), f"{wall_mean:.3f}"]
                if kind == "1f1b" and m == 8:
                    pictures.append(StepTrace.gather(f).picture())
            bubble_rows.append(row)
            peaks[kind] = stage_peaks(f, rt)
        ratio = peaks["1f1b"][0] / peaks["gpipe"][0]
        memory_rows.append(
            [
                f"m={m}",
                peaks["gpipe"],
                peaks["1f1b"],
                f"{ratio:.3f}",
                f"{p / m:.3f}",
                "yes" if ratio <= p / m + 1e-9 else "NO",
            ]
        )
        fns = {"no pipeline (jit, 1 process)": lambda batch=batch: ref(layers, batch)}
        fns.update({f"pipeline {k}": v for k, v in steps.items()})
        times = {name: [] for name in fns}
        names = list(fns)
        if rank0 or not mpi:
            fns[names[0]]()  # compile
        for r in range(reps + 1):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                fn = fns[name]
                if name == names[0] and mpi and not rank0:
                    fn = lambda: None  # the reference runs on rank 0 alone
                t = timed(fn, rt)
                if r:  # the first round warms up
                    times[name].append(t)
        base = median_of([t for t, _ in times[names[0]]])
        base_cpu = median_of([c for _, c in times[names[0]]])
        for name in names:
            t = median_of([t for t, _ in times[name]])
            kind = name.split()[-1]
            ms_ = lambda x: f"{x * 1e3:.2f} ms"
            row = [f"{name} m={m}", ms_(t), f"{t / base:.2f}x"]
            if kind in spans:
                row += [ms_(works[kind]), ms_(spans[kind]), f"{spans[kind] / base_cpu:.2f}x"]
            else:
                row += [ms_(base_cpu), ms_(base_cpu), "1.00x"]
            time_rows.append(row)

    if rank0:
        where = rt.describe()
        load = "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
        header = [
            "workload",
            "theory",
            "ticks",
            "cpu: bottleneck",
            "vs theory",
            "cpu: mean",
            "imbalance",
            "cpu raw: bottleneck",
        ]
        if mpi:
            header += ["wall: bottleneck", "vs theory", "wall: mean"]
        table(
            f"Bubble fraction, p={p} ({where}; {os.cpu_count()} cores, {load})",
            header,
            bubble_rows,
        )
        for pic in pictures:
            print("1F1B m=8 as it ran (wall clock, per rank; F/B = computing, . = idle):")
            print("```\n" + pic + "\n```\n")
        table(
            "Peak activation bytes per stage (saved residuals)",
            ["workload", "GPipe", "1F1B", "1F1B/GPipe stage 0", "bound p/m", "holds"],
            memory_rows,
        )
        table(
            f"Seconds per training step ({where}; medians of {reps})",
            [
                "workload",
                "wall time",
                "vs no pipeline",
                "CPU work",
                "CPU span",
                "vs no pipeline (CPU)",
            ],
            time_rows,
        )


if __name__ == "__main__":
    main()
