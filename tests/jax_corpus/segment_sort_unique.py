# Segment reductions, sorting and set routines with static sizes (the jit-friendly forms)
import jax
import jax.numpy as jnp

data = jnp.array([5.0, 1.0, 3.0, 2.0, 8.0, 7.0])
seg = jnp.array([0, 0, 1, 1, 1, 2])
x = jnp.array([3, 1, 2, 3, 1, 5, 3])
result = (
    jax.ops.segment_sum(data, seg, num_segments=3),
    jax.ops.segment_max(data, seg, num_segments=3),
    jax.ops.segment_min(data, seg, num_segments=4),
    jnp.bincount(x, length=6),
    jnp.unique(x, size=5, fill_value=-1),
    jnp.unique(x, return_counts=True, size=4),
    jnp.sort(data),
    jnp.argsort(data),
    jnp.searchsorted(jnp.sort(data), jnp.array([2.5, 7.0])),
    jax.lax.top_k(data, 3),
    jnp.cumsum(jnp.bincount(seg, length=3)),
    jax.jit(lambda d, s: jax.ops.segment_sum(d, s, num_segments=3))(data, seg),
    jnp.lexsort((jnp.array([2, 1, 2]), jnp.array([1, 1, 0]))),
    jnp.partition(data, 2)[:2].sort(),
    jnp.nonzero(x > 2, size=4, fill_value=-1),
)
