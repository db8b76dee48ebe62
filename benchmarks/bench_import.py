"""`import fflow` time (fresh interpreter, median of runs) next to JAX, PyTorch, NumPy.

Two rows for fflow. "bytecode compiled" is fflow as `pip install` leaves it (pip
byte-compiles every module; JAX, torch and NumPy are measured that way too): the
script runs `compileall` on fflow's packages first. "no bytecode" is the first import
of a source checkout that cannot write bytecode (this machine sets
PYTHONDONTWRITEBYTECODE=1 and fflow is installed editable): every fflow module is
compiled from source, which was ~80% of fflow's import time here.
"""

import os
import shutil
import statistics
import subprocess
import sys

from common import ROOT, parse_args, print_table, wanted

PACKAGES = ("fflow", "lowering", "primitives", "transforms")  # fflow's source folders


def bytecode(compiled):
    """Byte-compile fflow's sources (as pip does), or remove that bytecode."""
    dirs = [os.path.join(ROOT, p) for p in PACKAGES]
    if compiled:
        subprocess.run([sys.executable, "-m", "compileall", "-q", *dirs], check=True)
        return
    for d in dirs:
        for root, sub, _ in os.walk(d):
            if "__pycache__" in sub:
                shutil.rmtree(os.path.join(root, "__pycache__"), ignore_errors=True)


def import_time(module, runs, flags=()):
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    times = []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, *flags, "-c", code],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=True,
        )
        times.append(float(out.stdout.strip().splitlines()[-1]))
    return statistics.median(times)


def main():
    args = parse_args(__doc__)
    runs = args.reps or (1 if args.tiny else 5)
    times, cold = {}, {}
    if wanted(args, "fflow"):
        bytecode(False)  # -B: the runs do not write it either
        cold["fflow"] = import_time("fflow", runs, ("-B",))
        bytecode(True)
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
    rows = [("import (fresh interpreter, bytecode compiled)", times)]
    if cold:
        rows.append(("import fflow, no bytecode (compiles its sources)", cold))
    print_table("Import time", rows)


if __name__ == "__main__":
    main()
