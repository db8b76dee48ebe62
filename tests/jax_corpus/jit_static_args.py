# jit with static_argnums / static_argnames, and functools.partial
from functools import partial

import jax
import jax.numpy as jnp


@partial(jax.jit, static_argnums=(1,))
def power(x, n):
    out = x
    for _ in range(n - 1):
        out = out * x
    return out


@partial(jax.jit, static_argnames=["mode"])
def norm(x, mode="l2"):
    if mode == "l2":
        return jnp.sqrt(jnp.sum(x**2))
    return jnp.sum(jnp.abs(x))


def g(x, n):
    i = 0
    while i < n:
        i += 1
    return x + i


x = jnp.array([1.0, -2.0, 3.0])
result = (
    power(x, 3),
    norm(x),
    norm(x, mode="l1"),
    jax.jit(g, static_argnames=["n"])(10.0, n=5),
    jax.jit(lambda x, *, k: x * k, static_argnames="k")(x, k=2),
    jax.jit(jnp.reshape, static_argnums=1)(jnp.arange(6), (2, 3)),
)
