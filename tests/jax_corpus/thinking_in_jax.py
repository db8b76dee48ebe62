# JAX "How to think in JAX": immutable updates, lax vs jnp promotion, convolutions,
# jit with static arguments, pure functions and tracing-time side effects
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

x_np = np.linspace(0, 10, 1000)
y_np = 2 * np.sin(x_np) * np.cos(x_np)
x_jnp = jnp.linspace(0, 10, 1000)
y_jnp = 2 * jnp.sin(x_jnp) * jnp.cos(x_jnp)

x = jnp.arange(10)
y = x.at[0].set(10)
promoted = jnp.add(1, 1.0)
lax_explicit = lax.add(jnp.float32(1), 1.0)
conv = jnp.convolve(jnp.array([1, 2, 1]), jnp.array([1, 1, 1]))

xc = jnp.array([1, 2, 1], dtype=jnp.float32)
yc = jnp.array([1, 1, 1], dtype=jnp.float32)
lconv = lax.conv_general_dilated(
    xc.reshape(1, 1, 3),
    yc.reshape(1, 1, 3),
    window_strides=(1,),
    padding=[(len(yc) - 1, len(yc) - 1)],
)


def norm(X):
    X = X - X.mean(0)
    return X / X.std(0)


norm_compiled = jax.jit(norm)
X = jnp.array(np.random.RandomState(0).rand(100, 3))


def get_negatives(x):
    return x[x < 0]


@partial(jax.jit, static_argnums=(1,))
def f(x, neg):
    return -x if neg else x


@partial(jax.jit, static_argnames=["n"])
def g(x, n):
    i = 0
    while i < n:
        i += 1
    return x + i


traced = []


@jax.jit
def h(x, y):
    traced.append((x.shape, y.shape))
    return jnp.dot(x + 1, y + 1)


h(jnp.ones((3, 4)), jnp.ones(4))
h(jnp.ones((3, 4)), jnp.ones(4))
h(jnp.ones((2, 4)), jnp.ones(4))


@jax.jit
def f_shape(x):
    return x.reshape((np.prod(x.shape),))


result = (
    float(np.abs(np.asarray(y_jnp) - y_np).max()) < 1e-5,
    y[:3],
    x[:3],
    promoted,
    lax_explicit,
    conv,
    lconv,
    np.allclose(norm_compiled(X), norm(X), atol=1e-6),
    get_negatives(jnp.array([-1.0, 2.0, -3.0])),
    f(1, True),
    f(1, False),
    g(10, 20),
    len(traced),
    f_shape(jnp.ones((2, 3))).shape,
    str(X.dtype),
)
