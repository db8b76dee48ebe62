"""fflow.data.DataLoader: shuffling, remainders, per-device shards, prefetch, resume."""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import fflow
from fflow.data import DataLoader
from fflow.sharding import B, S

KEY = fflow.random.PRNGKey(3)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _data(n=10):
    return {
        "x": np.arange(n * 2, dtype=np.float32).reshape(n, 2),
        "y": np.arange(n, dtype=np.int32),
    }


def test_each_epoch_is_a_permutation_and_epochs_differ():
    loader = DataLoader(_data(12), 4, key=KEY, prefetch=0)
    epochs = [np.concatenate([np.asarray(b["y"]) for b in loader]) for _ in range(3)]
    for e in epochs:
        assert sorted(e.tolist()) == list(range(12))
    assert not np.array_equal(epochs[0], epochs[1])
    again = DataLoader(_data(12), 4, key=KEY)
    assert np.array_equal(np.concatenate([np.asarray(b["y"]) for b in again]), epochs[0])
    for b in DataLoader(_data(12), 4, key=KEY):  # rows stay together
        np.testing.assert_array_equal(np.asarray(b["x"])[:, 0], 2 * np.asarray(b["y"]))


def test_remainders():
    assert [b["y"].shape[0] for b in DataLoader(_data(10), 4)] == [4, 4]
    assert [b["y"].shape[0] for b in DataLoader(_data(10), 4, remainder="keep")] == [4, 4, 2]
    out = list(DataLoader(_data(10), 4, remainder="pad"))
    assert len(out) == 3 and all(b["y"].shape == (4,) for b, _ in out)
    batch, mask = out[-1]
    assert np.asarray(mask).tolist() == [True, True, False, False]
    assert np.asarray(batch["y"]).tolist() == [8, 9, 0, 1]
    with pytest.raises(ValueError, match="leading dimension"):
        DataLoader({"a": np.zeros(3), "b": np.zeros(4)}, 2)


def test_global_batches_hold_only_each_devices_rows():
    mesh = fflow.placement("cpu", [[0, 1], [2, 3]])
    loader = DataLoader(
        _data(8), 4, shuffle=False, placement=mesh, sbp={"x": (S(0), S(1)), "y": None}
    )
    batch = next(iter(loader))
    assert batch["x"].sbp == (S(0), S(1)) and batch["y"].sbp == (S(0), B)
    shards = batch["x"].to_local_shards()
    x = _data(8)["x"][:4]
    np.testing.assert_array_equal(np.asarray(shards[0]), x[:2, :1])
    np.testing.assert_array_equal(np.asarray(shards[3]), x[2:, 1:])
    np.testing.assert_array_equal(np.asarray(batch["x"]), x)
    uneven = next(
        iter(DataLoader(_data(8), 3, shuffle=False, placement=fflow.placement("cpu", [0, 1])))
    )
    np.testing.assert_array_equal(np.asarray(uneven["y"]), [0, 1, 2])


def test_prefetch_same_batches_errors_and_early_exit():
    a = [np.asarray(b["y"]) for b in DataLoader(_data(20), 3, key=KEY, prefetch=0).steps(15)]
    b = [np.asarray(b["y"]) for b in DataLoader(_data(20), 3, key=KEY, prefetch=4).steps(15)]
    assert all(np.array_equal(x, y) for x, y in zip(a, b)) and len(a) == 15
    tail = [np.asarray(b["y"]) for b in DataLoader(_data(20), 3, key=KEY).steps(15, start=9)]
    assert all(np.array_equal(x, y) for x, y in zip(a[9:], tail)) and len(tail) == 6

    class Boom(DataLoader):
        def _batch(self, order, i):
            if i == 2:
                raise RuntimeError("bad example")
            return super()._batch(order, i)

    with pytest.raises(RuntimeError, match="bad example"):
        list(Boom(_data(20), 3, prefetch=2))
    before = threading.active_count()
    for i, _ in enumerate(DataLoader(_data(200), 2, prefetch=2)):
        if i == 1:
            break
    assert threading.active_count() <= before


@pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import mpi4py"], capture_output=True).returncode != 0,
    reason="no mpi4py",
)
def test_each_mpi_rank_builds_only_its_rows():
    script = (
        "import numpy as np, fflow, fflow.serialization\n"
        "from fflow.data import DataLoader\n"
        "from fflow.sharding import runtime\n"
        "pl = fflow.placement('cpu', [0, 1])\n"
        "x = np.arange(16, dtype=np.float32).reshape(8, 2)\n"
        "b = next(iter(DataLoader({'x': x}, 4, shuffle=False, placement=pl)))['x']\n"
        "r = runtime().rank\n"
        "assert list(b._value.shards) == [r]\n"
        "assert np.array_equal(np.asarray(fflow.sharding.to_local(b)), x[2 * r : 2 * r + 2])\n"
        "assert np.array_equal(np.asarray(b), x[:4])\n"
        "fflow.serialization.barrier()\n"
        "if r == 0:\n"  # one rank prints: the barrier says every rank passed its checks
        "    print('RESULT ok 0', flush=True)\n"
    )
    path = os.path.join(ROOT, "tests", "_data_mpi_tmp.py")
    env = {k: v for k, v in os.environ.items() if k != "FFLOW_RUNTIME"}
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(script)
        path = f.name
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "fflow.launch", "-n", "2", path],
            capture_output=True, text=True, timeout=120, cwd=ROOT, env=env,
        )  # fmt: skip
    finally:
        os.unlink(path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "RESULT ok 0" in proc.stdout
