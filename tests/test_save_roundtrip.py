"""fflow.save / fflow.load: every dtype, tree structures, global arrays resharded across
2- and 4-device placements, pickling/copying global arrays, CheckpointManager resume."""

import copy
import json
import os
import pickle
from typing import NamedTuple

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp
from fflow import nn, optim
from fflow.serialization import CheckpointManager
from fflow.sharding import B, P, S
from fflow.tree_util import tree_leaves

DTYPES = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
          "uint16", "uint32", "uint64", "bool", "complex64", "complex128"]  # fmt: skip


class Pair(NamedTuple):
    a: object
    b: object


def _values(dtype, shape=(3, 4), seed=0):
    rng = np.random.default_rng(seed)
    v = rng.normal(size=shape) * 100
    if dtype == "bool":
        return v > 0
    if np.dtype(dtype).kind == "c":
        return (v + 1j * rng.normal(size=shape)).astype(dtype)
    return v.astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_numpy_leaves_round_trip_bit_for_bit(tmp_path, dtype):
    value = _values(dtype)
    tree = {"x": value, "empty": np.zeros((0, 2), dtype), "scalar": value.reshape(-1)[0]}
    fflow.save(tmp_path / "c", tree)
    out = fflow.load(tmp_path / "c")
    for k in tree:
        assert out[k].dtype == np.asarray(tree[k]).dtype
        np.testing.assert_array_equal(out[k], tree[k])


def test_bfloat16_and_float8_round_trip(tmp_path):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf = jnp.asarray(_values("float32")).astype(jnp.bfloat16)
    f8 = _values("float32").astype(ml_dtypes.float8_e4m3fn)
    fflow.save(tmp_path / "c", {"bf": bf, "f8": f8})
    index = json.loads((tmp_path / "c" / "index.json").read_text())
    assert [e["dtype"] for e in index["leaves"]] == ["bfloat16", "float8_e4m3fn"]
    out = fflow.load(tmp_path / "c")
    assert out["bf"].dtype == jnp.bfloat16 and out["f8"].dtype == f8.dtype
    np.testing.assert_array_equal(
        np.asarray(out["bf"]).view(np.uint16), np.asarray(bf).view(np.uint16)
    )
    np.testing.assert_array_equal(out["f8"].view(np.uint8), f8.view(np.uint8))


def test_structures_python_leaves_and_like(tmp_path):
    tree = {"p": Pair(jnp.ones(2), [1, 2.5, "s", None, True]), "t": (jnp.zeros(()),)}
    fflow.save(tmp_path / "c", tree)
    out = fflow.load(tmp_path / "c")
    assert type(out["p"]) is Pair and out["p"].b == [1, 2.5, "s", None, True]
    assert isinstance(out["t"], tuple) and out["t"][0].shape == ()
    # modules and optimizer states come back through like=
    model = nn.MLP(3, 2, 4, 1, key=fflow.random.PRNGKey(0))
    tx = optim.adamw(1e-3)
    state = tx.init(model)
    fflow.save(tmp_path / "m", {"model": model, "opt": state})
    with pytest.raises(ValueError, match="like="):
        fflow.load(tmp_path / "m")
    fresh = nn.MLP(3, 2, 4, 1, key=fflow.random.PRNGKey(1))
    out = fflow.load(tmp_path / "m", like={"model": fresh, "opt": tx.init(fresh)})
    assert type(out["model"]) is nn.MLP
    for a, b in zip(tree_leaves(out), tree_leaves({"model": model, "opt": state})):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match="shape"):
        fflow.load(
            tmp_path / "c",
            like={"p": Pair(jnp.ones(3), [1, 2.5, "s", None, True]), "t": (jnp.zeros(()),)},
        )


def _placements():
    return {
        "line2": fflow.placement("cpu", [0, 1]),
        "line4": fflow.placement("cpu", [0, 1, 2, 3]),
        "mesh": fflow.placement("cpu", [[0, 1], [2, 3]]),
        "other2": fflow.placement("cpu", [2, 3]),
    }


SRC = [("line2", S(0)), ("line2", P), ("line4", S(1)), ("mesh", (S(1), B)), ("mesh", (S(0), S(1)))]
DST = [("line2", B), ("line4", S(0)), ("mesh", (S(1), S(0))), ("other2", S(1)), ("mesh", (P, B))]


@pytest.mark.parametrize("src", SRC, ids=[f"{p}-{s}" for p, s in SRC])
def test_global_arrays_saved_per_shard_restored_onto_other_placements(tmp_path, src):
    pls = _placements()
    value = _values("float32", (8, 4))
    x = fflow.to_global(jnp.asarray(value), pls[src[0]], src[1])
    fflow.save(tmp_path / "g", {"x": x})
    files = sorted(f for f in os.listdir(tmp_path / "g") if f.endswith(".npy"))
    index = json.loads((tmp_path / "g" / "index.json").read_text())
    entry = index["leaves"][0]
    assert entry["kind"] == "global" and len(files) == len(entry["shards"])
    distinct = len({tuple(map(tuple, s["box"])) for s in entry["shards"]})
    assert distinct == len(files)  # replicated shards are written once
    np.testing.assert_array_equal(fflow.load(tmp_path / "g")["x"], value)
    for name, sbp in DST:
        like = {"x": fflow.to_global(jnp.zeros((8, 4)), pls[name], sbp)}
        y = fflow.load(tmp_path / "g", like=like)["x"]
        assert y.placement == pls[name] and y.sbp == like["x"].sbp
        np.testing.assert_array_equal(np.asarray(y), value)


def test_atomic_replace_and_stale_temp_dirs(tmp_path):
    fflow.save(tmp_path / "c", {"v": jnp.ones(2)})
    os.makedirs(tmp_path / ".c.tmp-fflow")  # as a killed save leaves it
    fflow.save(tmp_path / "c", {"v": jnp.zeros(2)})
    assert fflow.load(tmp_path / "c")["v"].tolist() == [0.0, 0.0]
    assert sorted(os.listdir(tmp_path)) == ["c"]


def test_pickle_and_copy_keep_the_sharding():
    pl = fflow.placement("cpu", [[0, 1], [2, 3]])
    x = fflow.to_global(jnp.arange(8.0).reshape(4, 2), pl, (S(0), B))
    for y in (pickle.loads(pickle.dumps(x)), copy.deepcopy(x), copy.copy(x), x.copy()):
        assert y.placement == pl and y.sbp == (S(0), B)
        np.testing.assert_array_equal(np.asarray(y), np.arange(8.0).reshape(4, 2))
        np.testing.assert_array_equal(np.asarray(y + 1), np.arange(8.0).reshape(4, 2) + 1)
    assert pickle.loads(pickle.dumps(S(3))) == S(3) and hash(pickle.loads(pickle.dumps(P))) == hash(
        P
    )


def _train(mgr, steps, resume):
    model = nn.MLP(4, 1, 8, 1, key=fflow.random.PRNGKey(0))
    tx = optim.adam(1e-2)
    state = {"model": model, "opt": tx.init(model), "step": 0}
    if resume and mgr.latest_step() is not None:
        state = mgr.restore(like=state)
    rng = np.random.default_rng(0)
    data = [
        (rng.normal(size=(8, 4)).astype(np.float32), rng.normal(size=(8, 1)).astype(np.float32))
        for _ in range(steps)
    ]

    @fflow.jit
    def step(m, s, x, y):
        loss, g = fflow.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(m)
        u, s = tx.update(g, s, m)
        return optim.apply_updates(m, u), s, loss

    losses = {}
    for i in range(state["step"], steps):
        m, s, loss = step(state["model"], state["opt"], *data[i])
        state = {"model": m, "opt": s, "step": i + 1}
        losses[i + 1] = float(loss)
        mgr.save(i + 1, state)
    return losses


def test_checkpoint_manager_resume_gives_the_same_loss_curve(tmp_path):
    full = _train(CheckpointManager(tmp_path / "a", max_to_keep=2, save_interval=3), 10, False)
    mgr = CheckpointManager(tmp_path / "b", max_to_keep=2, save_interval=3)
    first = _train(mgr, 7, False)  # "interrupted" after step 7; last checkpoint: step 6
    assert mgr.all_steps() == [3, 6]
    rest = _train(mgr, 10, True)
    assert min(rest) == 7
    assert {**first, **rest} == full
    assert mgr.all_steps() == [6, 9]
