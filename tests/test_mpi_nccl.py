"""The NCCL runtime's whole code path in CI: MPI ranks, CuPy and cupy.cuda.nccl
replaced by stand-ins (NCCL's call signatures over MPI on host buffers); numbers
equal the simulated runtime's, and every NCCL call kind ran."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from mpi_util import mpi_available

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "nccl_script.py")

pytest.importorskip("mpi4py")


pytestmark = pytest.mark.skipif(not mpi_available(), reason="no mpiexec (pip install mpich)")


def _run(n, nccl):
    env = {k: v for k, v in os.environ.items() if k != "FFLOW_RUNTIME"}
    cmd = [sys.executable, SCRIPT, str(n)]
    if nccl:
        env["FFLOW_RUNTIME"] = "nccl"
        cmd = [sys.executable, "-m", "fflow.launch", "-n", str(n), SCRIPT, str(n)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


@pytest.mark.parametrize("n", [2, 4])
def test_nccl_runtime_through_the_stand_in_equals_simulated(n):
    got, want = _run(n, nccl=True), _run(n, nccl=False)
    assert "NCCL" in got.pop("runtime")
    calls = got.pop("calls")
    assert got.pop("p2p_calls") > 0  # moves between placements and the pipeline used NCCL
    # both gradients (5x3 and 3x2) in one bucket: one ncclAllReduce of 21 elements
    assert got.pop("last_all_reduce_count") == 21
    assert {"allReduce", "allGather", "reduceScatter", "send", "recv"} <= set(calls), calls
    assert got.keys() == want.keys()
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5 if "f16" not in key else 1e-2)
