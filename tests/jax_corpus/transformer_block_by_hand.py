# A pre-norm transformer block written with jax.nn and initializers: layer norm, causal
# multi-head attention via einsum and via jax.nn.dot_product_attention, GELU MLP, grads
import jax
import jax.numpy as jnp

B, T, D, H = 2, 5, 16, 4
init = jax.nn.initializers.glorot_normal()
key = jax.random.PRNGKey(7)
keys = jax.random.split(key, 6)
params = {
    "wq": init(keys[0], (D, D)),
    "wk": init(keys[1], (D, D)),
    "wv": init(keys[2], (D, D)),
    "wo": init(keys[3], (D, D)),
    "w1": jax.nn.initializers.he_normal()(keys[4], (D, 4 * D)),
    "w2": jax.nn.initializers.lecun_normal()(keys[5], (4 * D, D)),
    "g1": jnp.ones(D),
    "b1": jnp.zeros(D),
    "g2": jnp.ones(D),
    "b2": jnp.zeros(D),
}


def layer_norm(x, g, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + eps) * g + b


def attention(p, x, fused=False):
    q = (x @ p["wq"]).reshape(B, T, H, D // H)
    k = (x @ p["wk"]).reshape(B, T, H, D // H)
    v = (x @ p["wv"]).reshape(B, T, H, D // H)
    if fused:
        o = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    else:
        s = jnp.einsum("bthd,bshd->bhts", q, k) / jnp.sqrt(D // H)
        mask = jnp.tril(jnp.ones((T, T), bool))
        s = jnp.where(mask, s, -jnp.inf)
        o = jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(s, axis=-1), v)
    return o.reshape(B, T, D) @ p["wo"]


def block(p, x, fused=False):
    x = x + attention(p, layer_norm(x, p["g1"], p["b1"]), fused)
    h = jax.nn.gelu(layer_norm(x, p["g2"], p["b2"]) @ p["w1"])
    return x + h @ p["w2"]


x = jax.random.normal(jax.random.PRNGKey(1), (B, T, D))
y = jax.jit(block)(params, x)
y_fused = jax.jit(block, static_argnums=2)(params, x, True)
loss = lambda p: jnp.mean(block(p, x) ** 2)
grads = jax.jit(jax.grad(loss))(params)
result = (
    y[0, :2, :4],
    jnp.abs(y - y_fused).max() < 1e-4,
    loss(params),
    grads["wq"][:2, :3],
    grads["g2"][:4],
    jax.nn.log_softmax(jnp.array([1.0, 2.0, 3.0])),
    jax.nn.gelu(jnp.array([-1.0, 0.5]), approximate=False),
    jax.nn.silu(jnp.array([-1.0, 0.5])),
    params["w1"].std() > 0,
)
