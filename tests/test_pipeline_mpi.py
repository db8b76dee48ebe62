"""Pipelines, moves between placements and sharded programs over two placements on 4
MPI ranks (`python -m fflow.launch -n 4`) give the simulated runtime's numbers bit for bit, with the same bytes moved, and the
un-pipelined model's numbers. One launch runs every case (launches are slow)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from mpi_util import mpi_available

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "pipeline_mpi_script.py")

pytest.importorskip("mpi4py")


def run(n=None, timeout=240, script=SCRIPT, devices=4):
    env = {k: v for k, v in os.environ.items() if k != "FFLOW_RUNTIME"}
    env["FFLOW_NUM_CPU_DEVICES"] = str(devices)
    cmd = [sys.executable] + (["-m", "fflow.launch", "-n", str(n)] if n else []) + [script]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def plain_two_steps(n_stages):
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    try:
        import pipeline_mpi_script as script
    finally:
        sys.path.pop(0)
    import fflow

    rng = np.random.default_rng(1)
    bx = rng.normal(size=(8, 3)).astype(np.float32)
    by = rng.normal(size=(8, 1)).astype(np.float32)

    def loss(params, batch):
        xy = batch
        for p in params[:-1]:
            xy = script.stage(p, xy)
        return script.last(params[-1], xy)

    params = script.make(n_stages)
    for _ in range(2):
        value, grads = fflow.value_and_grad(loss)(params, (bx, by))
        params = fflow.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)
    return float(value), [np.asarray(p["w"]) for p in params]


@pytest.mark.skipif(not mpi_available(), reason="no mpiexec (pip install mpich)")
def test_mpi_equals_simulated_and_plain():
    mpi = run(n=4)
    sim = run()
    assert mpi.pop("runtime") == "4 MPI ranks"
    assert sim.pop("runtime") == "4 simulated CPU devices"
    assert mpi.keys() == sim.keys()
    mpi_tr, sim_tr = mpi.pop("traces"), sim.pop("traces")
    for key in sim:
        assert mpi[key] == sim[key], key  # bit for bit, bytes included
    # each rank ran its own stages' operations only (simulated: one process ran all)
    for name, n in [("1f1b", 4), ("interleaved", 8)]:
        want = [sorted(f"{k}{s}" for s in range(n) for k in "FB" if s % 4 == d) for d in range(4)]
        assert [ops for _, ops in mpi_tr[f"{name}_lanes"]] == want
        assert [ops for _, ops in sim_tr[f"{name}_lanes"]] == want
        assert mpi_tr[f"{name}_ops_here"] == want[0]
        assert sim_tr[f"{name}_ops_here"] == sorted(x for w in want for x in w)
    for name in ("1f1b", "gpipe", "interleaved", "dp_pp"):
        assert sim_tr[f"{name}_wall"] is None
        assert mpi_tr[f"{name}_wall"] == [4, True, True, 4]
    dp = [ops for _, ops in mpi_tr["dp_pp_lanes"]]
    assert dp == [["B0", "F0"], ["B0", "F0"], ["B1", "F1"], ["B1", "F1"]]
    # the executed schedule's ticks (from every rank's trace): the textbook bubble
    p = 4
    for name, m, v in [("1f1b", 4, 1), ("gpipe", 2, 1), ("interleaved", 4, 2)]:
        assert mpi_tr[f"{name}_ticks"] == sim_tr[f"{name}_ticks"]
        span, *idle = sim_tr[f"{name}_ticks"]
        assert span == 2 * (v * m + p - 1)
        np.testing.assert_allclose(idle, [(p - 1) / (v * m + p - 1)] * p)
    # 2 stages of 2 ranks each, m=2: (p-1)/(m+p-1) = 1/3 on every rank (MPI) or device
    assert mpi_tr["dp_pp_ticks"][0] == sim_tr["dp_pp_ticks"][0] == 6
    np.testing.assert_allclose(mpi_tr["dp_pp_ticks"][1:], [1 / 3] * 4)
    x = np.arange(30.0, dtype=np.float32).reshape(5, 6) / 7
    for key in sim:
        if key.startswith("move_"):
            np.testing.assert_allclose(np.asarray(sim[key]), x, rtol=1e-6, atol=1e-6)
    for name, n in [("1f1b", 4), ("gpipe", 4), ("interleaved", 8), ("dp_pp", 2)]:
        loss, ws = plain_two_steps(n)
        np.testing.assert_allclose(sim[f"{name}_loss"], loss, rtol=1e-5, atol=1e-6)
        for s, w in enumerate(ws):
            np.testing.assert_allclose(np.asarray(sim[f"{name}_w{s}"]), w, rtol=1e-4, atol=1e-5)
    assert sim["bytes"] > 0
    # int labels carried along, m=5, gradients of the parameters and the input
    import fflow

    script = _script()
    labels, xs = script.int_label_data()

    def plain_ce(params, x):
        xy = (x, labels)
        for p in params[:-1]:
            xy = script.stage(p, xy)
        return script.last_ce(params[-1], xy)

    value, (gw, gx) = fflow.value_and_grad(plain_ce, argnums=(0, 1))(script.make(4, d_last=8), xs)
    np.testing.assert_allclose(sim["int_labels_loss"], float(value), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(sim["int_labels_gx"]), gx, rtol=1e-4, atol=1e-6)
    for s in range(4):
        got = np.asarray(sim[f"int_labels_gw{s}"])
        np.testing.assert_allclose(got, gw[s]["w"], rtol=1e-4, atol=1e-6)
    assert len([k for k in sim if k.startswith("mixed_")]) == 4 * (len(script_pairs()) + 2)


def _script():
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    try:
        import pipeline_mpi_script as script
    finally:
        sys.path.pop(0)
    return script


def script_pairs():
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    try:
        import pipeline_mpi_script as script
    finally:
        sys.path.pop(0)
    return script.MIXED_PAIRS


@pytest.mark.skipif(not mpi_available(), reason="no mpiexec (pip install mpich)")
def test_example_runs_under_the_launcher():
    env = {k: v for k, v in os.environ.items() if k != "FFLOW_RUNTIME"}
    example = os.path.join(ROOT, "examples", "pipeline_parallel.py")
    cmd = [sys.executable, "-m", "fflow.launch", "-n", "4", example, "--tiny"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "4 MPI ranks" in proc.stdout
    assert "bubble fraction 0.429 (theory (p-1)/(m+p-1) = 0.429)" in proc.stdout
    assert "equals the un-pipelined model" in proc.stdout


@pytest.mark.skipif(not mpi_available(), reason="no mpiexec (pip install mpich)")
def test_3d_parallel_step_on_8_ranks_equals_simulated_and_single_device():
    script = os.path.join(ROOT, "tests", "pipeline_3d_mpi_script.py")
    mpi = run(n=8, script=script, devices=8)
    sim = run(script=script, devices=8)
    assert mpi.pop("runtime") == "8 MPI ranks"
    assert sim.pop("runtime") == "8 simulated CPU devices"
    assert mpi == sim  # bit for bit
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    try:
        import test_pipeline_3d as t3
    finally:
        sys.path.pop(0)
    import fflow

    rng = np.random.default_rng(5)
    batch = (rng.normal(size=(8, 8)).astype(np.float32), rng.normal(size=(8, 1)).astype(np.float32))
    want_loss, want = fflow.value_and_grad(t3.plain)(t3.params(), batch)
    np.testing.assert_allclose(sim["loss"], float(want_loss), rtol=1e-5)
    for s in range(2):
        for k, w in want[s].items():
            got = np.asarray(sim[f"grad{s}_{k}"])
            np.testing.assert_allclose(got, np.asarray(w), rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not mpi_available(), reason="no mpiexec (pip install mpich)")
@pytest.mark.parametrize("n", [2, 4])
def test_global_input_on_another_placement_moves_on_ranks(n):
    script = os.path.join(ROOT, "tests", "pipeline_move_mpi_script.py")
    mpi = run(n=n, script=script, devices=n)
    sim = run(script=script, devices=n)
    assert mpi.pop("runtime") == f"{n} MPI ranks"
    assert sim.pop("runtime") == f"{n} simulated CPU devices"
    assert mpi == sim  # bit for bit, bytes included
    rng = np.random.default_rng(7)
    x = rng.normal(size=(4, 4)).astype(np.float32)
    w = rng.normal(size=(4, 2)).astype(np.float32)
    t = np.tanh(x @ w)
    for name in ("S0", "S1", "B", "P"):
        assert sim[f"plan_bytes_{name}"] > 0 and sim[f"gw_on_b_{name}"]
        np.testing.assert_allclose(sim[f"value_{name}"], (t**2).sum(), rtol=1e-5)
        d = 2 * t * (1 - t**2)
        np.testing.assert_allclose(np.asarray(sim[f"gw_{name}"]), x.T @ d, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(np.asarray(sim[f"gx_{name}"]), d @ w.T, rtol=1e-4, atol=1e-5)
