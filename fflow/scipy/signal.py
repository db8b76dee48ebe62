"""fflow.scipy.signal: `convolve`, `correlate` (1-D, N-D by direct sums) and
`convolve2d`/`correlate2d`, JAX's `jax.scipy.signal` names.

Example:
    >>> from fflow.scipy.signal import convolve
    >>> convolve([1.0, 2.0, 3.0], [0.0, 1.0, 0.5]).tolist()
    [0.0, 1.0, 2.5, 4.0, 1.5]
"""

import itertools

import fflow.numpy as jnp


def _correlate_nd(a, v, mode):
    a, v = jnp.asarray(a), jnp.asarray(v)
    if a.ndim != v.ndim:
        raise ValueError("correlate: in1 and in2 should have the same dimensionality")
    dtype = jnp.result_type(a, v)
    a, v = a.astype(dtype), v.astype(dtype)
    padded = jnp.pad(a, [(m - 1, m - 1) for m in v.shape])
    full = [n + m - 1 for n, m in zip(a.shape, v.shape)]
    out = jnp.zeros(full, dtype)
    for offs in itertools.product(*[range(m) for m in v.shape]):
        window = padded[tuple(slice(o, o + f) for o, f in zip(offs, full))]
        out = out + window * v[offs]
    if mode == "full":
        return out
    if mode == "same":
        starts = [(m - 1) // 2 for m in v.shape]
        return out[tuple(slice(s, s + n) for s, n in zip(starts, a.shape))]
    if mode == "valid":
        return out[tuple(slice(m - 1, n) for n, m in zip(a.shape, v.shape))]
    raise ValueError(f"mode must be 'full', 'same' or 'valid', got {mode!r}")


def correlate(in1, in2, mode="full", method="auto", precision=None):
    return _correlate_nd(in1, in2, mode)


def convolve(in1, in2, mode="full", method="auto", precision=None):
    in2 = jnp.asarray(in2)
    return _correlate_nd(in1, jnp.flip(in2, axis=tuple(range(in2.ndim))), mode)


def convolve2d(in1, in2, mode="full", boundary="fill", fillvalue=0, precision=None):
    if boundary != "fill" or fillvalue != 0:
        raise NotImplementedError("convolve2d supports boundary='fill', fillvalue=0 only")
    return convolve(in1, in2, mode)


def correlate2d(in1, in2, mode="full", boundary="fill", fillvalue=0, precision=None):
    if boundary != "fill" or fillvalue != 0:
        raise NotImplementedError("correlate2d supports boundary='fill', fillvalue=0 only")
    return correlate(in1, in2, mode)


__all__ = ["convolve", "convolve2d", "correlate", "correlate2d"]
