# Distributed arrays tutorial on one device: Mesh, NamedSharding, device_put, jit shardings
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

devices = np.array(jax.devices()[:1]).reshape(1, 1)
mesh = Mesh(devices, axis_names=("x", "y"))
sharding = NamedSharding(mesh, P("x", "y"))
x = jax.device_put(jnp.arange(16.0).reshape(4, 4), sharding)
replicated = jax.device_put(jnp.ones(4), NamedSharding(mesh, P()))


@jax.jit
def f(x, v):
    return jnp.tanh(x) @ v


out = jax.jit(
    f, in_shardings=(sharding, NamedSharding(mesh, P())), out_shardings=NamedSharding(mesh, P("x"))
)(x, replicated)
constrained = jax.jit(lambda x: jax.lax.with_sharding_constraint(x * 2, sharding))(x)
result = (
    f(x, replicated),
    out,
    constrained.sum(),
    x.sharding.spec == P("x", "y"),
    len(x.devices()),
    mesh.shape["x"],
    mesh.axis_names,
    jax.device_count() >= 1,
    jax.local_device_count() >= 1,
)
