"""Loss scaling: fp16 gradient underflow and its cure, the dynamic scale's schedule
(against a plain-Python reference), skipped steps, and jit of all of it."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fflow
import fflow.numpy as jnp

DLS = fflow.amp.DynamicLossScale


def reference_schedule(finite_steps, scale=2.0**16, period=2000, factor=2, floor=1.0):
    """The documented schedule, step by step in Python: (scale, counter) after each step."""
    counter = 0
    out = []
    for finite in finite_steps:
        if finite:
            counter += 1
            if counter >= period:
                scale, counter = scale * factor, 0
        else:
            scale, counter = max(scale / factor, floor), 0
        out.append((scale, counter))
    return out


def test_defaults():
    ls = DLS()
    assert float(ls.loss_scale) == 2.0**16 and int(ls.counter) == 0
    assert ls.period == 2000 and ls.factor == 2 and ls.min_loss_scale == 1.0


@pytest.mark.parametrize("jit", [False, True])
def test_schedule_growth_backoff_floor(jit):
    steps = [True] * 3 + [False] + [True] * 7 + [False] * 6 + [True] * 3 + [False] * 12
    ls = DLS(loss_scale=8.0, period=3)
    adjust = (lambda s, f: s.adjust(f)) if not jit else fflow.jit(lambda s, f: s.adjust(f))
    got = []
    for finite in steps:
        ls = adjust(ls, jnp.asarray(finite))
        got.append((float(ls.loss_scale), int(ls.counter)))
    assert got == reference_schedule(steps, scale=8.0, period=3)
    assert got[-1][0] == 1.0  # the floor held through the run of overflows
    assert max(s for s, _ in got) == 32.0


def test_default_period_is_2000_finite_steps():
    ls = DLS()
    adjust = fflow.jit(lambda s: s.adjust(jnp.asarray(True)))
    for _ in range(1999):
        ls = adjust(ls)
    assert float(ls.loss_scale) == 2.0**16 and int(ls.counter) == 1999
    ls = adjust(ls)
    assert float(ls.loss_scale) == 2.0**17 and int(ls.counter) == 0


def test_all_finite_and_select_tree():
    good = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3), "step": jnp.arange(2)}
    bad = {
        "w": jnp.asarray([[1.0, np.nan, 0.0], [0, 0, 0]]),
        "b": jnp.zeros(3),
        "step": good["step"],
    }
    assert bool(fflow.amp.all_finite(good)) and not bool(fflow.amp.all_finite(bad))
    assert not bool(fflow.amp.all_finite([jnp.asarray([-np.inf], np.float16)]))
    picked = fflow.amp.select_tree(jnp.asarray(False), bad, good)
    np.testing.assert_array_equal(np.asarray(picked["w"]), np.ones((2, 3)))
    picked = fflow.jit(fflow.amp.select_tree)(jnp.asarray(True), good, bad)
    np.testing.assert_array_equal(np.asarray(picked["w"]), np.ones((2, 3)))


def tiny_loss(w, x):
    # gradient 8 * 2^-26 ~ 1.2e-7 per weight: the cotangent reaching the fp16
    # matmul is 2^-26, below fp16's smallest subnormal (2^-24), so it flushes to 0
    return jnp.sum(x @ w) * 2.0**-26


def test_fp16_gradients_underflow_without_scaling_and_not_with_it():
    w = jnp.ones((4, 3))
    x = jnp.ones((8, 4))
    exact = np.full((4, 3), 8 * 2.0**-26)
    np.testing.assert_allclose(np.asarray(fflow.grad(tiny_loss)(w, x)), exact, rtol=1e-6)
    plain = fflow.grad(fflow.amp(tiny_loss, "fp16"))(w, x)
    assert plain.dtype == np.float32
    assert not np.any(np.asarray(plain)), "expected fp16 underflow to zero"
    ls = DLS()
    loss, grads, finite = fflow.amp.scaled_value_and_grad(fflow.amp(tiny_loss, "fp16"))(ls, w, x)
    assert bool(finite) and grads.dtype == np.float32
    np.testing.assert_allclose(np.asarray(grads), exact, rtol=1e-3)
    np.testing.assert_allclose(float(loss), 12 * 8 * 2.0**-26, rtol=1e-3)
    # bf16 has fp32's exponent range: no underflow, no scaler needed
    g_bf16 = fflow.grad(fflow.amp(tiny_loss, "bf16"))(w, x)
    np.testing.assert_allclose(np.asarray(g_bf16), exact, rtol=1e-2)


def big_loss(w, x):
    return jnp.sum(x @ w) * 4.0


def sgd_step(params, ls, x, lr=0.01):
    """One fp16 step with dynamic loss scaling; skips the update on overflow."""
    loss, grads, finite = fflow.amp.scaled_value_and_grad(fflow.amp(big_loss, "fp16"))(
        ls, params, x
    )
    new = params - lr * grads
    return fflow.amp.select_tree(finite, new, params), ls.adjust(finite), finite


@pytest.mark.parametrize("jit", [False, True])
def test_overflowing_steps_are_skipped_and_scale_backs_off(jit):
    w = jnp.ones((4, 3))
    x = jnp.full((8, 4), 4.0)
    step = fflow.jit(sgd_step) if jit else sgd_step
    # the fp16 gradient of the cast weights is scale * 4 * colsum(x) = scale * 128;
    # it fits fp16 (max 65504) once scale <= 2^8, so 2^16..2^9 overflow (8 skipped steps)
    fits = [s for s in (2.0**k for k in range(17)) if s * 128 <= 65504]
    first_ok = max(fits)
    ls = DLS()
    params = w
    for _ in range(16):
        scale_before = float(ls.loss_scale)
        params, ls, finite = step(params, ls, x)
        if bool(finite):
            break
        np.testing.assert_array_equal(np.asarray(params), np.asarray(w))  # skipped
        assert float(ls.loss_scale) == scale_before / 2 and int(ls.counter) == 0
    assert bool(finite) and scale_before == first_ok == 2.0**8
    assert int(ls.counter) == 1 and float(ls.loss_scale) == first_ok
    expected = np.asarray(w) - 0.01 * 4.0 * 8 * 4.0  # d/dw sum(x @ w) * 4 = 4 * colsum(x)
    np.testing.assert_allclose(np.asarray(params), expected, rtol=1e-3)


def test_static_and_noop_scales():
    w = jnp.ones((4, 3))
    x = jnp.ones((8, 4))
    exact = np.full((4, 3), 8 * 2.0**-26)
    s = fflow.amp.StaticLossScale(2.0**12)
    _, g, finite = fflow.amp.scaled_value_and_grad(fflow.amp(tiny_loss, "fp16"))(s, w, x)
    assert bool(finite) and s.adjust(finite) is s
    np.testing.assert_allclose(np.asarray(g), exact, rtol=1e-3)
    n = fflow.amp.NoOpLossScale()
    _, g, finite = fflow.amp.scaled_value_and_grad(fflow.amp(tiny_loss, "bf16"))(n, w, x)
    np.testing.assert_allclose(np.asarray(g), exact, rtol=1e-2)


def test_loss_scale_is_a_pytree():
    from fflow.tree_util import tree_flatten, tree_unflatten

    ls = DLS(loss_scale=4.0, period=7)
    leaves, tree = tree_flatten(ls)
    assert len(leaves) == 2
    back = tree_unflatten(tree, leaves)
    assert back.period == 7 and float(back.loss_scale) == 4.0


@settings(max_examples=30, deadline=None)
@given(
    steps=st.lists(st.booleans(), min_size=1, max_size=30),
    period=st.integers(1, 5),
    scale=st.sampled_from([1.0, 2.0, 8.0, 1024.0]),
    factor=st.sampled_from([2, 4]),
)
def test_schedule_matches_reference_on_drawn_sequences(steps, period, scale, factor):
    ls = DLS(loss_scale=scale, period=period, factor=factor)
    got = []
    for finite in steps:
        ls = ls.adjust(jnp.asarray(finite))
        got.append((float(ls.loss_scale), int(ls.counter)))
    assert got == reference_schedule(steps, scale=scale, period=period, factor=factor)
