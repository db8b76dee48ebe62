# Structured control flow: cond, switch, select under jit and vmap
import jax
import jax.numpy as jnp
from jax import lax


def f(pred, x):
    return lax.cond(pred, lambda x: x + 1.0, lambda x: x - 1.0, x)


def g(i, x):
    branches = [lambda x: x * 2, lambda x: jnp.sin(x), lambda x: -x]
    return lax.switch(i, branches, x)


x = jnp.array([1.0, 2.0, 3.0])
result = (
    jax.jit(f)(True, x),
    f(False, x),
    jax.vmap(f)(jnp.array([True, False, True]), x),
    jax.jit(g)(1, x),
    g(5, x),
    jax.vmap(g, in_axes=(0, None))(jnp.array([0, 1, 2]), 2.0),
    jax.grad(lambda x: lax.cond(x > 0, jnp.sin, jnp.cos, x))(0.5),
    lax.select(x > 1.5, x, -x),
)
