"""benchmarks/gpu_check.py end to end through the host shim, from a bare copy of the
checkout (no install), as it must run on a GPU machine without network access."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from cuda_harness import BACKEND

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(BACKEND == "cuda", reason="the GPU check itself is running")
def test_gpu_check_runs_through_the_shim_from_a_bare_checkout(tmp_path):
    tree = tmp_path / "checkout"
    for folder in ("fflow", "primitives", "transforms", "lowering"):
        shutil.copytree(
            os.path.join(ROOT, folder), tree / folder, ignore=shutil.ignore_patterns("__pycache__")
        )
    (tree / "benchmarks").mkdir()
    shutil.copy(os.path.join(ROOT, "benchmarks", "gpu_check.py"), tree / "benchmarks")
    out = tmp_path / "check.json"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FFLOW_JIT_BACKEND")}
    proc = subprocess.run(
        [
            sys.executable,
            str(tree / "benchmarks" / "gpu_check.py"),
            "--shim",
            "--budget",
            "60",
            "--json",
            str(out),
        ],  # fmt: skip
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    # fflow and its mapped packages came from the bare copy, not an installed checkout
    assert report["fflow_root"] == str(tree / "fflow")
    names = [r["name"] for r in report["results"]]
    # the first case always runs; later ones may be skipped on a loaded machine (budget)
    assert "elementwise chain" in names and "elementwise chain grad" in names, names
    assert report["passed"] == len(report["results"]) >= 2
    for r in report["results"]:
        assert r["max_rel_err"] <= r["tol"] and r["wall_s"] > 0 and r["first_call_s"] > 0
    assert "correct" in proc.stdout and "wall ms" in proc.stdout


def test_plan_model_lists_every_program():
    # benchmarks/cuda_plan_model.py: static plans at full size (no GPU, a few seconds)
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "cuda_plan_model.py")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if "modelled HBM" in ln]
    assert len(lines) == 11, proc.stdout  # incl. hand-written attention, amp MLP
    softmax = lines[0].split()
    assert softmax[softmax.index("kernels") + 1] == "1"  # one row kernel
    epi = [ln.split() for ln in lines if ln.startswith("GEMM+bias+gelu")][0]
    assert epi[epi.index("kernels") + 1] == "0" and epi[epi.index("cuBLASLt") - 1] == "1"
