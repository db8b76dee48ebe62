"""Modules as pytrees: immutability, partition/combine, summary, SBP annotations, and
models through grad / jit / vmap / shard / amp against un-transformed references."""

import dataclasses

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp
from fflow import nn, optim
from fflow.sharding import B, S
from fflow.tree_util import tree_leaves, tree_map

KEY = fflow.random.PRNGKey(0)


def _x(*shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


class Block(nn.Module):
    """A small custom module: pre-LN attention + MLP (like a transformer block)."""

    ln: nn.LayerNorm
    attn: nn.MultiHeadAttention
    mlp: nn.MLP

    def __init__(self, d, *, key, sbp=False):
        k1, k2 = fflow.random.split(key)
        tp = dict(qkv_sbp=S(1), out_sbp=S(0)) if sbp else {}
        self.ln = nn.LayerNorm(d)
        self.attn = nn.MultiHeadAttention(2, d, key=k1, **tp)
        self.mlp = nn.MLP(d, d, 2 * d, 1, activation=nn.gelu, key=k2)

    def __call__(self, x):
        x = x + self.attn(self.ln(x), causal=True)
        return x + self.mlp(x)


def _loss(model, x):
    return jnp.mean(model(x) ** 2)


def test_modules_are_immutable_and_replace_copies():
    lin = nn.Linear(2, 3, key=KEY)
    with pytest.raises(dataclasses.FrozenInstanceError, match="replace"):
        lin.weight = jnp.zeros((2, 3))
    new = lin.replace(bias=jnp.ones(3))
    assert new.bias.tolist() == [1.0] * 3 and lin.bias.tolist() == [0.0] * 3
    leaves = tree_leaves(lin)
    assert len(leaves) == 2  # static fields are structure, not leaves


def test_partition_combine_count_summary():
    model = Block(8, key=KEY)
    n = sum(int(np.prod(x.shape)) for x in tree_leaves(model))
    assert nn.count_params(model) == n
    trainable, frozen = nn.partition(model, lambda x: x.ndim == 2)  # matrices only
    assert all(x.ndim == 2 for x in tree_leaves(trainable))
    assert all(x.ndim == 1 for x in tree_leaves(frozen))
    back = nn.combine(trainable, frozen)
    for a, b in zip(tree_leaves(back), tree_leaves(model)):
        assert a is b
    # grad of the trainable part only
    g = fflow.grad(lambda t, f, x: _loss(nn.combine(t, f), x))(trainable, frozen, _x(2, 4, 8))
    assert len(tree_leaves(g)) == len(tree_leaves(trainable))
    text = nn.summary(model)
    assert ".attn.query_proj.weight" in text and f"total: {n:,} parameters" in text


def test_grad_of_a_model_vs_finite_differences():
    model = Block(8, key=KEY)
    x = jnp.asarray(_x(2, 4, 8))
    g = fflow.grad(_loss)(model, x)
    assert type(g) is Block
    rng = np.random.default_rng(1)
    direction = tree_map(lambda p: jnp.asarray(rng.normal(size=p.shape).astype(np.float32)), model)
    eps = 1e-2

    def at(t):
        return float(_loss(tree_map(lambda p, d: p + t * d, model, direction), x))

    fd = (at(eps) - at(-eps)) / (2 * eps)
    an = sum(float(jnp.sum(a * b)) for a, b in zip(tree_leaves(g), tree_leaves(direction)))
    np.testing.assert_allclose(an, fd, rtol=2e-2)


def test_jit_and_vmap_of_a_model():
    model = Block(8, key=KEY)
    x = _x(3, 4, 8)
    eager = np.asarray(model(x))
    np.testing.assert_allclose(
        np.asarray(fflow.jit(lambda m, x: m(x))(model, x)), eager, rtol=1e-5, atol=1e-5
    )
    per_example = fflow.vmap(lambda x: model(x[None])[0])(jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(per_example), eager, rtol=1e-5, atol=1e-5)
    # vmap over an ensemble of models (a stacked model is a model of stacked leaves)
    models = [nn.Linear(4, 2, key=k) for k in fflow.random.split(KEY, 3)]
    stacked = tree_map(lambda *xs: jnp.stack(xs), *models)
    xs = jnp.asarray(_x(5, 4))
    out = fflow.vmap(lambda m: m(xs))(stacked)
    for i, m in enumerate(models):
        np.testing.assert_allclose(np.asarray(out[i]), np.asarray(m(xs)), rtol=1e-5, atol=1e-6)


def test_sbp_of_and_tensor_parallel_shard_equals_unsharded():
    model = Block(8, key=KEY, sbp=True)
    spec = nn.sbp_of(model)
    assert spec.attn.query_proj.weight == S(1) and spec.attn.output_proj.weight == S(0)
    assert spec.ln.weight is None
    pl = fflow.placement("cpu", [0, 1])
    x = _x(2, 4, 8)
    step = fflow.shard(fflow.value_and_grad(_loss), pl, in_sbp=(spec, B))
    loss, g = step(model, x)
    ref_loss, ref_g = fflow.value_and_grad(_loss)(model, x)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    for a, b in zip(tree_leaves(g), tree_leaves(ref_g)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    plan = step.plan(model, x)
    assert "all_reduce" in plan.collectives()


def test_training_step_under_amp_and_jit():
    model = nn.MLP(8, 4, 16, 2, key=KEY)
    x, y = jnp.asarray(_x(16, 8)), jnp.asarray(_x(16, 4, seed=3))

    def loss(m, x, y):
        return jnp.mean((m(x) - y) ** 2)

    tx = optim.adam(1e-2)
    for policy in (None, "bf16"):
        f = loss if policy is None else fflow.amp(loss, policy)

        @fflow.jit
        def step(m, s, x, y, f=f):
            value, g = fflow.value_and_grad(f)(m, x, y)
            u, s = tx.update(g, s, m)
            return optim.apply_updates(m, u), s, value

        m, s = model, tx.init(model)
        losses = []
        for _ in range(30):
            m, s, value = step(m, s, x, y)
            losses.append(float(value))
        assert all(p.dtype == np.float32 for p in tree_leaves(m))  # fp32 master weights
        assert losses[-1] < 0.7 * losses[0], (policy, losses[0], losses[-1])
        if policy is None:
            ref = losses
    np.testing.assert_allclose(losses[:3], ref[:3], rtol=5e-2)  # bf16 follows fp32
