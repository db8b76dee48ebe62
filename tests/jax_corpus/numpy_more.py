# More jax.numpy: meshgrid, take_along_axis, searchsorted, interp, polyval, bincount, vectorize
import jax.numpy as jnp

a = jnp.array([[3.0, 1.0, 2.0], [0.5, 2.5, 1.5]])
gx, gy = jnp.meshgrid(jnp.arange(3), jnp.arange(2))
idx = jnp.argsort(a, axis=1)
vdot = jnp.vectorize(lambda u, v: jnp.dot(u, v), signature="(n),(n)->()")
result = (
    gx,
    gy,
    jnp.take_along_axis(a, idx, axis=1),
    jnp.searchsorted(jnp.array([1.0, 2.0, 3.0]), jnp.array([0.5, 2.0, 2.5])),
    jnp.interp(jnp.array([0.5, 1.5]), jnp.array([0.0, 1.0, 2.0]), jnp.array([0.0, 10.0, 0.0])),
    jnp.polyval(jnp.array([1.0, -2.0, 3.0]), jnp.array([0.0, 2.0])),
    jnp.bincount(jnp.array([0, 1, 1, 3]), length=5),
    vdot(a, jnp.ones(3)),
    a[jnp.ix_(jnp.array([1, 0]), jnp.array([2, 0]))],
    jnp.flip(a, 1),
    jnp.roll(jnp.arange(5), 2),
    jnp.triu(jnp.ones((3, 3))),
    jnp.isclose(a, 1.5),
    jnp.any(a > 2.9),
    jnp.count_nonzero(a > 1),
    jnp.percentile(jnp.arange(10.0), 25.0),
    jnp.median(a, axis=1),
    jnp.var(a, ddof=1),
    jnp.nanmean(jnp.array([1.0, jnp.nan, 3.0])),
    jnp.histogram(jnp.array([0.1, 0.5, 0.6, 0.9]), bins=2, range=(0.0, 1.0))[0],
)
