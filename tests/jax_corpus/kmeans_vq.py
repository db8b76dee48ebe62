# k-means iterations with jax.scipy.cluster.vq.vq for the assignment step and
# segment_sum for the update (the pattern of JAX k-means examples)
import jax
import jax.numpy as jnp
from jax.scipy.cluster.vq import vq

key = jax.random.PRNGKey(4)
k1, k2 = jax.random.split(key)
pts = jnp.concatenate([jax.random.normal(k1, (20, 2)) - 2.0, jax.random.normal(k2, (20, 2)) + 2.0])
centroids = pts[jnp.array([0, 25])]


@jax.jit
def step(centroids):
    codes, dist = vq(pts, centroids)
    sums = jax.ops.segment_sum(pts, codes, num_segments=2)
    counts = jax.ops.segment_sum(jnp.ones(pts.shape[0]), codes, num_segments=2)
    return sums / counts[:, None], dist.mean()


trace = []
for _ in range(5):
    centroids, d = step(centroids)
    trace.append(d)
result = (centroids, jnp.stack(trace), vq(pts[:5], centroids)[0])
