"""The transformer block training step of bench_transformer.py (its attention written by
hand: softmax(q @ kᵀ · d^-0.5) @ v) with fflow's attention rewrite on and off, timed
interleaved in one process (the rewrite is read when jit traces): the on/off ratio is
what the fused primitive (lowering/cpu_attention.py) buys on the CPU.

    python benchmarks/bench_attention_rewrite.py [--seq 512] [--reps 10]
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_transformer import init, make_run  # noqa: E402
from common import fmt_time, interleaved_times  # noqa: E402

import fflow  # noqa: E402
import fflow.numpy as jnp  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tiny", action="store_true", help="tiny sizes (tests)")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--seq", type=int, default=128, help="sequence length (default 128)")
    # accepted like every benchmark (run_all and the smoke test pass it); fflow-only table
    parser.add_argument("--only", default=None, help="comma-separated subset (fflow only)")
    args = parser.parse_args()
    b, s, d, heads, m = (2, 8, 16, 2, 32) if args.tiny else (8, args.seq, 256, 4, 1024)
    reps = args.reps or (2 if args.tiny else 10)
    params = init(d, m)
    x = np.random.default_rng(1).normal(size=(b, s, d)).astype(np.float32)
    runs = {}
    for label, on in (("rewrite off", False), ("rewrite on", True)):
        fflow.config.update("attention_rewrite", on)
        runs[label] = make_run(jnp, fflow.nn, fflow.value_and_grad, fflow.jit, params, x, heads)
        runs[label]()  # traces with the flag as set now
    fflow.config.update("attention_rewrite", True)
    times = interleaved_times(runs, reps)
    off, on = times["rewrite off"], times["rewrite on"]
    cpu = cpu_times(runs, reps)
    print(f"## Transformer block step, attention by hand (batch {b}, seq {s}, d {d}, "
          f"{heads} heads, MLP {m}), CPU")  # fmt: skip
    print()
    print("| workload | rewrite off | rewrite on | off/on |")
    print("|---|---|---|---|")
    print(f"| block step, wall | {fmt_time(off)} | {fmt_time(on)} | {off / on:.2f}× |")
    c_off, c_on = cpu["rewrite off"], cpu["rewrite on"]
    print(f"| block step, CPU time | {fmt_time(c_off)} | {fmt_time(c_on)} | {c_off / c_on:.2f}× |")
    print()
    print(f"load average {os.getloadavg()[0]:.1f}; CPU time is the process's (all threads), "
          "less sensitive than wall time to other processes on the machine")  # fmt: skip


def cpu_times(fns, reps):
    """Median process CPU seconds per call, alternating the order every round."""
    samples = {name: [] for name in fns}
    names = list(fns)
    for r in range(reps):
        for name in names if r % 2 == 0 else names[::-1]:
            t0 = time.process_time()
            fns[name]()
            samples[name].append(time.process_time() - t0)
    return {name: statistics.median(ts) for name, ts in samples.items()}


if __name__ == "__main__":
    main()
