"""The MPI runtime (mpi4py + MPICH from pip, via `python -m fflow.launch`): 2 and 4
ranks give the simulated runtime's numbers and byte counts; a rank that raises ends
the run with its own error instead of a hang; both examples run under the launcher."""

import json
import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "shard_mpi_script.py")

pytest.importorskip("mpi4py")


def _mpiexec_ok():
    from fflow.launch import find_mpiexec

    try:
        find_mpiexec()
    except SystemExit:
        return False
    return True


pytestmark = pytest.mark.skipif(not _mpiexec_ok(), reason="no mpiexec (pip install mpich)")


def run(args, n=None, timeout=60):
    env = {k: v for k, v in os.environ.items() if k != "FFLOW_RUNTIME"}
    cmd = [sys.executable] + (["-m", "fflow.launch", "-n", str(n)] if n else []) + args
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def result_of(proc):
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


@pytest.mark.parametrize("n", [2, 4])
def test_mpi_equals_simulated(n):
    mpi = result_of(run([SCRIPT, str(n)], n=n))
    sim = result_of(run([SCRIPT, str(n)]))
    assert mpi.keys() == sim.keys()
    for key in sim:
        assert mpi[key] == sim[key], key  # bit for bit: both reduce in group order
    assert sim["bytes"] > 0


def test_failing_rank_ends_the_run_with_its_error():
    start = time.perf_counter()
    proc = run([SCRIPT, "2", "1"], n=2, timeout=60)
    assert proc.returncode != 0
    assert "rank 1 failed on purpose" in proc.stderr + proc.stdout
    assert time.perf_counter() - start < 30


def test_examples_run_under_the_launcher():
    dp = run([os.path.join(ROOT, "examples", "data_parallel.py"), "--tiny"], n=2)
    assert dp.returncode == 0, dp.stderr[-3000:]
    assert "2 MPI ranks" in dp.stdout
    tp = run([os.path.join(ROOT, "examples", "tensor_parallel.py"), "--tiny"], n=4)
    assert tp.returncode == 0, tp.stderr[-3000:]
    assert "2x2 mesh" in tp.stdout
