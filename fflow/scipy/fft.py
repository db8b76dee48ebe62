"""`jax.scipy.fft`: the type-II discrete cosine transform (`dct`, `dctn`) and its inverse
(`idct`, `idctn`), norm None or "ortho", as a matrix product along each axis (SciPy's
definitions: dct(x)[k] = 2 sum_n x[n] cos(pi k (2n + 1) / 2N)).

Example:
    >>> import fflow.numpy as jnp
    >>> from fflow.scipy.fft import dct, idct
    >>> [round(float(v), 4) for v in dct(jnp.array([1.0, 2.0, 3.0]))]
    [12.0, -3.4641, 0.0]
    >>> [round(float(v), 4) for v in idct(dct(jnp.array([1.0, 2.0, 3.0])))]
    [1.0, 2.0, 3.0]
"""

import numpy as np

import fflow.numpy as jnp


def _matrix(n, norm, inverse, dtype):
    k = np.arange(n)[:, None]
    m = 2.0 * np.cos(np.pi * k * (2 * np.arange(n)[None, :] + 1) / (2 * n))  # [k, n]
    if norm == "ortho":
        m = m * np.where(k == 0, np.sqrt(1 / (4 * n)), np.sqrt(1 / (2 * n)))
        m = m.T if inverse else m
    elif norm is None or norm == "backward":
        if inverse:  # x[n] = (y[0] / 2 + sum_k y[k] cos(...)) / N
            m = (m / 2).T / n * np.where(k.T == 0, 0.5, 1.0)
    else:
        raise ValueError(f"dct: norm must be None or 'ortho', got {norm!r}")
    return jnp.asarray(m.astype(dtype))


def _along(x, axis, n, norm, inverse, type):  # noqa: A002 (SciPy's name)
    if type != 2:
        raise NotImplementedError(f"only the type-2 DCT is provided (as in JAX), got type={type}")
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        x = x.astype(jnp.float32)
    axis = axis % x.ndim
    if n is not None and n != x.shape[axis]:
        if n < x.shape[axis]:
            x = jnp.take(x, jnp.arange(n), axis=axis)
        else:
            x = jnp.pad(x, [(0, n - x.shape[axis]) if d == axis else (0, 0) for d in range(x.ndim)])
    m = _matrix(x.shape[axis], norm, inverse, np.dtype(x.dtype))
    return jnp.moveaxis(jnp.tensordot(x, m, axes=((axis,), (1,))), -1, axis)


def dct(x, type=2, n=None, axis=-1, norm=None):  # noqa: A002
    return _along(x, axis, n, norm, False, type)


def idct(x, type=2, n=None, axis=-1, norm=None):  # noqa: A002
    return _along(x, axis, n, norm, True, type)


def dctn(x, type=2, s=None, axes=None, norm=None):  # noqa: A002
    x = jnp.asarray(x)
    axes = range(x.ndim) if axes is None else axes
    for i, axis in enumerate(axes):
        x = dct(x, type, None if s is None else s[i], axis, norm)
    return x


def idctn(x, type=2, s=None, axes=None, norm=None):  # noqa: A002
    x = jnp.asarray(x)
    axes = range(x.ndim) if axes is None else axes
    for i, axis in enumerate(axes):
        x = idct(x, type, None if s is None else s[i], axis, norm)
    return x


__all__ = ["dct", "dctn", "idct", "idctn"]
