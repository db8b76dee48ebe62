# jax.config: 64-bit mode off by default, then on for one computation
import jax
import jax.numpy as jnp
import numpy as np

default = (
    jnp.array(np.float64(1.5)).dtype.name,
    jnp.arange(3).dtype.name,
    jnp.float_(1).dtype.name,
)
jax.config.update("jax_enable_x64", True)
try:
    wide = (
        jnp.array(np.float64(1.5)).dtype.name,
        jnp.arange(3).dtype.name,
        jnp.ones(2).dtype.name,
        (jnp.ones(2, jnp.float32) + 1.0).dtype.name,
        jnp.sum(jnp.array([1e-10, 1.0], dtype=jnp.float64)),
    )
finally:
    jax.config.update("jax_enable_x64", False)
result = (default, wide, jnp.ones(2).dtype.name, jax.config.jax_enable_x64)
