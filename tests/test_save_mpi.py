"""fflow.save of global arrays on 4 MPI ranks (each rank writes its shards), restored
resharded under MPI and on simulated devices; and the reverse direction."""

import os
import subprocess
import sys

import pytest
from mpi_util import mpi_available

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "save_mpi_script.py")


def _run(args, n=None):
    env = {k: v for k, v in os.environ.items() if k != "FFLOW_RUNTIME"}
    cmd = [sys.executable] + (["-m", "fflow.launch", "-n", str(n)] if n else []) + [SCRIPT, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "RESULT ok" in proc.stdout


@pytest.mark.skipif(not mpi_available(), reason="no mpi4py/mpiexec")
def test_save_on_4_ranks_load_simulated_and_back(tmp_path):
    _run(["save", str(tmp_path / "a")], n=4)
    files = os.listdir(tmp_path / "a")
    assert len([f for f in files if f.endswith(".npy")]) == 4 + 2  # S(0) x4, (S(1), B) x2
    _run(["load", str(tmp_path / "a")])
    _run(["load", str(tmp_path / "a")], n=4)
    _run(["save", str(tmp_path / "b")])  # simulated devices write the same format
    _run(["load", str(tmp_path / "b")], n=4)
