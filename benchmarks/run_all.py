"""Run every benchmark script and collect their tables (optionally into a Markdown file).

python benchmarks/run_all.py                 # full sizes
python benchmarks/run_all.py --tiny          # tiny sizes (what the tests run)
python benchmarks/run_all.py --markdown docs/benchmarks.md
"""

import argparse
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = [
    "bench_dispatch.py",
    "bench_mlp.py",
    "bench_elementwise.py",
    "bench_transformer.py",
    "bench_import.py",
]


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--markdown", default=None, help="write the tables to this file")
    parser.add_argument("--only", default=None, help="frameworks subset, passed through")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="limit every framework to N threads (BLAS, OpenMP, torch, XLA/Eigen)",
    )
    args = parser.parse_args()
    env = dict(os.environ)
    if args.threads:
        n = str(args.threads)
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = n
        env["XLA_FLAGS"] = (
            env.get("XLA_FLAGS", "")
            + (" --xla_cpu_multi_thread_eigen=false" if args.threads == 1 else "")
            + f" intra_op_parallelism_threads={n}"
        ).strip()
    outputs = []
    for script in SCRIPTS:
        cmd = [sys.executable, os.path.join(HERE, script)]
        if args.tiny:
            cmd.append("--tiny")
        if args.only:
            cmd += ["--only", args.only]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE, env=env)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr)
            raise SystemExit(f"{script} failed")
        print(proc.stdout, flush=True)
        outputs.append(proc.stdout.strip())
    if args.markdown:
        load = os.getloadavg() if hasattr(os, "getloadavg") else None
        header = (
            "# Benchmarks\n\n"
            f"Measured by `python benchmarks/run_all.py` on {time.strftime('%Y-%m-%d %H:%M')} "
            f"UTC, {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
            f"Python {platform.python_version()}"
            + (f", load average {load[0]:.1f} while measuring" if load else "")
            + (f", every framework limited to {args.threads} thread(s)" if args.threads else "")
            + ". Medians after warm-up; ratios are fflow time / other time "
            "(below 1 means fflow is faster).\n\n"
        )
        with open(args.markdown, "w") as f:
            f.write(header + "\n\n".join(outputs) + "\n")


if __name__ == "__main__":
    main()
