"""Pipeline parallelism: bubble fractions, activation memory and step time.

    python benchmarks/bench_pipeline.py                          # 4 simulated devices
    python -m fflow.launch -n 4 benchmarks/bench_pipeline.py     # 4 MPI ranks

A 4-layer MLP over 4 stages (one layer each), m in {4, 8, 16} micro-batches:

1. bubble fraction per schedule: measured on the executed schedule (idle ticks / all
   ticks), next to the theory (p-1)/(m+p-1) (GPipe, 1F1B) and (p-1)/(v*m+p-1)
   (interleaved, v=2, 8 stages); "replay" replays the executed order with the
   measured seconds of each stage's F and B (least of 3 steps, then medians per stage
   and kind; under MPI each rank's own operations, summed over ranks with one buffer
   Allreduce), for all devices and for the slowest device. The stages are not equal
   (stage 0's B skips the input gradient, the last stage computes the loss:
   "imbalance" is the slowest stage's F+B over the mean), so the other devices also
   idle by the imbalance; the slowest device's idle fraction is the pipeline's own
   bubble (fill and drain), the figure the theory describes (a little below it when
   the imbalance is large: the others feed the slowest one ahead of time). Under MPI
   "wall" is 1 - (compute seconds / step seconds) averaged over ranks: with 4 ranks
   on a loaded 2-core machine the ranks take turns on the cores, so it measures the
   machine, not the schedule;
2. peak activation bytes per stage, 1F1B vs GPipe (bound: 1F1B <= p/m of GPipe
   on stage 0);
3. seconds per training step, pipelined vs the same model's jitted
   value_and_grad on one process (medians).
"""

import statistics

import numpy as np
from common import interleaved_times, parse_args

import fflow
import fflow.numpy as jnp
from fflow.sharding import runtime


def layer(p, x):
    return jnp.tanh(x @ p["w"] + p["b"])


def mid(p, xy):
    x, y = xy
    return layer(p, x), y


def last(p, xy):
    x, y = xy
    return jnp.mean((layer(p, x) - y) ** 2)


def make(n_stages, width, seed=0):
    rng = np.random.default_rng(seed)
    w = lambda: (rng.normal(size=(width, width)) / np.sqrt(width)).astype(np.float32)
    return [{"w": w(), "b": np.zeros(width, np.float32)} for _ in range(n_stages)]


def plain(params, xy):
    for p in params[:-1]:
        xy = mid(p, xy)
    return last(params[-1], xy)


def mean_over_ranks(x):
    rt = runtime()
    if hasattr(rt, "comm"):
        return rt.comm.allreduce(x) / rt.comm.Get_size()
    return x


def typical(op_seconds):
    """Each op's seconds replaced by the median of its (kind, stage): one slow outlier
    (a GC pause, another process) would otherwise dominate the replay."""
    groups = {}
    for (kind, stage, _mb), sec in op_seconds.items():
        groups.setdefault((kind, stage), []).append(sec)
    med = {k: statistics.median(v) for k, v in groups.items()}
    return {key: med[key[:2]] for key in op_seconds}


def op_seconds(stats):
    return {(o.kind, o.stage, o.mb): o.end - o.start for o in stats["trace"]}


def measured_seconds(stats, sched, pipe, rt):
    """Seconds of every operation: under MPI each rank times its own, summed over ranks
    (one buffer Allreduce); simulated devices run them all in this process."""
    if not hasattr(rt, "comm"):
        return op_seconds(stats)
    keys = [(o.kind, o.stage, o.mb) for o in sched.ops_in_order()]
    mine = np.array([op_seconds(stats).get(k, 0.0) for k in keys])
    total = np.empty_like(mine)
    rt.comm.Allreduce(mine, total)
    return dict(zip(keys, total.tolist()))


def imbalance(seconds, n_stages):
    per_stage = [0.0] * n_stages
    for (_kind, stage, _mb), sec in seconds.items():
        per_stage[stage] += sec
    return max(per_stage) / (sum(per_stage) / n_stages)


def wall_bubble(stats, pipe, rank):
    """1 - this rank's compute seconds / step seconds (MPI only: ranks run at once)."""
    mine = 0.0
    for (_kind, stage, _mb), sec in op_seconds(stats).items():
        if rank in pipe.placement_of(stage).ranks:
            mine += sec
    return 1.0 - mine / (stats["step_end"] - stats["step_start"])


def table(title, header, rows):
    lines = [f"## {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    print("\n".join(lines) + "\n", flush=True)


def main():
    args = parse_args(__doc__.split("\n")[0])
    rt = runtime()
    mpi = hasattr(rt, "comm")
    rank0 = rt.rank == 0
    width, rows_per_mb = (16, 4) if args.tiny else (256, 32)
    reps = args.reps or (1 if args.tiny else 5)
    p = 4
    pls = [fflow.placement("cpu", [i]) for i in range(p)]
    ms = (4, 8) if args.tiny else (4, 8, 16)

    bubble_rows, memory_rows, time_rows = [], [], []
    for m in ms:
        rng = np.random.default_rng(m)
        n = m * rows_per_mb
        batch = (
            rng.normal(size=(n, width)).astype(np.float32),
            rng.normal(size=(n, width)).astype(np.float32),
        )
        peaks = {}
        steps = {}
        for kind, n_stages in (("gpipe", p), ("1f1b", p), ("interleaved", 2 * p)):
            f = fflow.pipeline([mid] * (n_stages - 1) + [last], pls, m, schedule=kind)
            params = make(n_stages, width)
            vg = fflow.value_and_grad(f)
            steps[kind] = lambda vg=vg, params=params, batch=batch: vg(params, batch)
            vg(params, batch)  # compile the stages
            s = f.schedule
            runs = []
            for _ in range(1 if args.tiny else 3):
                vg(params, batch)
                runs.append(measured_seconds(f.stats, s, f.pipe, rt))
            stats = f.stats
            # each operation's least time over the steps: its cost without the pauses
            # a loaded machine adds (another process on the core)
            seconds = typical({k: min(r[k] for r in runs) for k in runs[0]})
            _, idle = s.replay_devices(seconds)
            replay_all, replay_slow = sum(idle) / p, min(idle)
            wall = mean_over_ranks(wall_bubble(stats, f.pipe, rt.rank)) if mpi else None
            th = s.theory()
            bubble_rows.append(
                [
                    f"{kind} m={m}" + (" v=2" if kind == "interleaved" else ""),
                    f"{s.bubble_fraction():.3f}",
                    f"{th:.3f}",
                    f"{(s.bubble_fraction() - th) / th:+.1%}",
                    f"{replay_all:.3f}",
                    f"{replay_slow:.3f}",
                    f"{(replay_slow - th) / th:+.1%}",
                    f"{imbalance(seconds, n_stages):.2f}",
                    "n/a" if wall is None else f"{wall:.3f}",
                ]
            )
            peaks[kind] = stats["peak_activation_bytes"]
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
        params = make(p, width)
        ref = fflow.jit(fflow.value_and_grad(plain))
        fns = {
            "no pipeline (jit, 1 process)": lambda ref=ref, params=params, batch=batch: ref(
                params, batch
            )
        }
        fns.update({f"pipeline {k}": v for k, v in steps.items()})
        times = interleaved_times(fns, reps, warmup=1)
        base = times["no pipeline (jit, 1 process)"]
        for name, t in times.items():
            label = f"{name} (8 layers)" if name.endswith("interleaved") else name
            time_rows.append([f"{label} m={m}", f"{t * 1e3:.2f} ms", f"{t / base:.2f}x"])

    if rank0:
        where = rt.describe()
        table(
            f"Bubble fraction, p={p} ({where})",
            [
                "workload",
                "ticks",
                "theory",
                "ticks vs theory",
                "replay: all devices",
                "replay: slowest device",
                "slowest vs theory",
                "imbalance",
                "wall (MPI)",
            ],  # fmt: skip
            bubble_rows,
        )
        table(
            "Peak activation bytes per stage (saved residuals)",
            ["workload", "GPipe", "1F1B", "1F1B/GPipe stage 0", "bound p/m", "holds"],
            memory_rows,
        )
        table(
            f"Seconds per training step ({where}; medians of {reps})",
            ["workload", "time", "vs no pipeline"],
            time_rows,
        )


if __name__ == "__main__":
    main()
