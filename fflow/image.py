"""`fflow.image.resize` (JAX's `jax.image.resize`): resampling by separable kernels.

Each resized dimension is a contraction with a weight matrix: output sample j sits at
input position (j + 0.5) / scale - 0.5; its weights are the kernel at the distances to
the input samples (stretched by 1 / scale when shrinking and `antialias`), normalised to
sum to 1; samples outside the input get no weight. Methods: "nearest", "linear"
("bilinear", "trilinear", "triangle"), "cubic" (Keys, a = -0.5), "lanczos3", "lanczos5".

Example:
    >>> import fflow.numpy as jnp
    >>> from fflow.image import resize
    >>> resize(jnp.array([0.0, 1.0]), (4,), "linear").tolist()
    [0.0, 0.25, 0.75, 1.0]
"""

import numpy as np

import fflow.numpy as jnp


def _triangle(x):
    return jnp.maximum(0.0, 1.0 - x)


def _keys_cubic(x, a=-0.5):
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    far = ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
    return jnp.where(x >= 2.0, 0.0, jnp.where(x >= 1.0, far, near))


def _lanczos(radius):
    def kernel(x):
        y = radius * jnp.sin(np.pi * x) * jnp.sin(np.pi * x / radius)
        out = jnp.where(x > 1e-3, y / jnp.where(x != 0, np.pi**2 * x**2, 1.0), 1.0)
        return jnp.where(x > radius, 0.0, out)

    return kernel


_KERNELS = {
    "linear": _triangle, "bilinear": _triangle, "trilinear": _triangle, "triangle": _triangle,
    "cubic": _keys_cubic, "bicubic": _keys_cubic, "tricubic": _keys_cubic,
    "lanczos3": _lanczos(3.0), "lanczos5": _lanczos(5.0),
}  # fmt: skip


def _weights(n_in, n_out, kernel, antialias, dtype):
    scale = n_out / n_in
    kernel_scale = max(1.0 / scale, 1.0) if antialias else 1.0
    sample = (jnp.arange(n_out, dtype=dtype) + 0.5) / scale - 0.5
    dist = jnp.abs(sample[None, :] - jnp.arange(n_in, dtype=dtype)[:, None]) / kernel_scale
    w = kernel(dist)
    total = jnp.sum(w, axis=0, keepdims=True)
    eps = 1000.0 * float(np.finfo(np.float32).eps)
    w = jnp.where(jnp.abs(total) > eps, w / jnp.where(total != 0, total, 1.0), 0.0)
    inside = (sample >= -0.5) & (sample <= n_in - 0.5)
    return jnp.where(inside[None, :], w, 0.0)


def _resize_nearest(x, shape):
    for d, (m, n) in enumerate(zip(x.shape, shape)):
        if m != n:
            idx = jnp.floor((jnp.arange(n, dtype=np.float32) + 0.5) * m / n).astype(np.int32)
            x = jnp.take(x, idx, axis=d)
    return x


def resize(image, shape, method, antialias=True, precision=None):
    """`image` resampled to `shape` (every dimension whose size changes) by `method`."""
    image = jnp.asarray(image)
    shape = tuple(int(d) for d in shape)
    if len(shape) != image.ndim:
        raise ValueError(
            f"resize: shape {shape} must have one entry per dimension of the image "
            f"{image.shape}. Fix: include the batch / channel sizes unchanged."
        )
    method = getattr(method, "name", method).lower()
    if method == "nearest":
        return _resize_nearest(image, shape)
    if method not in _KERNELS:
        raise ValueError(f"resize: unknown method {method!r}; use one of {sorted(_KERNELS)}")
    dtype = image.dtype if jnp.issubdtype(image.dtype, jnp.inexact) else jnp.float32
    x = image.astype(dtype)
    for d, (m, n) in enumerate(zip(image.shape, shape)):
        if m != n:
            w = _weights(m, n, _KERNELS[method], antialias, dtype)
            x = jnp.moveaxis(jnp.tensordot(x, w, axes=((d,), (0,))), -1, d)
    return x  # integer images come back as float32, as JAX's


__all__ = ["resize"]
