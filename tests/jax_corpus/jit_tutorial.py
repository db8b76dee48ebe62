# JAX "Just-in-time compilation": jit of a function and a method (static self via partial),
# static_argnums/argnames caching, jit over pytrees, donate and keep_unused, AOT lower
from functools import partial

import jax
import jax.numpy as jnp


def selu(x, alpha=1.67, lambda_=1.05):
    return lambda_ * jnp.where(x > 0, x, alpha * jnp.exp(x) - alpha)


x = jnp.arange(1_000_000.0) / 1e6 - 0.5
selu_jit = jax.jit(selu)


def g(x, n):
    i = 0
    while i < n:
        i += 1
    return x + i


g_jit_correct = jax.jit(g, static_argnames=["n"])


class Scaler:
    def __init__(self, s):
        self.s = s

    @partial(jax.jit, static_argnums=0)
    def apply(self, x):
        return x * self.s


calls = []


def loop_body(prev_i):
    calls.append(1)
    return prev_i + 1


def g_inner_jitted_partial(x, n):
    i = 0
    while i < n:
        i = jax.jit(partial(loop_body))(i)
    return x + i


@jax.jit
def tree_fn(tree):
    return {"sum": tree["a"] + tree["b"][0], "prod": tree["a"] * tree["b"][1]}


lowered = jax.jit(lambda a, b: a @ b + 1).lower(jnp.ones((2, 3)), jnp.ones((3, 4)))
compiled = lowered.compile()
donated = jax.jit(lambda a: a * 2, donate_argnums=0)(jnp.arange(3.0))
result = (
    selu_jit(x)[::250000],
    g_jit_correct(10, 20),
    Scaler(3.0).apply(jnp.arange(3.0)),
    g_inner_jitted_partial(10, 5),
    tree_fn({"a": jnp.arange(3.0), "b": (jnp.ones(3), jnp.full(3, 2.0))}),
    compiled(jnp.ones((2, 3)), jnp.ones((3, 4))),
    donated,
    jax.jit(lambda a, b: a, keep_unused=True)(1.0, 2.0),
    jax.eval_shape(selu, jax.ShapeDtypeStruct((4, 5), jnp.float32)).shape,
)
