"""Shared helpers of the benchmark scripts: timing (median after warm-up), optional
frameworks, and the table each script prints (fflow vs JAX jit vs PyTorch eager vs
hand-written NumPy, with ratios)."""

import argparse
import os
import statistics
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def parse_args(description):
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--tiny", action="store_true", help="tiny sizes, few repeats (tests)")
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions")
    parser.add_argument(
        "--only", default=None, help="comma-separated subset: fflow,jax,torch,numpy"
    )
    return parser.parse_args()


def wanted(args, name):
    return args.only is None or name in args.only.split(",")


def load_jax():
    try:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        import jax

        return jax
    except Exception:  # not installed: the column shows n/a
        return None


def load_torch():
    try:
        import torch

        return torch
    except Exception:
        return None


def median_time(fn, reps, warmup=3, inner=1):
    """Median seconds per call of `fn` over `reps` timed runs (each `inner` calls)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t0) / inner)
    return statistics.median(times)


def _threads_running(me):
    """Threads of this process other than the calling one that are running (state R)."""
    n = 0
    try:
        tids = os.listdir(f"/proc/{me}/task")
    except OSError:
        return 0
    for tid in tids:
        if int(tid) == threading.get_native_id():
            continue
        try:
            with open(f"/proc/{me}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        n += stat[stat.rindex(")") + 2] == "R"
    return n


def settle(timeout=0.1):
    """Wait (up to `timeout` s) until no other thread of this process runs: torch's
    OpenMP workers spin ~20 ms after each call, XLA's pool a few ms, each holding a
    core the next framework's call would otherwise use."""
    me, end = os.getpid(), time.perf_counter() + timeout
    while _threads_running(me) and time.perf_counter() < end:
        time.sleep(0.0005)


def interleaved_times(fns, reps, warmup=3, inner=1):
    """Median seconds per call of each `fns[name]`, timed round-robin.

    Interleaving gives every framework the same share of a machine whose load
    changes while the benchmark runs (other processes on a shared box); the order
    rotates every round. Before each call the threads the previous framework left
    spinning go idle (`settle`), as they would for a user running only one
    framework; the wait is not timed.
    """
    if not fns:  # e.g. `--only numpy` on a jit-only row
        return {}
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples = {name: [] for name in fns}
    names = list(fns)
    for r in range(reps):
        # rotate the order: any effect of one call on the next is spread evenly
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn = fns[name]
            settle()
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            samples[name].append((time.perf_counter() - t0) / inner)
    return {name: statistics.median(ts) for name, ts in samples.items()}


def fmt_time(t):
    if t is None:
        return "n/a"
    if t < 1e-3:
        return f"{t * 1e6:.2f} µs"
    if t < 1:
        return f"{t * 1e3:.3f} ms"
    return f"{t:.3f} s"


def print_table(title, rows, note=""):
    """rows: list of (workload, {framework: seconds or None}). Ratios are fflow/other."""
    frameworks = ["fflow", "jax.jit", "torch eager", "numpy"]
    header = ["workload"] + frameworks + ["fflow/jax", "fflow/torch", "fflow/numpy"]
    lines = [f"## {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, times in rows:
        f = times.get("fflow")
        cells = [name] + [fmt_time(times.get(k)) for k in frameworks]
        for other in ("jax.jit", "torch eager", "numpy"):
            o = times.get(other)
            cells.append(f"{f / o:.2f}×" if f is not None and o else "n/a")
        lines.append("| " + " | ".join(cells) + " |")
    if note:
        lines += ["", note]
    text = "\n".join(lines)
    print(text, flush=True)
    return text
