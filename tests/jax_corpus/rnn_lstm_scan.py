# An LSTM written by hand over lax.scan (the classic JAX RNN example): gates via one
# matmul, a sequence loss, gradients through time, and a vmapped batch
import jax
import jax.numpy as jnp

H, D, T = 8, 3, 6
key = jax.random.PRNGKey(9)
k1, k2, k3 = jax.random.split(key, 3)
params = {
    "W": jax.random.normal(k1, (D + H, 4 * H)) * 0.2,
    "b": jnp.zeros(4 * H).at[H : 2 * H].set(1.0),  # forget-gate bias 1
    "out": jax.random.normal(k2, (H, 1)) * 0.3,
}


def lstm_cell(params, carry, x):
    h, c = carry
    z = jnp.concatenate([x, h]) @ params["W"] + params["b"]
    i, f, g, o = jnp.split(z, 4)
    c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    h = jax.nn.sigmoid(o) * jnp.tanh(c)
    return (h, c), h


def run(params, xs):
    init = (jnp.zeros(H), jnp.zeros(H))
    _, hs = jax.lax.scan(lambda carry, x: lstm_cell(params, carry, x), init, xs)
    return hs @ params["out"]


xs = jax.random.normal(k3, (4, T, D))
targets = jnp.cumsum(xs[..., :1], axis=1)


def loss(params):
    preds = jax.vmap(run, in_axes=(None, 0))(params, xs)
    return jnp.mean((preds - targets) ** 2)


g = jax.jit(jax.grad(loss))(params)
lr = 0.1
p = params
for _ in range(3):
    p = jax.tree_util.tree_map(lambda a, b: a - lr * b, p, jax.grad(loss)(p))
result = (
    loss(params),
    g["W"][:2, :4],
    g["b"][H : H + 3],
    g["out"][:3, 0],
    loss(p),
    run(params, xs[0])[:3, 0],
)
