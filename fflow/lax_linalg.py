"""`jax.lax.linalg` (reached as `fflow.lax.linalg`): the decompositions with lax's
signatures and result orders, over fflow.numpy.linalg / fflow.scipy.linalg.

Example:
    >>> import fflow.numpy as jnp
    >>> from fflow import lax
    >>> v, w = lax.linalg.eigh(jnp.array([[2.0, 0.0], [0.0, 1.0]]))
    >>> w.tolist()
    [1.0, 2.0]
"""

import fflow.numpy as jnp
from fflow.scipy import linalg as _sl


def cholesky(x, *, symmetrize_input=True):
    """The lower Cholesky factor."""
    return jnp.linalg.cholesky(x, symmetrize_input=symmetrize_input)


def eigh(x, *, lower=True, symmetrize_input=True, sort_eigenvalues=True, subset_by_index=None):
    """(eigenvectors, eigenvalues): lax's order, the reverse of jnp.linalg.eigh's."""
    w, v = jnp.linalg.eigh(x, UPLO="L" if lower else "U", symmetrize_input=symmetrize_input)
    return v, w


def qr(x, *, pivoting=False, full_matrices=True, use_magma=None):
    """(q, r); full_matrices=True gives the complete q (as lax.linalg.qr's default)."""
    return jnp.linalg.qr(x, mode="complete" if full_matrices else "reduced")


def svd(x, *, full_matrices=True, compute_uv=True, subset_by_index=None, algorithm=None):
    return jnp.linalg.svd(x, full_matrices=full_matrices, compute_uv=compute_uv)


def lu(x):
    """(lu, pivots, permutation) as lax.linalg.lu."""
    return _sl._lu_packed(x)


def triangular_solve(a, b, *, left_side=False, lower=False, transpose_a=False,
                     conjugate_a=False, unit_diagonal=False):  # fmt: skip
    """Solve op(a) x = b (left_side) or x op(a) = b, op = transpose / conjugate as asked."""
    if conjugate_a and not transpose_a:
        a = jnp.conj(a)
    trans = 0 if not transpose_a else (2 if conjugate_a else 1)
    if left_side:
        return _sl.solve_triangular(a, b, trans=trans, lower=lower, unit_diagonal=unit_diagonal)
    # x op(a) = b  <=>  op(a)^T x^T = b^T
    flipped = {0: 1, 1: 0, 2: 0}[trans]
    if trans == 2:
        a = jnp.conj(a)
    xt = _sl.solve_triangular(a, jnp.swapaxes(b, -1, -2), trans=flipped, lower=lower,
                              unit_diagonal=unit_diagonal)  # fmt: skip
    return jnp.swapaxes(xt, -1, -2)


__all__ = ["cholesky", "eigh", "lu", "qr", "svd", "triangular_solve"]
