# jax.scipy.linalg (cho_factor/solve, solve_triangular, expm, lu) and signal
import jax.numpy as jnp
import jax.scipy.linalg as jsl
from jax.scipy import signal

a = jnp.array([[4.0, 1.0], [1.0, 3.0]])
b = jnp.array([1.0, 2.0])
c, low = jsl.cho_factor(a)
L = jnp.linalg.cholesky(a)
p, l, u = jsl.lu(a)
result = (
    jsl.cho_solve((c, low), b),
    jsl.solve_triangular(L, b, lower=True),
    jsl.expm(jnp.array([[0.0, 1.0], [-1.0, 0.0]]) * 0.5),
    l @ u,
    jsl.solve(a, b, assume_a="pos"),
    jsl.block_diag(jnp.ones((1, 1)), 2 * jnp.ones((2, 2))),
    signal.convolve(jnp.array([1.0, 2.0, 3.0]), jnp.array([0.0, 1.0, 0.5]), mode="same"),
    signal.convolve2d(jnp.eye(3), jnp.ones((2, 2)), mode="valid"),
    jnp.convolve(jnp.array([1.0, 2.0, 3.0]), jnp.array([1.0, -1.0])),
)
