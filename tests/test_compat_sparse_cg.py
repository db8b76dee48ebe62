"""fflow.scipy.sparse.linalg.cg (jax.scipy.sparse.linalg.cg) against NumPy's solve:
matrices and functions, preconditioned, pytrees, jit and vmap, JAX's iteration cap."""

import numpy as np

import fflow
import fflow.numpy as jnp
from fflow.scipy.sparse.linalg import cg


def _spd(n, seed):
    a = np.random.default_rng(seed).normal(size=(n, n)).astype(np.float32)
    return a @ a.T + n * np.eye(n, dtype=np.float32)


def test_cg_matches_numpy_solve():
    a, b = _spd(6, 0), np.arange(1.0, 7.0, dtype=np.float32)
    want = np.linalg.solve(a.astype(np.float64), b)
    for op in (a, lambda x: jnp.matmul(a, x)):
        x, info = cg(op, b, tol=1e-7)
        assert info is None
        np.testing.assert_allclose(x, want, rtol=1e-4, atol=1e-5)
    x, _ = fflow.jit(lambda b: cg(a, b, M=lambda r: r / np.diag(a), tol=1e-7))(b)
    np.testing.assert_allclose(x, want, rtol=1e-4, atol=1e-5)
    xs = fflow.vmap(lambda b: cg(a, b, tol=1e-7)[0])(np.stack([b, -b]))
    np.testing.assert_allclose(xs, np.stack([want, -want]), rtol=1e-4, atol=1e-5)


def test_cg_pytrees_and_the_iteration_cap():
    sol, _ = cg(
        lambda t: {"a": 2.0 * t["a"], "b": 4.0 * t["b"]}, {"a": jnp.ones(2), "b": jnp.full(3, 8.0)}
    )
    assert sol["a"].tolist() == [0.5, 0.5] and sol["b"].tolist() == [2.0, 2.0, 2.0]
    a, b = _spd(8, 1), np.ones(8, np.float32)
    one_step, _ = cg(a, b, maxiter=1)  # x1 = alpha r0 with alpha = r.r / r.Ar
    np.testing.assert_allclose(one_step, b * (b @ b) / (b @ a @ b), rtol=1e-5)
