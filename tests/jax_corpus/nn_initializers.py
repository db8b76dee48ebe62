# jax.nn.initializers as libraries use them
import jax
from jax.nn import initializers

key = jax.random.PRNGKey(0)
result = (
    initializers.zeros(key, (2, 3)),
    initializers.ones(key, (2,)),
    initializers.constant(0.5)(key, (2,)),
    initializers.normal(0.02)(key, (3,)),
    initializers.uniform(1.0)(key, (3,)),
    initializers.glorot_uniform()(key, (4, 3)),
    initializers.lecun_normal()(key, (4, 3)),
    initializers.he_normal()(key, (4, 3)).shape,
    initializers.xavier_normal()(key, (3, 3)).dtype.name,
    initializers.truncated_normal(1.0)(key, (3,)),
    initializers.variance_scaling(2.0, "fan_in", "truncated_normal")(key, (5, 2)),
    initializers.orthogonal()(key, (3, 3)) @ initializers.orthogonal()(key, (3, 3)).T,
)
