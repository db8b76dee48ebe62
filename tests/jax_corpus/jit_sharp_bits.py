# The sharp bits: pure functions, in-place updates via .at, out-of-bounds indexing
import jax
import jax.numpy as jnp

x = jnp.arange(5.0)
y = x.at[2].set(10.0)
z = x.at[jnp.array([0, 0, 1])].add(1.0)
w = x.at[1:3].multiply(3.0)
m = x.at[4].min(-1.0)
g = jnp.arange(10.0)
result = (
    x,
    y,
    z,
    w,
    m,
    x.at[3].get(),
    g[11],
    g.at[11].get(mode="fill", fill_value=jnp.nan),
    g.at[11].set(99.0),
    jnp.arange(10)[-1],
    jax.jit(lambda i: g[i])(12),
    jnp.sum(jnp.array([1, 2, 3])),
    jnp.nansum(jnp.array([1.0, jnp.nan])),
)
