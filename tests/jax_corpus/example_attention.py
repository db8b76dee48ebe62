# A single-head self-attention block with layer norm, vmapped over a batch
import jax
import jax.numpy as jnp

key = jax.random.PRNGKey(0)
ks = jax.random.split(key, 5)
d, T = 8, 4
params = {n: jax.random.normal(k, (d, d)) / jnp.sqrt(d) for n, k in zip("qkvo", ks[:4])}
x = jax.random.normal(ks[4], (2, T, d))


def layer_norm(x, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + eps)


def attend(p, x):
    h = layer_norm(x)
    q, k, v = h @ p["q"], h @ p["k"], h @ p["v"]
    mask = jnp.tril(jnp.ones((T, T), bool))
    s = jnp.where(mask, q @ k.T / jnp.sqrt(d), -1e9)
    return x + jax.nn.softmax(s, axis=-1) @ v @ p["o"]


out = jax.vmap(attend, in_axes=(None, 0))(params, x)
g = jax.grad(lambda p: jax.vmap(attend, (None, 0))(p, x).sum())(params)
result = (
    out[0, 0],
    out.shape,
    g["q"][0, :3],
    jax.nn.dot_product_attention(x, x, x, is_causal=True)[1, 2, :3],
)
