"""Every benchmark script runs at a tiny size (so they never rot). No timing asserted."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks")
SCRIPTS = sorted(f for f in os.listdir(BENCH) if f.startswith("bench_") and f.endswith(".py"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_runs_tiny(script):
    # fflow and hand-written NumPy only: JAX/torch imports would dominate test time
    proc = subprocess.run(
        [sys.executable, os.path.join(BENCH, script), "--tiny", "--only", "fflow,numpy"],
        capture_output=True,
        text=True,
        cwd=BENCH,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "| workload |" in proc.stdout
