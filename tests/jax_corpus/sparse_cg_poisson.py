# Solving a 1-D Poisson system matrix-free with jax.scipy.sparse.linalg.cg: a function
# operator, a Jacobi preconditioner, jit, vmap over right-hand sides, a pytree system
import jax
import jax.numpy as jnp
from jax.scipy.sparse.linalg import cg

n = 12
h = 1.0 / (n + 1)


def laplacian(u):
    padded = jnp.pad(u, 1)
    return (2 * u - padded[:-2] - padded[2:]) / h**2


xs = jnp.linspace(h, 1 - h, n)
f = jnp.sin(jnp.pi * xs)
u, _ = cg(laplacian, f, tol=1e-8)
A = jax.vmap(laplacian)(jnp.eye(n))
jacobi = lambda r: r * (h**2 / 2)  # noqa: E731
u_pre, _ = cg(A, f, M=jacobi, tol=1e-8)
batched = jax.jit(jax.vmap(lambda b: cg(A, b, maxiter=5)[0]))(jnp.stack([f, 2 * f]))
tree_sol, _ = cg(
    lambda t: {"a": 2.0 * t["a"], "b": 3.0 * t["b"]}, {"a": jnp.ones(2), "b": jnp.full(3, 6.0)}
)
result = (u[:4], jnp.abs(u - f / jnp.pi**2).max() < 1e-2, u_pre[:4], batched[:, :3], tree_sol)
