# JAX quickstart: jit a SELU, differentiate a logistic loss, vmap a matvec
import jax
import jax.numpy as jnp
from jax import grad, jit, random, vmap


def selu(x, alpha=1.67, lmbda=1.05):
    return lmbda * jnp.where(x > 0, x, alpha * jnp.exp(x) - alpha)


key = random.key(0)
x = random.normal(key, (1000,))
selu_jit = jit(selu)


def sum_logistic(x):
    return jnp.sum(1.0 / (1.0 + jnp.exp(-x)))


x_small = jnp.arange(3.0)
derivative_fn = grad(sum_logistic)
mat = random.normal(key, (150, 100))
batched_x = random.normal(key, (10, 100))


def apply_matrix(x):
    return jnp.dot(mat, x)


result = (
    selu_jit(x)[:5],
    selu(x).sum(),
    derivative_fn(x_small),
    vmap(apply_matrix)(batched_x)[:2, :3],
    jax.jit(vmap(apply_matrix))(batched_x).shape,
)
