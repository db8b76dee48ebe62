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


def test_run_all_takes_the_median_over_rounds():
    # each framework in its own process per round; a cell is the median over the
    # rounds (a round that failed to report one is left out), fflow/JAX the ratio of
    # the medians, and the notes list fflow/JAX round by round
    sys.path.insert(0, BENCH)
    try:
        _check_merge_rounds()
    finally:
        sys.path.remove(BENCH)


def _check_merge_rounds():
    import run_all

    times = {
        "step": {"fflow": [1e-3, 5e-3, 2e-3], "jax.jit": [2e-3, 1e-3, None]},
        "first call": {"fflow": [0.1, 0.3, 0.2]},
    }
    rows, per_round = run_all.merge_rounds(times)
    assert rows["step"]["fflow"] == "2.000 ms" and rows["step"]["jax.jit"] == "1.500 ms"
    assert rows["step"]["fflow/jax"] == "1.33×"
    assert rows["first call"] == {"fflow": "200.000 ms", "fflow/jax": "n/a"}
    assert per_round == {"step": "0.50×, 5.00×"}
    assert run_all.frameworks("jax,fflow") == ["fflow", "jax.jit"]
    table = run_all.plain_table("MLP", rows)
    assert "| step | 2.000 ms | 1.500 ms | n/a | n/a | 1.33× | n/a | n/a |" in table
