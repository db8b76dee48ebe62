"""fflow.experimental.ode.odeint (jax.experimental.ode.odeint) against closed-form
solutions, finite differences of its own solution, and JAX's recorded numbers."""

import numpy as np

import fflow
import fflow.numpy as jnp
from fflow.experimental.ode import odeint


def test_odeint_matches_closed_forms_and_pytrees():
    ts = jnp.linspace(0.0, 2.0, 5)
    ys = odeint(lambda y, t, k: -k * y, jnp.array([1.0, 2.0]), ts, 0.7)
    np.testing.assert_allclose(ys, np.exp(-0.7 * np.asarray(ts))[:, None] * [1.0, 2.0], rtol=1e-5)
    # a pytree state: harmonic oscillator, x = cos t, v = -sin t
    out = odeint(lambda s, t: {"x": s["v"], "v": -s["x"]}, {"x": 1.0, "v": 0.0}, ts)
    np.testing.assert_allclose(out["x"], np.cos(ts), atol=1e-5)
    np.testing.assert_allclose(out["v"], -np.sin(ts), atol=1e-5)


def test_odeint_gradients_by_the_adjoint():
    ts = jnp.array([0.0, 0.5, 1.5])

    def final(k, y0):
        return odeint(lambda y, t, k: -k * y + jnp.sin(t), y0, ts, k, rtol=1e-7, atol=1e-7)[
            -1
        ].sum()

    gk, gy = fflow.grad(final, argnums=(0, 1))(0.8, jnp.array([1.0, 0.5]))
    eps = 1e-3
    fd_k = (final(0.8 + eps, jnp.array([1.0, 0.5])) - final(0.8 - eps, jnp.array([1.0, 0.5]))) / (
        2 * eps
    )
    np.testing.assert_allclose(gk, fd_k, rtol=2e-3)
    np.testing.assert_allclose(gy, np.exp(-0.8 * 1.5) * np.ones(2), rtol=1e-4)  # d y(T) / d y0


def test_odeint_lotka_volterra_equals_jax():
    # recorded from JAX 0.10.2 (the corpus program odeint_lotka_volterra)
    import json
    import os

    def lv(y, t, a, b, c, d):
        prey, pred = y
        return jnp.stack([a * prey - b * prey * pred, c * prey * pred - d * pred])

    golden = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "jax_corpus.json")
    with open(golden) as f:
        want = json.load(f)["odeint_lotka_volterra"]
    ts = jnp.linspace(0.0, 2.0, 5)
    ys = odeint(lv, jnp.array([1.0, 0.5]), ts, 1.0, 0.5, 0.3, 0.8, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ys, want[0]["value"], rtol=2e-5)
    g = fflow.grad(
        lambda a: odeint(lv, jnp.array([1.0, 0.5]), ts, a, 0.5, 0.3, 0.8, rtol=1e-6, atol=1e-6)[
            -1, 0
        ]
    )(1.0)
    np.testing.assert_allclose(g, want[1]["value"], rtol=1e-4)
