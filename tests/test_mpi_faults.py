"""The fault matrix on MPI ranks: one rank raising, calling os._exit / sys.exit,
killed by SIGKILL, finishing early, running another program or another shape, or
hanging. Every case must end the whole job within 30 s with a non-zero exit code
and a message naming the failing rank (shown once)."""

import os
import subprocess
import sys
import time

import pytest
from mpi_util import mpi_available

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "mpi_faults_script.py")

pytest.importorskip("mpi4py")


pytestmark = pytest.mark.skipif(not mpi_available(), reason="no mpiexec (pip install mpich)")

# mode -> text the job's output must contain (the failing rank is rank n-1)
CASES = {
    "raise": "rank {bad} failed on purpose",
    "exit": "rank {bad} exited with code 3",
    "kill": "rank {bad} was killed by SIGKILL",
    "sysexit": "rank {bad} called sys.exit(5)",
    "early": "rank {bad} finished its script",
    "program": "ranks ran different programs",
    "shape": "ranks ran different programs",
    "debug_program": "ranks ran different programs",
    "hang": "rank {bad}: no answer",
}


def launch(n, mode, extra_env=None):
    env = {k: v for k, v in os.environ.items() if k != "FFLOW_RUNTIME"}
    env["FFLOW_COLLECTIVE_TIMEOUT"] = "4"
    if mode == "debug_program":
        env["FFLOW_DEBUG_COLLECTIVES"] = "1"
    cmd = [sys.executable, "-m", "fflow.launch", "-n", str(n), SCRIPT, mode, str(n - 1)]
    start = time.monotonic()
    proc = subprocess.run(
        ["timeout", "60", *cmd], capture_output=True, text=True, cwd=ROOT, env=env
    )
    return proc, time.monotonic() - start


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("mode", list(CASES))
def test_fault_ends_the_job_naming_the_rank(mode, n):
    proc, took = launch(n, mode)
    out = proc.stdout + proc.stderr
    assert proc.returncode not in (0, 124), out[-3000:]
    assert took < 30, took
    want = CASES[mode].format(bad=n - 1)
    assert want in out, out[-3000:]
    if mode in ("program", "shape", "debug_program"):
        assert f"rank {n - 1} runs" in out, out[-3000:]
        assert out.count("Traceback") == 1, out[-3000:]  # one report, not one per rank
    if mode == "raise":
        assert out.count("failed on purpose") == 2, out  # the message and its traceback line
