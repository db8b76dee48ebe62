"""Control flow under `shard`: a scan over stacked layer weights keeps tensor parallelism
(the same plan cost per layer as the unrolled model), and gradient accumulation over
micro-batches keeps data parallelism with one all-reduce per gradient at the end."""

import numpy as np

import fflow
import fflow.numpy as jnp
from fflow.sharding import H200, B, S

PL4 = fflow.placement("cpu", [0, 1, 2, 3])
L, BATCH, D = 3, 8, 16
RNG = np.random.default_rng(0)
W1 = (RNG.normal(size=(L, D, 4 * D)) * 0.2).astype(np.float32)
W2 = (RNG.normal(size=(L, 4 * D, D)) * 0.2).astype(np.float32)
X = RNG.normal(size=(BATCH, D)).astype(np.float32)


LOCAL = {"shard_slice", "shard_pad", "keep_one"}  # conversions that move no data


def _communicating(sp):
    return [c for c in sp.collectives() if c not in LOCAL]


def block(x, w1, w2):
    return x + jnp.tanh(x @ w1) @ w2


def scanned(w1, w2, x):
    y, _ = fflow.lax.scan(lambda x, w: (block(x, *w), None), x, (w1, w2))
    return jnp.sum(y**2)


def unrolled(w1, w2, x):
    for i in range(w1.shape[0]):
        x = block(x, w1[i], w2[i])
    return jnp.sum(x**2)


def _megatron(fn):
    step = fflow.value_and_grad(fn, argnums=(0, 1))
    # stacked weights: layer dim first, then Megatron's column / row split
    return fflow.shard(step, PL4, in_sbp=(S(2), S(1), B), out_sbp=(B, (S(2), S(1))), profile=H200)


def test_scan_over_stacked_layers_keeps_megatron_plan_per_layer():
    sp_scan = _megatron(scanned).plan(W1, W2, X)
    sp_unrolled = _megatron(unrolled).plan(W1, W2, X)
    per_layer, per_layer_unrolled = sp_scan.plan.time / L, sp_unrolled.plan.time / L
    assert abs(per_layer - per_layer_unrolled) <= 1e-3 * per_layer_unrolled
    # forward: one all-reduce per layer; backward: one per layer but the first
    assert _communicating(sp_scan) == ["all_reduce"] * (2 * L - 1)
    value, (g1, g2) = _megatron(scanned)(W1, W2, X)
    ref, (r1, r2) = fflow.value_and_grad(unrolled, argnums=(0, 1))(W1, W2, X)
    np.testing.assert_allclose(float(value), float(ref), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(g1), np.asarray(r1), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(g2), np.asarray(r2), rtol=1e-4, atol=1e-5)


def loss(params, x):
    w1, w2 = params
    return jnp.mean(jnp.tanh(x @ w1) @ w2)


def accumulated(params, micro):
    """Gradient accumulation: the mean gradient over micro-batches, by a scan."""

    def body(acc, xb):
        g = fflow.grad(loss)(params, xb)
        return (acc[0] + g[0], acc[1] + g[1]), None

    zeros = (jnp.zeros_like(params[0]), jnp.zeros_like(params[1]))
    (a, b), _ = fflow.lax.scan(body, zeros, micro)
    n = micro.shape[0]
    return a / n, b / n


def test_gradient_accumulation_keeps_data_parallel_one_all_reduce_at_the_end():
    params = (W1[0], W2[0])
    micro = RNG.normal(size=(4, BATCH, D)).astype(np.float32)  # 4 micro-batches
    f = fflow.shard(accumulated, PL4, in_sbp=((B, B), S(1)), out_sbp=B, profile=H200)
    sp = f.plan(params, micro)
    assert _communicating(sp) == ["all_reduce", "all_reduce"]  # one per gradient, once
    got = f(params, micro)
    ref = accumulated(params, micro)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-6)
