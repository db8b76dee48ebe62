# shard_map with a collective (psum) on a one-device mesh, and pmap over one device
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

try:
    from jax import shard_map
except ImportError:
    from jax.experimental.shard_map import shard_map

mesh = Mesh(np.array(jax.devices()[:1]), ("i",))


@partial(shard_map, mesh=mesh, in_specs=(P("i"), P()), out_specs=P())
def global_dot(a, b):
    return jax.lax.psum(jnp.dot(a, b[: a.shape[0]]), "i")


a = jnp.arange(8.0)
pm = jax.pmap(lambda x: x / jax.lax.psum(x, "d"), axis_name="d")(jnp.ones((1, 3)))
result = (
    global_dot(a, jnp.ones(8)),
    pm,
    jax.pmap(lambda x: x**2)(jnp.arange(3.0).reshape(1, 3)),
    jax.vmap(lambda x: x - jax.lax.pmean(x, "b"), axis_name="b")(jnp.arange(4.0)),
    jax.vmap(lambda x: jax.lax.psum(x, "b"), axis_name="b")(jnp.arange(4.0)),
)
