"""First end-to-end checks of the core against NumPy."""

import numpy as np

import fflow
import fflow.numpy as jnp


def test_eager_matches_numpy():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_allclose(np.asarray(jnp.sin(x) * 2 + 1), np.sin(x) * 2 + 1, rtol=1e-6)


def test_grad_of_sin_is_cos():
    x = np.linspace(-2, 2, 7).astype(np.float32)
    g = fflow.grad(lambda v: jnp.sum(jnp.sin(v)))(x)
    np.testing.assert_allclose(np.asarray(g), np.cos(x), rtol=1e-6)


def test_no_perturbation_confusion():
    f = lambda x: x * fflow.grad(lambda y: x + y)(1.0)  # noqa: E731
    assert float(fflow.grad(f)(1.0)) == 1.0


def test_make_jaxpr_golden():
    text = str(fflow.make_jaxpr(lambda x: jnp.sin(jnp.cos(x)))(1.0))
    assert text == "{ lambda ; a:f32[]. let b:f32[] = cos a; c:f32[] = sin b in (c,) }"
