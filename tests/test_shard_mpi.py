"""The MPI runtime (mpi4py + MPICH from pip, via `python -m fflow.launch`): 2 and 4
ranks give the simulated runtime's numbers and byte counts; a rank that raises ends
the run with its own error instead of a hang; both examples run under the launcher."""

import itertools
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from mpi_util import mpi_available

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "shard_mpi_script.py")

pytest.importorskip("mpi4py")


pytestmark = pytest.mark.skipif(not mpi_available(), reason="no mpiexec (pip install mpich)")


def run(args, n=None, timeout=120):
    env = {k: v for k, v in os.environ.items() if k != "FFLOW_RUNTIME"}
    cmd = [sys.executable] + (["-m", "fflow.launch", "-n", str(n)] if n else []) + args
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def result_of(proc):
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


@pytest.mark.parametrize("n", [2, 4])
def test_mpi_equals_simulated(n):
    """Every boxing pair (1-D; 2x2 mesh at 4 ranks), 16-bit and integer dtypes, DP and
    TP training steps, make_global_array: MPI (deterministic mode, the default) gives
    the simulated runtime's numbers bit for bit, and moves the same bytes."""
    mpi = result_of(run([SCRIPT, str(n)], n=n, timeout=240))
    sim = result_of(run([SCRIPT, str(n)], timeout=240))
    assert mpi.keys() == sim.keys()
    for key in sim:
        if key.startswith("native_") or key in ("mismatch", "cores"):
            continue
        assert mpi[key] == sim[key], key  # bit for bit: both reduce in group order
    for key in [k for k in sim if k.startswith("native_")]:
        # MPI's own reductions: equal at 2 ranks (a + b == b + a), close beyond
        np.testing.assert_allclose(mpi[key], sim[key], rtol=2e-2 if "bf16" in key else 1e-5)
    assert sim["bytes"] > 0
    # the ranks of one node split its cores (one GEMM thread each when 2 share 2 cores)
    assert mpi["cores"] == max(1, sim["cores"] // n)
    for res in (mpi, sim):
        assert f"rank {n - 1} passed a shard of shape (3, 3) float32" in res["mismatch"]
    # an independent reference: NumPy on the logical values
    x = np.asarray(sim["make_global"], np.float32)
    np.testing.assert_allclose(sim["make_global_sum"], x.sum(0), rtol=1e-6)
    x3 = np.arange(5 * 7 * 6, dtype=np.float32).reshape(5, 7, 6)
    for key in [k for k in sim if k.startswith(("a2a3d_", "ag3d_"))]:
        assert mpi[key] == sim[key] == x3.tolist(), key  # boxing keeps the logical value
    if n == 4:  # nested splits on the 2x2 mesh: NumPy values, one collective's bytes
        x8 = np.asarray(sim["nested_x"], np.float32)
        t = x8.nbytes
        # (S(0), P) shards: x * (k + 1) / 5 + k / 4 on the P position k of mesh axis 1
        sums = {"P": sum(x8 * np.float32((k + 1) / 5) + np.float32(k * 0.25) for k in range(2))}
        cases = [("(S(0), P)", "P", t), ("(S(0), S(0))", "", t), ("(S(0), B)", "", 0)]
        for src, kind, nbytes in cases + [("(S(0), S(1))", "", t // 2)]:
            dst = "(S(0), B)" if src == "(S(0), S(0))" else "(S(0), S(0))"
            key = f"nested_{src}_{dst}"
            np.testing.assert_allclose(mpi[key], sums.get(kind, x8), rtol=1e-6, atol=1e-6)
            assert mpi["nested_bytes_" + key[7:]] == sim["nested_bytes_" + key[7:]] == nbytes
    # independent reference for the large all-reduces: NumPy over the per-device values
    rl = np.random.default_rng(11)  # the script's draws, in its order
    for shape in [(160, 64), (161, 63)]:
        xl = rl.normal(size=shape).astype(np.float32)
        scales = [np.float32((k + 1) / (n + 1)) for k in range(n)]
        parts = np.stack([xl * s + np.float32(k * 0.25) for k, s in enumerate(scales)])
        c = shape[1]
        np.testing.assert_allclose(mpi[f"large_{c}_P"], parts.sum(0), rtol=1e-5, atol=1e-5)
        assert mpi[f"large_{c}_P(max)"] == parts.max(0).tolist()
        assert mpi[f"large_{c}_P(min)"] == parts.min(0).tolist()
        ints = (xl * 100).astype(np.int32)
        assert mpi[f"large_{c}_int"] == sum(ints + k for k in range(n)).tolist()
    for det in (True, False):  # the large path in pieces (not multiples of piece or p)
        for shape in [(160, 64), (161, 63), (7, 1023)]:
            xl = rl.normal(size=shape).astype(np.float32)
            parts = np.stack([xl * s + np.float32(k * 0.25) for k, s in enumerate(scales)])
            key = f"pieces_{det}_{shape}_"
            np.testing.assert_allclose(mpi[key + "P"], parts.sum(0), rtol=1e-5, atol=1e-5)
            assert mpi[key + "P(max)"] == parts.max(0).tolist()
            ints = (xl * 100).astype(np.int32)
            assert mpi[key + "int"] == sum(ints + k for k in range(n)).tolist()
    # planned all-reduces of cache hits: NumPy over the per-device values (same draws)
    rp = np.random.default_rng(13)
    cases = [(np.float32, "P"), (np.float32, "P(max)"), (np.int32, "P"), (np.float64, "P")]
    for label in ("rows", "twostep", "mpi"):
        for (dt, src), shape, k in itertools.product(cases, [(9, 7), (8, 8)], range(3)):
            xk = (rp.normal(size=shape) * 50).astype(dt)
            if dt == np.int32:
                parts = np.stack([xk + j for j in range(n)])
            else:
                parts = np.stack(
                    [xk * dt((j + 1) / (n + 1)) + dt(j * 0.25) for j in range(n)]
                ).astype(dt)
            ref = parts.max(0) if src == "P(max)" else parts.sum(0, dtype=dt)
            key = f"planned_{label}_{np.dtype(dt).name}_{src}_{shape}_{k}"
            key = "native_" + key if label == "mpi" else key
            np.testing.assert_allclose(mpi[key], ref, rtol=1e-6, err_msg=key)
            if dt == np.int32 or src == "P(max)":
                assert mpi[key] == ref.tolist(), key
    # one program across mode changes (the draw after the planned_* ones)
    xm = rp.normal(size=(8, 8)).astype(np.float32)
    ref = np.stack([xm * np.float32((j + 1) / (n + 1)) + np.float32(j * 0.25) for j in range(n)])
    for key in ("native_switch_0", "switch_1", "switch_2", "switch_3"):
        np.testing.assert_allclose(mpi[key], ref.sum(0), rtol=1e-6, err_msg=key)
    assert mpi["switch_1"] == mpi["switch_2"] == mpi["switch_3"] == sim["switch_1"]
    # the last-hit memo: another shape or dtype under the same sharding object runs its
    # own program (NumPy's sums of the per-device values; MPI == simulated)
    rm = np.random.default_rng(23)
    xs = [rm.normal(size=s).astype(d) for s, d in [((6, 4), "f4"), ((8, 4), "f4"), ((6, 4), "f8")]]
    for k, x in enumerate([xs[0]] * 3 + xs[1:] + [xs[0]]):
        dt = x.dtype.type
        ref = sum(x * dt((j + 1) / (n + 1)) + dt(j * 0.25) for j in range(n))
        for res, key in itertools.product((mpi, sim), (f"memo_{k}", f"memo2_{k}")):
            assert res[key + "_type"] == f"{x.dtype} {x.shape}", key
            np.testing.assert_allclose(res[key], ref, rtol=1e-6, err_msg=key)
    # the default all-gather limit's edge (both paths, tuned): one result for all ten
    # calls, the simulated runtime's bytes, NumPy's reduction of the values
    for src, d in itertools.product(("P", "P(max)"), (0, n)):
        assert len(mpi[f"edge_{src}_{d}"].split()) == 1, (src, d)
        err = mpi[f"edge_err_{src}_{d}"]
        assert err == 0 if src == "P(max)" else err < 1e-5, (src, d, err)
    for res in (mpi, sim):  # reused result buffers: kept results are not overwritten
        assert res["reuse_0"] == res["reuse_1"] == res["reuse_2"] != res["reuse_last"]
    for res in (mpi, sim):  # buckets change no number
        for w in ("w1", "w2"):
            assert res[f"bucket_off_{w}"] == res[f"bucket_tiny_{w}"] == res[f"bucket_default_{w}"]
            assert res[f"bucket_nooverlap_{w}"] == res[f"bucket_default_{w}"]
        assert res["bucket_big_off"] == res["bucket_big_default"]
        assert res["bucket_big_v_off"] == res["bucket_big_v_default"]
    # independent reference for the big bucket: NumPy's gradient of sum(tanh(x @ w) * v)
    rb = np.random.default_rng(7)  # the script's draws, in its order
    wbig, xbig, vbig = (rb.normal(size=s) for s in [(64, 300), (2 * n, 64), (300,)])
    t = np.tanh(xbig @ wbig)
    ref = xbig.T @ ((1 - t**2) * vbig)
    np.testing.assert_allclose(sim["bucket_big_default"], ref, rtol=1e-4, atol=1e-4)
    losses = [sim[f"dp_step{k}_loss"] for k in range(3)]
    assert losses[2] < losses[0]


def test_failing_rank_ends_the_run_with_its_error():
    start = time.perf_counter()
    proc = run([SCRIPT, "2", "1"], n=2, timeout=60)
    assert proc.returncode != 0
    assert "rank 1 failed on purpose" in proc.stderr + proc.stdout
    assert time.perf_counter() - start < 30


@pytest.mark.parametrize("n", [2, 4])
def test_examples_run_under_the_launcher(n, tmp_path):
    """Both examples (per-rank data) at 2 and 4 ranks; at 2 ranks through a hostfile
    naming localhost twice (one rank per host entry: --ppn 1)."""
    extra = []
    if n == 2:
        hosts = tmp_path / "hosts"
        hosts.write_text("localhost\nlocalhost\n")
        extra = ["--hostfile", str(hosts), "--ppn", "1"]
    dp = run([*extra, os.path.join(ROOT, "examples", "data_parallel.py"), "--tiny"], n=n)
    assert dp.returncode == 0, dp.stderr[-3000:]
    assert f"{n} MPI ranks" in dp.stdout
    assert "largest loss difference vs single device" in dp.stdout
    tp = run([os.path.join(ROOT, "examples", "tensor_parallel.py"), "--tiny"], n=n)
    assert tp.returncode == 0, tp.stderr[-3000:]
    assert ("2x2 mesh" in tp.stdout) == (n == 4)
    assert "measured" in tp.stdout


def test_launcher_inside_a_slurm_task_runs_this_process_as_the_rank(tmp_path):
    script = tmp_path / "who.py"
    script.write_text("import fflow\nprint('rank', fflow.process_index(), fflow.process_count())\n")
    env = {k: v for k, v in os.environ.items() if k != "FFLOW_RUNTIME"}
    env.update(SLURM_PROCID="0", SLURM_NTASKS="1", SLURM_STEP_ID="0")
    cmd = [sys.executable, "-m", "fflow.launch", str(script)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "rank 0 1" in proc.stdout
    env.update(SLURM_PROCID="2", SLURM_NTASKS="4")  # srun without PMI: a clear error
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode != 0
    assert "the environment says rank 2 of 4" in proc.stderr
