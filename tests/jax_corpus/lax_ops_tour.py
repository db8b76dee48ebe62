# jax.lax directly (the "jax.lax" API page): dot_general with dimension numbers,
# broadcast_in_dim, dynamic_slice / dynamic_update_slice under jit, reduce, pad with
# interior padding, gather-free indexing helpers, sort with several operands, clamp
import jax
import jax.numpy as jnp
from jax import lax

a = jnp.arange(24.0).reshape(2, 3, 4)
b = jnp.arange(24.0).reshape(2, 4, 3)
x = jnp.arange(10.0)
result = (
    lax.dot_general(a, b, (((2,), (1,)), ((0,), (0,)))),
    lax.broadcast_in_dim(jnp.arange(3.0), (2, 3), (1,)),
    jax.jit(lambda x, i: lax.dynamic_slice(x, (i,), (3,)))(x, 8),
    jax.jit(lambda x, i: lax.dynamic_update_slice(x, jnp.ones(2), (i,)))(x, 4),
    lax.reduce(a, 0.0, lax.add, (0, 2)),
    lax.reduce(a, -jnp.inf, lax.max, (1,)),
    lax.pad(jnp.arange(3.0), 0.0, [(1, 2, 1)]),
    lax.sort((jnp.array([3, 1, 2]), jnp.array([10.0, 20.0, 30.0])), num_keys=1),
    lax.clamp(0.0, jnp.array([-1.0, 0.5, 2.0]), 1.0),
    lax.rsqrt(jnp.array([4.0, 16.0])),
    lax.integer_pow(jnp.array([2.0, 3.0]), 3),
    lax.expand_dims(x, (0,)).shape,
    lax.rev(x, (0,))[:3],
    lax.cumsum(x, reverse=True)[:3],
    lax.dynamic_index_in_dim(a, 1, axis=1, keepdims=False).shape,
    lax.iota(jnp.int32, 4),
    lax.squeeze(jnp.ones((1, 3, 1)), (0, 2)).shape,
    lax.concatenate([x[:2], x[-2:]], 0),
    lax.select_n(jnp.array([0, 1, 2]), jnp.zeros(3), jnp.ones(3), jnp.full(3, 2.0)),
    lax.sign(jnp.array([-2.0, 0.0, 3.0])),
    lax.erf_inv(jnp.array([0.0, 0.5])),
)
