# lax.associative_scan, lax.map, lax.reduce_precision-free helpers, cumulative ops
import jax
import jax.numpy as jnp
from jax import lax

xs = jnp.arange(1.0, 7.0)
result = (
    lax.associative_scan(jnp.add, xs),
    lax.associative_scan(jnp.multiply, xs, reverse=True),
    lax.map(lambda x: x**2 + 1, xs),
    lax.cummax(jnp.array([1.0, 3.0, 2.0, 5.0])),
    lax.cumprod(xs),
    jnp.cumprod(xs),
    jnp.diff(xs**2),
    lax.scan(lambda c, x: (c * x, c), 1.0, xs)[1],
    jax.lax.fori_loop(0, 5, lambda i, x: x.at[i].set(i * 2.0), jnp.zeros(5)),
)
