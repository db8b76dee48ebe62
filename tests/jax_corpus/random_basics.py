# Pseudorandom numbers: keys, split, fold_in and the common samplers
import jax.numpy as jnp
from jax import random

key = random.PRNGKey(42)
k1, k2 = random.split(key)
keys = random.split(k1, 4)
result = (
    random.uniform(k1, (3,)),
    random.normal(k2, (2, 2)),
    random.randint(k1, (5,), 0, 10),
    random.bernoulli(k2, 0.3, (6,)),
    random.permutation(k1, 6),
    random.choice(k2, jnp.arange(10), (3,), replace=False),
    random.categorical(k1, jnp.log(jnp.array([0.1, 0.2, 0.7])), shape=(5,)),
    random.fold_in(key, 7),
    keys,
    random.truncated_normal(k2, -1.0, 1.0, (3,)),
    random.gumbel(k1, (2,)),
    random.exponential(k2, (2,)),
)
