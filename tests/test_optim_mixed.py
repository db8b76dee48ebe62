"""optim.mixed_precision: fp32 master weights and the dynamic loss scale in the
optimizer state; an overflowed step is skipped. References: optax's Adam on the finite
gradients only, a NumPy re-implementation of the scale rule, ml_dtypes' bf16 rounding."""

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp
from fflow import nn, optim

GRADS = [np.random.default_rng(i).normal(size=(3, 2)).astype(np.float32) for i in range(6)]
BAD = 2  # the step whose gradient gets an inf


def numpy_scales(finite, scale, period, factor):
    """The loss scale after each step: /factor on overflow, *factor after `period` good."""
    out, good = [], 0
    for ok in finite:
        if not ok:
            scale, good = max(scale / factor, 1.0), 0
        elif good + 1 >= period:
            scale, good = scale * factor, 0
        else:
            good += 1
        out.append(scale)
    return out


def run(tx, params, jit):
    state = tx.init(params)

    def step(params, state, g):
        updates, state = tx.update(g, state, params)
        return optim.apply_updates(params, updates), state

    step = fflow.jit(step) if jit else step
    out = []
    for i, g in enumerate(GRADS):
        g = g * np.float32(state.loss_scale)  # what grad(loss * S) gives
        if i == BAD:
            g = g.copy()
            g[1, 0] = np.inf
        params, state = step(params, state, jnp.asarray(g))
        out.append((np.asarray(params).astype(np.float32), state))
    return out


@pytest.mark.parametrize("jit", [False, True])
def test_matches_optax_adam_on_the_finite_steps_and_skips_the_inf_step(jit):
    optax = pytest.importorskip("optax")
    jax = pytest.importorskip("jax")
    p0 = np.random.default_rng(9).normal(size=(3, 2)).astype(np.float32)
    tx = optim.mixed_precision(optim.adam(1e-2), init_scale=8.0, period=2, factor=2.0)
    out = run(tx, jnp.asarray(p0), jit)

    ref_tx, ref = optax.adam(1e-2), jax.numpy.asarray(p0)
    ref_state, expected = ref_tx.init(ref), []
    for i, g in enumerate(GRADS):
        if i != BAD:
            u, ref_state = ref_tx.update(jax.numpy.asarray(g), ref_state, ref)
            ref = optax.apply_updates(ref, u)
        expected.append(np.asarray(ref))
    for (params, state), want in zip(out, expected):
        np.testing.assert_allclose(np.asarray(state.master), want, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(params, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(out[BAD][0], out[BAD - 1][0])  # skipped: unchanged
    finite = [i != BAD for i in range(len(GRADS))]
    scales = [float(s.loss_scale) for _, s in out]
    assert scales == numpy_scales(finite, 8.0, period=2, factor=2.0) == [8, 16, 8, 8, 16, 16]
    assert int(out[-1][1].skipped) == 1


def test_bf16_parameters_are_the_rounded_fp32_master_weights():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    # steps of 1e-3 are below bf16's spacing at 1.0 (2^-7): bf16 alone would never move
    tx = optim.mixed_precision(optim.sgd(1e-3), init_scale=1.0, dynamic=False)
    params = jnp.ones(4, jnp.bfloat16)
    state = tx.init(params)
    master = np.ones(4, np.float32)
    step = fflow.jit(lambda p, s, g: (lambda u, s: (optim.apply_updates(p, u), s))(
        *tx.update(g, s, p)))  # fmt: skip
    for _ in range(20):
        params, state = step(params, state, jnp.ones(4, jnp.bfloat16))
        master = master - np.float32(1e-3)
    assert params.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(state.master), master, rtol=1e-6)
    want = master.astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(params).astype(np.float32), want)
    assert float(np.asarray(params).astype(np.float32)[0]) < 1.0


def test_amp_training_step_skips_a_batch_that_overflows():
    model = nn.Linear(4, 3, key=fflow.random.PRNGKey(0))
    tx = optim.mixed_precision(optim.adam(1e-2), init_scale=2.0**10, period=1000)
    state = tx.init(model)
    loss = fflow.amp(lambda m, x: jnp.mean(m(x) ** 2), "fp16")

    @fflow.jit
    def step(model, state, x):
        value, grads = fflow.value_and_grad(lambda m: loss(m, x) * state.loss_scale)(model)
        updates, state = tx.update(grads, state, model)
        return optim.apply_updates(model, updates), state, value / state.loss_scale

    x = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    bad = x.copy()
    bad[0, 0] = np.inf
    model1, state1, _ = step(model, state, jnp.asarray(x))
    model2, state2, _ = step(model1, state1, jnp.asarray(bad))
    for a, b in zip(fflow.tree_util.tree_leaves(model1), fflow.tree_util.tree_leaves(model2)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert (float(state1.loss_scale), float(state2.loss_scale)) == (1024.0, 512.0)
    assert int(state2.skipped) == 1 and int(state2.inner_state[0].count) == 1
    model3, state3, _ = step(model2, state2, jnp.asarray(x))
    assert int(state3.skipped) == 1 and int(state3.inner_state[0].count) == 2
    assert all(np.all(np.isfinite(np.asarray(p))) for p in fflow.tree_util.tree_leaves(model3))
