"""3-D parallelism and gradient accumulation: a DP x TP x PP step on a 2x2x2 mesh of 8
simulated devices equals the single-device step; accumulating gradients over
micro-batches inside one sharded program reduces them once per step."""

import numpy as np

import fflow
import fflow.numpy as jnp
from fflow.sharding import B, S

DP_TP = ((S(0), B), (B, B))  # activations: rows over the data axis, whole on the tensor axis


def mlp_block(p, x):
    # Megatron: column-parallel w1 (S(1) on the tensor axis), row-parallel w2 (S(0))
    return jnp.tanh(jnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"])


def stage0(p, xy):
    x, y = xy
    return mlp_block(p, x), y


def stage1(p, xy):
    x, y = xy
    return jnp.mean((mlp_block(p, x) @ p["head"] - y) ** 2)


def params(seed=0, d=8):
    rng = np.random.default_rng(seed)

    def n(*s):
        return (rng.normal(size=s) / np.sqrt(s[0])).astype(np.float32)

    block = lambda: {"w1": n(d, 2 * d), "b1": n(2 * d) * 0.1, "w2": n(2 * d, d), "b2": n(d) * 0.1}
    last = block()
    last["head"] = n(d, 1)
    return [block(), last]


TP = {"w1": (B, S(1)), "b1": (B, S(0)), "w2": (B, S(0)), "b2": (B, B)}


def plain(ps, batch):
    return stage1(ps[1], stage0(ps[0], batch))


def test_3d_parallel_step_equals_single_device():
    meshes = [
        fflow.placement("cpu", [[0, 1], [2, 3]]),  # (data, tensor) mesh of stage 0
        fflow.placement("cpu", [[4, 5], [6, 7]]),  # ... of stage 1
    ]
    tp1 = dict(TP, head=(B, B))
    f = fflow.pipeline(
        [stage0, stage1],
        meshes,
        num_microbatches=2,
        schedule="1f1b",
        in_sbp=[(TP, ((S(0), B), (S(0), B))), (tp1, ((S(0), B), (S(0), B)))],
    )
    rng = np.random.default_rng(5)
    batch = (rng.normal(size=(8, 8)).astype(np.float32), rng.normal(size=(8, 1)).astype(np.float32))
    ps = params()
    loss, grads = fflow.value_and_grad(f)(ps, batch)
    want_loss, want = fflow.value_and_grad(plain)(ps, batch)
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-5)
    for s in range(2):
        for k in want[s]:
            g = grads[s][k]
            assert g.placement == meshes[s]
            assert g.sbp == (tp1 if s else TP)[k]  # gradients come back in the params' SBP
            np.testing.assert_allclose(np.asarray(g), np.asarray(want[s][k]), rtol=1e-4, atol=1e-5)
    # one SGD step on the 8 devices equals one on a single device
    new = fflow.tree_util.tree_map(lambda p, g: p - 0.1 * g, ps, grads)
    ref = fflow.tree_util.tree_map(lambda p, g: p - 0.1 * g, ps, want)
    np.testing.assert_allclose(float(f(new, batch)), float(plain(ref, batch)), rtol=1e-5)


def _mlp_loss(p, batch):
    x, y = batch
    return jnp.mean((jnp.tanh(x @ p[0]) @ p[1] - y) ** 2)


def _data(seed=0):
    rng = np.random.default_rng(seed)
    p = [rng.normal(size=(3, 5)).astype(np.float32), rng.normal(size=(5, 1)).astype(np.float32)]
    batch = (
        rng.normal(size=(16, 3)).astype(np.float32),
        rng.normal(size=(16, 1)).astype(np.float32),
    )
    return p, batch


def test_accumulated_gradients_equal_whole_batch():
    p, batch = _data()
    want_loss, want = fflow.value_and_grad(_mlp_loss)(p, batch)
    for m in (1, 2, 4):
        loss, grads = fflow.accumulate_gradients(_mlp_loss, m)(p, batch)
        np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-5)
        for g, w in zip(grads, want):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)
    jitted = fflow.jit(fflow.accumulate_gradients(_mlp_loss, 4))(p, batch)
    np.testing.assert_allclose(float(jitted[0]), float(want_loss), rtol=1e-5)


def test_data_parallel_accumulation_reduces_once_per_step():
    p, batch = _data(1)
    pl = fflow.placement("cpu", [0, 1, 2, 3])
    plans = {}
    for m in (1, 4):
        step = fflow.accumulate_gradients(_mlp_loss, m)
        f = fflow.shard(step, pl, in_sbp=(B, (S(0), S(0))), out_sbp=(B, B))
        plans[m] = f.lower(p, batch)
        loss, grads = f(p, batch)
        want_loss, want = fflow.value_and_grad(_mlp_loss)(p, batch)
        np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-5)
        for g, w in zip(grads, want):
            assert g.sbp == (B,)
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)
    # the same collectives and bytes with 4 micro-batches as with 1: the loss and each
    # gradient are all-reduced once
    assert plans[4].collectives() == plans[1].collectives()
    assert plans[4].count("all_reduce") == 3
    assert plans[4].bytes == plans[1].bytes
