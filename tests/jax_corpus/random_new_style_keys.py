# Typed keys (jax.random.key) and key_data / wrap_key_data round trips
import jax
import jax.numpy as jnp

key = jax.random.key(0)
subkeys = jax.random.split(key, 3)
data = jax.random.key_data(key)
again = jax.random.wrap_key_data(data)
samples = jax.vmap(lambda k: jax.random.normal(k, (2,)))(subkeys)
result = (
    data,
    jax.random.key_data(subkeys),
    jax.random.uniform(again, (2,)),
    samples,
    jax.random.normal(jax.random.fold_in(key, 3), ()),
    jnp.shape(subkeys),
)
