"""Planned deterministic all-reduces through the shared-memory window (fflow/mpi_shm.py)
and through MPI's messages, at 2 and 4 ranks under `python -m fflow.launch`: every path
(rows, two-step, tuned), float32 sum/max/min and float64 sums, uneven and tiny sizes,
results kept across calls, and a slow member; the bits equal the simulated runtime's and
the values equal NumPy's reduction of the per-device values."""

import itertools
import os

import numpy as np
import pytest
from mpi_util import mpi_available
from test_shard_mpi import ROOT, result_of, run

pytest.importorskip("mpi4py")
pytestmark = pytest.mark.skipif(not mpi_available(), reason="no mpiexec (pip install mpich)")

SCRIPT = os.path.join(ROOT, "tests", "mpi_shm_script.py")


@pytest.mark.parametrize("n", [2, 4])
def test_shared_memory_all_reduce_equals_simulated_and_numpy(n):
    import mpi_shm_script as s

    mpi = result_of(run([SCRIPT, str(n)], n=n, timeout=240))
    sim = result_of(run([SCRIPT, str(n)], timeout=240))
    case = 0
    for shm, (limit, tune) in itertools.product((True, False), s.LIMITS):
        for (dt, src), shape in [(k, sh) for k in s.KINDS for sh in s.SHAPES]:
            case += 1
            key = f"{shm}_{limit}_{tune}_{dt}_{src}_{shape}"
            assert mpi[key] == sim[key], key  # bit for bit (json floats are exact)
            for c, got in enumerate(mpi[key]):
                rows = np.stack(s.parts([case, c], shape, np.dtype(dt).type, n, src))
                name = str(src)
                ref = rows.max(0) if "max" in name else rows.min(0) if "min" in name else None
                if ref is None:
                    np.testing.assert_allclose(got, rows.sum(0), rtol=1e-6, err_msg=key)
                else:
                    assert got == ref.tolist(), key
    # the slow member: every call's numbers are the simulated runtime's and NumPy's
    for key in ("slow", "slow_rs", "slow_ag"):
        assert mpi[key] == sim[key], key
    for c, (got, got_rs, got_ag) in enumerate(zip(mpi["slow"], mpi["slow_rs"], mpi["slow_ag"])):
        rows = np.stack(s.parts([999, c], (48, 40), np.float32, n, s.P))
        np.testing.assert_allclose(got, rows.sum(0), rtol=1e-6)
        np.testing.assert_allclose(got_rs, rows.sum(0), rtol=1e-6)  # the logical value
        assert got_ag == s.parts([997, c], (40 * n, 40), np.float32, 1, s.B)[0].tolist()
    assert mpi["slow_class"] == 1
    assert mpi["windows"] == mpi["windows_after"] == [4096, 8192]
    # one member without /dev/shm room for a size class: all agree on MPI's messages
    ref = np.stack(s.parts([996], (5000,), np.float32, n, s.partial_min)).min(0).tolist()
    assert mpi["room"] == sim["room"] == [ref, ref]
    assert mpi["refused"] == [32768]
    # gradient buckets in flight together (window lanes): NumPy's gradient, every step
    rw = np.random.default_rng(31)
    ws = [rw.normal(size=(32, 60 + c)).astype(np.float32) for c in range(4)]
    xb = rw.normal(size=(512 * n, 32)).astype(np.float32)
    assert mpi["buckets"] == sim["buckets"]
    for step in mpi["buckets"]:
        for got, w in zip(step, ws):
            x64 = xb.astype(np.float64)
            ref = x64.T @ (1 - np.tanh(x64 @ w) ** 2)  # d/dw sum(tanh(x @ w))
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    # over the window budget: MPI's messages, the same numbers
    ref = np.stack(s.parts([998], (3000,), np.float32, n, s.partial_max)).max(0).tolist()
    assert mpi["budget"] == sim["budget"] == [ref, ref]
