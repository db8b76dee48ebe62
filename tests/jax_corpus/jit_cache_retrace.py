# jit caching: Python side effects run once per trace; shapes and dtypes retrace
import jax
import jax.numpy as jnp

traces = []


@jax.jit
def f(x, y):
    traces.append(1)
    return x * y + 1


f(jnp.ones(3), 2.0)
f(jnp.ones(3), 3.0)
f(jnp.ones(4), 3.0)
f(jnp.ones(4, dtype=jnp.int32), 3)
out = f(jnp.arange(3.0), jnp.array([1.0, 2.0, 3.0]))
lowered_text = jax.jit(lambda x: x + 1).lower(jnp.ones(2)).as_text()
result = (
    len(traces),
    out,
    isinstance(lowered_text, str),
    jax.block_until_ready(out),
    jnp.ones(3).block_until_ready(),
)
