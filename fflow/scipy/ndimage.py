"""`jax.scipy.ndimage.map_coordinates`: values of an array at fractional coordinates,
order 0 (nearest) or 1 (linear), modes "constant" (cval), "nearest", "wrap", "mirror",
"reflect" (SciPy's meanings; JAX supports the same subset).

Example:
    >>> import fflow.numpy as jnp
    >>> from fflow.scipy.ndimage import map_coordinates
    >>> x = jnp.arange(12.0).reshape(4, 3)
    >>> map_coordinates(x, [jnp.array([0.5, 2.0]), jnp.array([0.5, 1.0])], order=1).tolist()
    [2.0, 7.0]
"""

import itertools

import fflow.numpy as jnp


def _fix_index(index, size, mode):
    if mode == "nearest":
        return jnp.clip(index, 0, size - 1)
    if mode == "wrap":
        return index % size
    if mode == "mirror":  # period 2(n - 1): the edge sample is not repeated
        s = max(size - 1, 1)
        return jnp.abs((index + s) % (2 * s) - s)
    if mode == "reflect":  # period 2n: the edge sample repeats
        return jnp.floor_divide(_fix_index(2 * index + 1, 2 * size + 1, "mirror") - 1, 2)
    return index  # "constant": out-of-range corners take cval


def _corners(coordinate, order):
    if order == 0:
        return [(jnp.floor(coordinate + 0.5).astype(jnp.int32), 1)]
    lower = jnp.floor(coordinate)
    upper_weight = coordinate - lower
    lower = lower.astype(jnp.int32)
    return [(lower, 1 - upper_weight), (lower + 1, upper_weight)]


def map_coordinates(input, coordinates, order, mode="constant", cval=0.0):  # noqa: A002
    """input[coordinates] interpolated (`coordinates`: one array per input dimension)."""
    x = jnp.asarray(input)
    coordinates = [jnp.asarray(c) for c in coordinates]
    if len(coordinates) != x.ndim:
        raise ValueError(
            f"map_coordinates: {len(coordinates)} coordinate arrays for a {x.ndim}-D input. "
            f"Fix: one array of coordinates per input dimension."
        )
    if order not in (0, 1):
        raise NotImplementedError(f"map_coordinates supports order 0 and 1 (as JAX), got {order}")
    if mode not in ("constant", "nearest", "wrap", "mirror", "reflect"):
        raise ValueError(f"map_coordinates: unknown mode {mode!r}")
    dtype = x.dtype if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.float32
    coordinates = [c.astype(dtype) for c in coordinates]
    out = 0.0
    for corner in itertools.product(*[_corners(c, order) for c in coordinates]):
        indices = [_fix_index(i, n, mode) for (i, _), n in zip(corner, x.shape)]
        valid = True
        if mode == "constant":
            for i, n in zip(indices, x.shape):
                valid = valid & (i >= 0) & (i < n)
        safe = tuple(jnp.clip(i, 0, n - 1) for i, n in zip(indices, x.shape))
        value = jnp.where(valid, x[safe].astype(dtype), cval)
        weight = 1
        for _, w in corner:
            weight = weight * w
        out = out + weight * value
    if jnp.issubdtype(x.dtype, jnp.integer):  # integers round half away from zero, as JAX
        out = (jnp.sign(out) * jnp.floor(jnp.abs(out) + 0.5)).astype(x.dtype)
    return jnp.asarray(out).astype(dtype) if not jnp.issubdtype(x.dtype, jnp.integer) else out


__all__ = ["map_coordinates"]
