# jax.scipy.interpolate.RegularGridInterpolator on a 2-D grid (as in the SciPy/JAX docs):
# linear and nearest, points outside the grid, vector-valued data, jit and grad
import jax
import jax.numpy as jnp
from jax.scipy.interpolate import RegularGridInterpolator

x = jnp.linspace(0.0, 2.0, 5)
y = jnp.array([0.0, 0.5, 1.5, 3.0])
xg, yg = jnp.meshgrid(x, y, indexing="ij")
data = jnp.sin(xg) * jnp.cos(yg)
interp = RegularGridInterpolator((x, y), data)
pts = jnp.array([[0.1, 0.2], [1.3, 2.9], [2.0, 3.0], [2.5, 1.0], [0.7, 0.5]])
near = RegularGridInterpolator((x, y), data, method="nearest")
vec = RegularGridInterpolator((x, y), jnp.stack([data, 2 * data], -1), fill_value=None)
result = (
    interp(pts),
    near(pts),
    vec(pts[:3]),
    jax.jit(lambda p: interp(p))(pts[:2]),
    jax.grad(lambda p: interp(p[None])[0])(jnp.array([0.9, 1.1])),
)
