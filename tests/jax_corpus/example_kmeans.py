# k-means with jit and lax.fori_loop on a fixed toy data set
import jax
import jax.numpy as jnp

key = jax.random.PRNGKey(7)
k1, k2 = jax.random.split(key)
pts = jnp.concatenate([jax.random.normal(k1, (20, 2)) + 3, jax.random.normal(k2, (20, 2)) - 3])
centers0 = pts[jnp.array([0, 25])]


@jax.jit
def kmeans(centers):
    def body(_, centers):
        d = jnp.sum((pts[:, None, :] - centers[None]) ** 2, -1)
        assign = jnp.argmin(d, axis=1)
        onehot = jax.nn.one_hot(assign, 2)
        return (onehot.T @ pts) / onehot.sum(0)[:, None]

    return jax.lax.fori_loop(0, 5, body, centers)


c = kmeans(centers0)
result = (c, jnp.argmin(jnp.sum((pts[:, None] - c[None]) ** 2, -1), 1).sum())
