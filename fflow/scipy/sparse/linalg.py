"""`jax.scipy.sparse.linalg.cg`: conjugate gradients for a symmetric positive definite
operator given as a matrix or a function, on arrays or pytrees, with JAX's stopping rule
(||r||^2 <= max(tol^2 ||b||^2, atol^2), at most `maxiter` = 10 * size steps) and
preconditioner `M`, so it takes JAX's steps and gives its numbers. Runs under jit and vmap
(the loop is a `while_loop`; reverse-mode gradients through it are not provided).

Example:
    >>> import fflow.numpy as jnp
    >>> from fflow.scipy.sparse.linalg import cg
    >>> A = jnp.array([[4.0, 1.0], [1.0, 3.0]])
    >>> x, info = cg(A, jnp.array([1.0, 2.0]))
    >>> [round(float(v), 4) for v in x]
    [0.0909, 0.6364]
"""

import fflow.numpy as jnp
from fflow import lax
from fflow.tree_util import tree_leaves, tree_map


def _vdot_real(x, y):
    return sum(jnp.vdot(a, b).real for a, b in zip(tree_leaves(x), tree_leaves(y)))


def _as_op(a):
    if callable(a):
        return a
    return lambda x: tree_map(lambda v: jnp.matmul(a, v), x)


def cg(A, b, x0=None, *, tol=1e-5, atol=0.0, maxiter=None, M=None):  # noqa: N803 (SciPy's names)
    """Solve A x = b for symmetric positive definite A; returns (x, None) as JAX's."""
    if x0 is None:
        x0 = tree_map(jnp.zeros_like, b)
    if maxiter is None:
        maxiter = 10 * sum(jnp.size(v) for v in tree_leaves(b))
    A, identity = _as_op(A), M is None  # noqa: N806
    M = (lambda x: x) if identity else _as_op(M)  # noqa: N806
    bs = _vdot_real(b, b)
    atol2 = jnp.maximum(jnp.square(tol) * bs, jnp.square(atol))
    r0 = tree_map(jnp.subtract, b, A(x0))
    p0 = z0 = M(r0)
    dtype = jnp.result_type(*tree_leaves(p0))
    gamma0 = _vdot_real(r0, z0).astype(dtype)

    def cond(value):
        _, r, gamma, _, k = value
        rs = gamma.real if identity else _vdot_real(r, r)
        return (rs > atol2) & (k < maxiter)

    def body(value):
        x, r, gamma, p, k = value
        ap = A(p)
        alpha = gamma / _vdot_real(p, ap).astype(dtype)
        x = tree_map(lambda a, b: a + alpha * b, x, p)
        r = tree_map(lambda a, b: a - alpha * b, r, ap)
        z = M(r)
        gamma_new = _vdot_real(r, z).astype(dtype)
        beta = gamma_new / gamma
        p = tree_map(lambda a, b: a + beta * b, z, p)
        return x, r, gamma_new, p, k + 1

    x, *_ = lax.while_loop(cond, body, (x0, r0, gamma0, p0, 0))
    return x, None


__all__ = ["cg"]
