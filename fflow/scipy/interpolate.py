"""`jax.scipy.interpolate.RegularGridInterpolator`: linear or nearest interpolation on a
rectilinear grid (SciPy's class; JAX's subset: no bounds_error, fill_value or None).

Example:
    >>> import fflow.numpy as jnp
    >>> from fflow.scipy.interpolate import RegularGridInterpolator
    >>> f = RegularGridInterpolator((jnp.array([0.0, 1.0]),), jnp.array([0.0, 10.0]))
    >>> f(jnp.array([[0.25], [2.0]])).tolist()
    [2.5, nan]
"""

import itertools

import numpy as np

import fflow.numpy as jnp


class RegularGridInterpolator:
    """Interpolate `values` (grid sizes first, then any trailing value dims) at points
    `xi` of shape (..., ndim); points outside the grid give `fill_value` (None: extrapolate)."""

    def __init__(self, points, values, method="linear", bounds_error=False, fill_value=np.nan):
        if method not in ("linear", "nearest"):
            raise ValueError(
                f"RegularGridInterpolator: method {method!r}; use 'linear' or 'nearest'"
            )
        if bounds_error:
            raise NotImplementedError("bounds_error=True is not supported (as in JAX)")
        self.method, self.fill_value = method, fill_value
        self.grid = tuple(jnp.asarray(p) for p in points)
        values = jnp.asarray(values)
        if not jnp.issubdtype(values.dtype, jnp.inexact):
            values = values.astype(jnp.float32)
        self.values = values

    def __call__(self, xi, method=None):
        method = method or self.method
        ndim = len(self.grid)
        xi = jnp.asarray(xi)
        if xi.shape[-1] != ndim:
            raise ValueError(f"points have {xi.shape[-1]} coordinates, the grid has {ndim} dims")
        shape = xi.shape[:-1]
        xi = jnp.reshape(xi, (-1, ndim)).T
        indices, dists, outside = [], [], jnp.zeros(xi.shape[1], bool)
        for x, g in zip(xi, self.grid):
            i = jnp.clip(jnp.searchsorted(g, x) - 1, 0, g.shape[0] - 2)
            indices.append(i)
            dists.append((x - g[i]) / (g[i + 1] - g[i]))
            outside = outside | (x < g[0]) | (x > g[-1])
        trailing = (slice(None),) + (None,) * (self.values.ndim - ndim)
        if method == "nearest":
            out = self.values[tuple(jnp.where(d <= 0.5, i, i + 1) for i, d in zip(indices, dists))]
        else:
            out = 0.0
            for corner in itertools.product(*((i, i + 1) for i in indices)):
                weight = 1.0
                for c, i, d in zip(corner, indices, dists):
                    weight = weight * jnp.where(c == i, 1 - d, d)
                out = out + self.values[corner] * weight[trailing]
        if self.fill_value is not None:
            out = jnp.where(outside[trailing], self.fill_value, out)
        return jnp.reshape(out, shape + self.values.shape[ndim:])


__all__ = ["RegularGridInterpolator"]
