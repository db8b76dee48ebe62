# jax.numpy as a NumPy replacement: creation, reductions, indexing, sorting
import jax.numpy as jnp
import numpy as np

x = jnp.arange(12).reshape(3, 4)
f = jnp.linspace(0, 1, 5)
result = (
    x.sum(axis=0),
    x.mean(),
    jnp.cumsum(x, axis=1),
    x[1:, ::2],
    x[jnp.array([0, 2])],
    x[x > 5],
    jnp.where(x % 2 == 0, x, -1),
    jnp.argsort(jnp.array([3, 1, 2])),
    jnp.sort(jnp.array([3.0, -1.0, 2.0])),
    jnp.concatenate([f, f[::-1]]),
    jnp.stack([f, f], axis=1).shape,
    jnp.pad(jnp.ones(2), (1, 2)),
    jnp.eye(3, k=1),
    jnp.tile(jnp.array([1, 2]), 2),
    jnp.maximum(f, 0.5),
    jnp.allclose(f, np.linspace(0, 1, 5)),
    jnp.array(np.float64(2.5)).dtype.name,
    jnp.zeros((2,), dtype=jnp.int64).dtype.name,
    jnp.clip(x, 2, 8),
    jnp.argmax(x, axis=1),
    jnp.unique(jnp.array([3, 1, 3, 2]), size=4, fill_value=0),
    jnp.round(jnp.array([1.25, 2.5, -0.5]), 1),
)
