# Mixed precision by hand: bfloat16 compute with float32 master weights, casts in and out,
# a loss-scaled gradient, and dtype checks of bf16 arithmetic
import jax
import jax.numpy as jnp

key = jax.random.PRNGKey(8)
k1, k2 = jax.random.split(key)
params = {"w": jax.random.normal(k1, (4, 3)), "b": jnp.zeros(3)}
x = jax.random.normal(k2, (5, 4))


def forward(p, x):
    p16 = jax.tree_util.tree_map(lambda a: a.astype(jnp.bfloat16), p)
    y = jnp.tanh(x.astype(jnp.bfloat16) @ p16["w"] + p16["b"])
    return y.astype(jnp.float32)


def loss(p, x, scale=128.0):
    return jnp.mean(forward(p, x) ** 2) * scale


g = jax.grad(loss)(params, x)
g = jax.tree_util.tree_map(lambda a: a / 128.0, g)
h = jnp.ones(3, jnp.bfloat16) * 1.1
result = (
    forward(params, x)[0],
    g["w"].dtype.name,
    g["b"],
    (h + 1).dtype.name,
    (h * jnp.float32(2)).dtype.name,
    h.astype(jnp.float32),
    jnp.asarray(1 / 3, jnp.bfloat16).astype(jnp.float32),
    jnp.finfo(jnp.bfloat16).eps,
    jax.jit(lambda a: a @ a.T)(jnp.ones((2, 2), jnp.bfloat16)),
)
