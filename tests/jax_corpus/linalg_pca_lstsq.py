# Linear algebra tutorial-style: PCA via SVD and eigh, least squares, solves, QR,
# Cholesky solves, norms and determinants
import jax
import jax.numpy as jnp
from jax.scipy.linalg import cho_factor, cho_solve, solve_triangular

key = jax.random.PRNGKey(4)
X = jax.random.normal(key, (20, 3)) @ jnp.array([[2.0, 0.0, 0.0], [0.5, 1.0, 0.0], [0.0, 0.3, 0.2]])
Xc = X - X.mean(0)
U, S, Vt = jnp.linalg.svd(Xc, full_matrices=False)
evals, evecs = jnp.linalg.eigh(Xc.T @ Xc / 19)
A = jnp.array([[4.0, 1.0, 0.5], [1.0, 3.0, 0.2], [0.5, 0.2, 2.0]])
b = jnp.array([1.0, 2.0, 3.0])
coef, res, rank, sv = jnp.linalg.lstsq(X, X @ jnp.array([1.0, -1.0, 2.0]) + 0.5)
q, r = jnp.linalg.qr(A)
c = cho_factor(A)
result = (
    S,
    jnp.abs(Vt[0]),
    evals,
    S**2 / 19,
    coef,
    rank,
    jnp.linalg.solve(A, b),
    cho_solve(c, b),
    solve_triangular(jnp.linalg.cholesky(A), b, lower=True),
    jnp.abs(jnp.diag(r)),
    jnp.linalg.det(A),
    jnp.linalg.slogdet(A),
    jnp.linalg.norm(A, "fro"),
    jnp.linalg.norm(A, 2),
    jnp.linalg.matrix_power(A, 3)[0],
    jnp.linalg.inv(A) @ b,
    jnp.linalg.pinv(X)[:, :2],
    jnp.linalg.cond(A),
    jnp.linalg.matrix_rank(X),
)
