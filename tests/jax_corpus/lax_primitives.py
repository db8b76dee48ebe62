# Direct jax.lax ops: dot_general, dynamic_slice, reduce, rsqrt, integer_pow, clamp
import jax.numpy as jnp
from jax import lax

a = jnp.arange(12.0).reshape(3, 4)
b = jnp.ones((4, 2))
result = (
    lax.dot_general(a, b, (((1,), (0,)), ((), ()))),
    lax.dynamic_slice(a, (1, 1), (2, 2)),
    lax.dynamic_update_slice(a, jnp.zeros((1, 2)), (2, 3)),
    lax.dynamic_index_in_dim(a, 1, axis=0, keepdims=False),
    lax.rsqrt(jnp.array([4.0, 16.0])),
    lax.integer_pow(jnp.array([2.0, 3.0]), 3),
    lax.clamp(0.0, jnp.array([-1.0, 0.5, 2.0]), 1.0),
    lax.reduce(a, 0.0, lax.add, (0,)),
    lax.broadcast_in_dim(jnp.arange(3.0), (2, 3), (1,)),
    lax.slice(a, (0, 1), (2, 4), (1, 2)),
    lax.pad(jnp.arange(3.0), 0.0, [(1, 2, 1)]),
    lax.concatenate([a, a], 0).shape,
    lax.convert_element_type(jnp.array([1.7, -1.7]), jnp.int32),
    lax.expand_dims(jnp.arange(3.0), (0,)).shape,
    lax.argmax(a, 1, jnp.int32),
    lax.cumsum(jnp.arange(4.0), reverse=True),
    lax.top_k(jnp.array([1.0, 5.0, 3.0, 4.0]), 2),
    lax.sort(jnp.array([3, 1, 2])),
    lax.rev(jnp.arange(4), (0,)),
    lax.bitcast_convert_type(jnp.float32(1.0), jnp.int32),
    lax.shift_left(jnp.int32(1), jnp.int32(4)),
    lax.population_count(jnp.uint32(255)),
    lax.erf_inv(jnp.array([0.0, 0.5])),
    lax.square(jnp.array([3.0])),
)
