"""random.ball / random.generalized_normal against real JAX on the same keys (when
installed) and against what the distribution must satisfy."""

import numpy as np
import pytest

import fflow


@pytest.mark.parametrize("p, d, shape", [(2, 3, (2,)), (1.0, 4, ()), (3.0, 2, (3, 4))])
def test_ball_matches_jax(p, d, shape):
    jax = pytest.importorskip("jax")
    want = np.asarray(jax.random.ball(jax.random.PRNGKey(7), d, p=p, shape=shape))
    got = np.asarray(fflow.random.ball(fflow.random.PRNGKey(7), d, p=p, shape=shape))
    assert got.shape == want.shape == (*shape, d)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_generalized_normal_matches_jax():
    jax = pytest.importorskip("jax")
    want = np.asarray(jax.random.generalized_normal(jax.random.PRNGKey(1), 1.5, (64,)))
    got = np.asarray(fflow.random.generalized_normal(fflow.random.PRNGKey(1), 1.5, (64,)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_ball_points_are_inside_and_fill_the_ball():
    x = np.asarray(fflow.random.ball(fflow.random.PRNGKey(0), 2, shape=(4000,)), np.float64)
    r = np.linalg.norm(x, axis=-1)
    assert r.max() <= 1.0
    # uniform in the 2-D disc: P(r <= 1/2) = 1/4, and the mean is the centre
    assert abs((r <= 0.5).mean() - 0.25) < 0.03
    np.testing.assert_allclose(x.mean(0), 0.0, atol=0.05)


def test_ball_rejects_a_traced_dimension():
    with pytest.raises(TypeError, match="d must be a Python int"):
        fflow.random.ball(fflow.random.PRNGKey(0), 2.5)
