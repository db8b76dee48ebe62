# A jax.numpy tour of NumPy-style routines a port uses: meshgrid, linspace/logspace,
# histogram, interp, polyfit/polyval, roll, tril/triu, kron, outer, cross, trapezoid,
# nan-aware reductions, round/floor_divide, where with one argument (static size)
import jax.numpy as jnp

x = jnp.linspace(0.0, 1.0, 5)
X, Y = jnp.meshgrid(jnp.arange(3.0), jnp.arange(2.0))
a = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 10.0]])
result = (
    X,
    Y,
    jnp.logspace(0.0, 2.0, 3),
    jnp.histogram(jnp.array([0.1, 0.4, 0.45, 0.8, 0.9]), bins=3, range=(0.0, 1.0)),
    jnp.interp(jnp.array([0.25, 0.6]), x, x**2),
    jnp.polyval(jnp.polyfit(x, 3 * x**2 - x + 1, 2), 0.5),
    jnp.roll(jnp.arange(5), 2),
    jnp.tril(a, -1),
    jnp.triu(a),
    jnp.kron(jnp.eye(2), jnp.ones((2, 2))),
    jnp.outer(jnp.arange(3.0), jnp.arange(2.0)),
    jnp.cross(jnp.array([1.0, 0.0, 0.0]), jnp.array([0.0, 1.0, 0.0])),
    jnp.trapezoid(x**2, x),
    jnp.nanmean(jnp.array([1.0, jnp.nan, 3.0])),
    jnp.nanmax(jnp.array([jnp.nan, 2.0])),
    jnp.round(jnp.array([0.5, 1.5, 2.567]), 1),
    jnp.floor_divide(jnp.array([-7, 7]), 2),
    jnp.where(jnp.array([0, 3, 0, 5]) > 0, size=3, fill_value=-1),
    jnp.diff(jnp.array([1.0, 4.0, 9.0, 16.0]), n=2),
    jnp.cumprod(jnp.array([1.0, 2.0, 3.0])),
    jnp.argwhere(a > 5),
    jnp.trace(a),
    jnp.diag(a, 1),
    jnp.fliplr(a)[0],
    jnp.rot90(a)[0],
    jnp.allclose(a @ jnp.linalg.inv(a), jnp.eye(3), atol=1e-5),
    jnp.vander(jnp.array([1.0, 2.0]), 3),
    jnp.array_split(jnp.arange(7), 3)[1],
)
