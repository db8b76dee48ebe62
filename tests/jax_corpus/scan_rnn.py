# A vanilla RNN unrolled with lax.scan, trained for a few steps with grad
import jax
import jax.numpy as jnp

key = jax.random.PRNGKey(0)
k1, k2, k3, k4 = jax.random.split(key, 4)
hidden, feat, T = 8, 3, 6
params = {
    "Wx": jax.random.normal(k1, (feat, hidden)) * 0.3,
    "Wh": jax.random.normal(k2, (hidden, hidden)) * 0.3,
    "b": jnp.zeros(hidden),
    "out": jax.random.normal(k3, (hidden,)) * 0.3,
}
xs = jax.random.normal(k4, (T, feat))
target = 0.5


def loss(params, xs):
    def cell(h, x):
        h = jnp.tanh(x @ params["Wx"] + h @ params["Wh"] + params["b"])
        return h, h @ params["out"]

    _, outs = jax.lax.scan(cell, jnp.zeros(hidden), xs)
    return jnp.mean((outs - target) ** 2)


step = jax.jit(lambda p, xs: jax.tree.map(lambda a, g: a - 0.1 * g, p, jax.grad(loss)(p, xs)))
losses = []
for _ in range(4):
    losses.append(loss(params, xs))
    params = step(params, xs)
result = (jnp.stack(losses), params["out"])
