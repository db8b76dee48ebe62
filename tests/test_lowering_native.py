"""Large fused elementwise groups compiled to native loops: same numbers as eager
(IEEE ops bit for bit, transcendental functions within an ulp or two), NaN/inf kept."""

import numpy as np
import pytest
from fflow.lowering import native

import fflow
import fflow.numpy as jnp

pytestmark = pytest.mark.skipif(not native.enabled(), reason="no C compiler")

N = native.NATIVE_MIN_SIZE


def chain(x, y):
    u = x * 1.5 + y
    return jnp.tanh(0.5 * u * (1 + jnp.tanh(u + 0.044715 * u**3))) * 0.75 - jnp.exp(-u * u)


def data(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=N).astype(np.float32)
    y = rng.normal(size=N).astype(np.float32)
    x[:6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30]
    return jnp.asarray(x), jnp.asarray(y)


def test_native_group_matches_eager():
    x, y = data()
    f = fflow.jit(chain)
    assert "native loop" in f.lower(x, y).as_text()
    with np.errstate(all="ignore"):
        expected = np.asarray(chain(x, y))
        got = np.asarray(f(x, y))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-6)


def test_native_grad_matches_eager():
    x, y = data(1)
    g = fflow.grad(lambda x: jnp.sum(chain(x, y)))
    x = jnp.asarray(np.asarray(x)[10:].copy().tolist() + [0.0] * 10, dtype=jnp.float32)
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(fflow.jit(g)(x), g(x), rtol=1e-5, atol=1e-6)


def test_ieee_ops_are_bit_identical_and_nan_propagates():
    def f(x, y):
        return jnp.maximum(x * y + 1, jnp.exp(x) * 0) - jnp.minimum(x, y) / (y - 2)

    x, y = data(2)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(fflow.jit(f)(x, y), f(x, y))


def test_disabled_falls_back_to_numpy():
    x, y = data(3)
    fflow.config.update("jit_native", False)
    try:
        lowered = fflow.jit(chain).lower(x, y)
        assert "native loop" not in lowered.as_text()
        with np.errstate(all="ignore"):
            np.testing.assert_array_equal(lowered.compile()(x, y), chain(x, y))
    finally:
        fflow.config.update("jit_native", True)
