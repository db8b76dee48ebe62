# Gaussian-process regression: RBF kernel, Cholesky solve, marginal likelihood gradient
import jax
import jax.numpy as jnp
from jax.scipy.linalg import cho_factor, cho_solve

X = jnp.linspace(0, 1, 8)[:, None]
y = jnp.sin(6 * X[:, 0])
Xs = jnp.array([[0.25], [0.75]])


def kernel(a, b, ls):
    d = jnp.sum((a[:, None] - b[None]) ** 2, -1)
    return jnp.exp(-0.5 * d / ls**2)


def nll(log_ls):
    ls = jnp.exp(log_ls)
    K = kernel(X, X, ls) + 1e-2 * jnp.eye(8)
    c = cho_factor(K, lower=True)
    alpha = cho_solve(c, y)
    return 0.5 * y @ alpha + jnp.sum(jnp.log(jnp.diag(c[0])))


ls = 0.2
K = kernel(X, X, ls) + 1e-2 * jnp.eye(8)
mean = kernel(Xs, X, ls) @ jnp.linalg.solve(K, y)
result = (mean, nll(jnp.log(0.2)), jax.grad(nll)(jnp.log(0.2)))
