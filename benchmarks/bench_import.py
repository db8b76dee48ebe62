"""`import fflow` time (fresh interpreter, median of runs) next to JAX, PyTorch, NumPy."""

import statistics
import subprocess
import sys

from common import ROOT, parse_args, print_table, wanted


def import_time(module, runs):
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    times = []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
        )
        times.append(float(out.stdout.strip().splitlines()[-1]))
    return statistics.median(times)


def main():
    args = parse_args(__doc__)
    runs = args.reps or (1 if args.tiny else 5)
    times = {}
    for label, module in (
        ("fflow", "fflow"),
        ("jax.jit", "jax"),
        ("torch eager", "torch"),
        ("numpy", "numpy"),
    ):
        if wanted(args, label.split(".")[0].split()[0]):
            try:
                times[label] = import_time(module, runs)
            except subprocess.CalledProcessError:
                times[label] = None
    print_table("Import time", [("import (fresh interpreter)", times)])


if __name__ == "__main__":
    main()
