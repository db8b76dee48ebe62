"""examples/gpt_chars.py at its tiny size: a run interrupted on 4 MPI ranks and resumed
from its checkpoint on simulated devices ends with the numbers of an uninterrupted
run (same loss curve), and the model beats nothing it should not: it reports both
its validation bits/char and the bigram baseline."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "examples", "gpt_chars.py")


def _run(args, n=None):
    env = {k: v for k, v in os.environ.items() if k != "FFLOW_RUNTIME"}
    cmd = [sys.executable] + (["-m", "fflow.launch", "-n", str(n)] if n else []) + [SCRIPT, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    m = re.search(r"validation: GPT ([\d.]+) bits/char vs bigram ([\d.]+)", proc.stdout)
    assert m, proc.stdout[-2000:]
    return float(m.group(1)), float(m.group(2)), proc.stdout


def _mpi_ok():
    try:
        import mpi4py  # noqa: F401

        from fflow.launch import find_mpiexec

        find_mpiexec()
    except (ImportError, SystemExit):
        return False
    return True


def test_interrupted_run_resumed_equals_uninterrupted(tmp_path):
    full, bigram, out = _run(["--tiny", "--png", str(tmp_path / "a.png")])
    assert "sample:" in out and (tmp_path / "a.png").exists()
    ckpt = str(tmp_path / "ckpt")
    if _mpi_ok():
        _, _, out = _run(["--tiny", "--stop-after", "4", "--ckpt-dir", ckpt], n=4)
        assert "MPI ranks" in out
    else:
        pytest.skip("no MPI: the interrupted half needs fflow.launch")
    assert sorted(os.listdir(ckpt)) == ["step_00000003"]
    resumed, bigram2, out = _run(["--tiny", "--resume", "--ckpt-dir", ckpt])
    assert "resumed from step 3" in out
    assert bigram2 == bigram
    assert resumed == full  # printed to 3 decimals: the same numbers
