# JAX "Pseudorandom numbers": explicit keys, split, fold_in, samplers and their shapes,
# vmapped sampling over split keys
import jax
import jax.numpy as jnp
from jax import random

key = random.PRNGKey(42)
key, subkey = random.split(key)
normal = random.normal(subkey, (3,))
k1, k2, k3 = random.split(key, 3)
folded = random.fold_in(key, 7)
keys = random.split(key, 4)
batched = jax.vmap(lambda k: random.uniform(k, (2,)))(keys)
result = (
    key,
    normal,
    random.uniform(k1, (2, 2), minval=-1.0, maxval=1.0),
    random.randint(k2, (5,), 0, 10),
    random.bernoulli(k3, 0.3, (6,)),
    random.choice(k1, 10, (3,), replace=False),
    random.choice(k2, jnp.arange(5.0), (4,), p=jnp.array([0.1, 0.2, 0.3, 0.2, 0.2])),
    random.permutation(k3, 6),
    random.categorical(k1, jnp.log(jnp.array([0.2, 0.5, 0.3])), shape=(5,)),
    random.truncated_normal(k2, -1.0, 1.0, (3,)),
    random.exponential(k3, (2,)),
    random.gamma(k1, 2.0, (2,)),
    random.beta(k2, 2.0, 3.0, (2,)),
    random.dirichlet(k3, jnp.ones(3), (2,)),
    random.laplace(k1, (2,)),
    random.multivariate_normal(k2, jnp.zeros(2), jnp.eye(2), (2,)),
    folded,
    batched,
    random.bits(k1, (2,)),
    random.key_data(random.key(0)),
)
