"""fflow.lax.linalg (jax.lax.linalg): lax's signatures and result orders against NumPy /
SciPy (eigh returns (vectors, values); triangular_solve's left_side / transpose_a)."""

import numpy as np
import pytest

import fflow
from fflow import lax

sl = pytest.importorskip("scipy.linalg")
A = np.array([[4.0, 1.0, 0.5], [1.0, 3.0, 0.2], [0.5, 0.2, 2.0]], np.float32)
B = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32)


def test_decompositions():
    L = lax.linalg.cholesky(A)  # noqa: N806
    np.testing.assert_allclose(L, np.linalg.cholesky(A), rtol=1e-5)
    v, w = lax.linalg.eigh(A)
    np.testing.assert_allclose(w, np.linalg.eigvalsh(A), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(v) * np.asarray(w) @ np.asarray(v).T, A, atol=1e-5)
    q, r = lax.linalg.qr(A)
    np.testing.assert_allclose(np.asarray(q) @ np.asarray(r), A, atol=1e-5)
    lu, piv, perm = lax.linalg.lu(A)
    lu2, piv2 = sl.lu_factor(A)
    np.testing.assert_allclose(lu, lu2, rtol=1e-5, atol=1e-6)
    assert np.asarray(piv).tolist() == piv2.tolist() and sorted(np.asarray(perm).tolist()) == [
        0,
        1,
        2,
    ]
    np.testing.assert_allclose(
        lax.linalg.svd(A, compute_uv=False), np.linalg.svd(A, compute_uv=False), rtol=1e-5
    )


@pytest.mark.parametrize("left_side", [True, False])
@pytest.mark.parametrize("transpose_a", [False, True])
def test_triangular_solve(left_side, transpose_a):
    L = np.linalg.cholesky(A)  # noqa: N806
    op = L.T if transpose_a else L
    b = B if left_side else B.T
    x = fflow.jit(
        lambda a, b: lax.linalg.triangular_solve(
            a, b, left_side=left_side, lower=True, transpose_a=transpose_a
        )
    )(L, b)
    got = op @ np.asarray(x) if left_side else np.asarray(x) @ op
    np.testing.assert_allclose(got, b, atol=1e-5)
