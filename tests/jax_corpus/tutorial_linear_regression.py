# "JAX 101"-style linear regression trained with plain gradient descent under jit
import jax
import jax.numpy as jnp
import numpy as np

rng = np.random.default_rng(0)
xs = rng.normal(size=(100,))
noise = rng.normal(scale=0.1, size=(100,))
ys = xs * 3 - 1 + noise


def model(theta, x):
    w, b = theta
    return w * x + b


def loss_fn(theta, x, y):
    return jnp.mean((model(theta, x) - y) ** 2)


@jax.jit
def update(theta, x, y, lr=0.1):
    return theta - lr * jax.grad(loss_fn)(theta, x, y)


theta = jnp.array([1.0, 1.0])
for _ in range(100):
    theta = update(theta, xs, ys)
result = (theta, loss_fn(theta, xs, ys), theta.dtype.name)
