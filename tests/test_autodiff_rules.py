"""Regression tests of specific JVP/transpose rules, against closed forms and NumPy
(the registry-driven finite-difference checks are in test_autodiff_primitives.py)."""

import numpy as np

import fflow
import fflow.numpy as jnp
from fflow import lax


def test_pow_derivatives_at_zero_are_finite():
    # d/dy 0**y = 0**y * log(0) would be 0 * -inf: JAX's rule replaces the zero first
    assert float(fflow.grad(lambda y: lax.pow(0.0, y))(2.0)) == 0.0
    assert float(fflow.grad(fflow.grad(lambda y: lax.pow(0.0, y)))(2.0)) == 0.0
    # d/dx x**0 = 0 everywhere, also at x = 0 (not 0 * 0**-1 = nan)
    assert float(fflow.grad(lambda x: lax.pow(x, 0.0))(0.0)) == 0.0
    h = fflow.hessian(lambda x: jnp.sum(x**2.0))(jnp.zeros(2))
    np.testing.assert_array_equal(np.asarray(h), 2 * np.eye(2))


def test_select_n_transpose_with_numpy_cotangent():
    # the cotangent reaching select_n can be a plain NumPy scalar
    g = fflow.grad(lambda x: jnp.where(x > 0, x * 3.0, x * x))
    assert float(g(2.0)) == 3.0
    assert float(g(-2.0)) == -4.0


def test_gather_transpose_clamps_like_gather():
    x = np.arange(4.0)
    idx = np.array([[6], [-3], [1]], np.int32)  # clamped to 3, 0, 1
    g = fflow.grad(lambda v: jnp.sum(lax.gather(v, idx, (0,)) * np.array([1.0, 2.0, 3.0])))(x)
    np.testing.assert_array_equal(np.asarray(g), [2.0, 3.0, 0.0, 1.0])


def test_scatter_add_out_of_bounds_updates_get_no_cotangent():
    idx = np.array([[1], [9]], np.int32)
    g = fflow.grad(lambda u: jnp.sum(lax.scatter_add(np.zeros(3), idx, u, (0,)) * 2.0))(np.ones(2))
    np.testing.assert_array_equal(np.asarray(g), [2.0, 0.0])


def test_scatter_repeated_indices_last_writer_gets_cotangent():
    idx = np.array([[0], [2], [0]], np.int32)
    x, u = np.zeros(3), np.array([1.0, 2.0, 3.0])
    out = lax.scatter(x, idx, u, (0,))
    np.testing.assert_array_equal(np.asarray(out), [3.0, 0.0, 2.0])  # NumPy: last write wins
    gx, gu = fflow.grad(
        lambda x, u: jnp.sum(lax.scatter(x, idx, u, (0,)) * np.array([10.0, 20.0, 30.0])),
        argnums=(0, 1),
    )(x, u)
    np.testing.assert_array_equal(np.asarray(gx), [0.0, 20.0, 0.0])
    np.testing.assert_array_equal(np.asarray(gu), [0.0, 30.0, 10.0])


def test_scatter_mul_with_repeated_indices_and_zeros():
    idx = np.array([[0], [0], [1], [1]], np.int32)
    x = np.array([2.0, 3.0])
    u = np.array([0.0, 5.0, 4.0, 0.5])
    gu = fflow.grad(lambda u: jnp.sum(lax.scatter_mul(x, idx, u, (0,))), argnums=0)(u)
    # out0 = 2 * u0 * u1, out1 = 3 * u2 * u3
    np.testing.assert_allclose(np.asarray(gu), [2 * 5.0, 2 * 0.0, 3 * 0.5, 3 * 4.0])


def test_scatter_max_repeated_indices():
    idx = np.array([[0], [0], [1]], np.int32)
    x = np.array([0.0, 10.0])
    u = np.array([3.0, 5.0, 1.0])
    gx, gu = fflow.grad(
        lambda x, u: jnp.sum(lax.scatter_max(x, idx, u, (0,)) * np.array([1.0, 2.0])),
        argnums=(0, 1),
    )(x, u)
    np.testing.assert_array_equal(np.asarray(gu), [0.0, 1.0, 0.0])  # u1 = 5 wins slot 0
    np.testing.assert_array_equal(np.asarray(gx), [0.0, 2.0])  # x1 = 10 keeps slot 1


def test_sort_under_jit_and_grad():
    x = np.array([3.0, 1.0, 2.0])
    np.testing.assert_array_equal(np.asarray(fflow.jit(lax.sort)(x)), [1.0, 2.0, 3.0])
    g = fflow.grad(lambda v: jnp.sum(lax.sort(v) * np.array([1.0, 10.0, 100.0])))(x)
    np.testing.assert_array_equal(np.asarray(g), [100.0, 1.0, 10.0])


def test_reduce_prod_grad_with_zeros_matches_closed_form():
    x = np.array([2.0, 0.0, 3.0])
    np.testing.assert_array_equal(
        np.asarray(fflow.grad(lambda v: lax.reduce_prod(v, (0,)))(x)), [0, 6, 0]
    )
    x = np.array([0.0, 0.0, 3.0])
    np.testing.assert_array_equal(
        np.asarray(fflow.grad(lambda v: lax.reduce_prod(v, (0,)))(x)), [0, 0, 0]
    )
