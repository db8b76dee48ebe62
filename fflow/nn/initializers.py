"""Initializers: `init(key, shape, dtype=float32)` functions, as `jax.nn.initializers`.

Example:
    >>> import fflow
    >>> from fflow.nn import initializers
    >>> w = initializers.glorot_uniform()(fflow.random.PRNGKey(0), (3, 4))
    >>> w.shape, str(w.dtype)
    ((3, 4), 'float32')
"""

import math

import numpy as np

import fflow.numpy as jnp
from fflow import dtypes, random
from fflow.errors import ShapeError, user_error

__all__ = [
    "zeros",
    "ones",
    "constant",
    "normal",
    "uniform",
    "truncated_normal",
    "variance_scaling",
    "glorot_uniform",
    "glorot_normal",
    "xavier_uniform",
    "xavier_normal",
    "lecun_uniform",
    "lecun_normal",
    "he_uniform",
    "he_normal",
    "kaiming_uniform",
    "kaiming_normal",
    "orthogonal",
]


def _compute_fans(shape, in_axis=-2, out_axis=-1, batch_axis=()):
    if len(shape) <= 1:
        raise user_error(
            ShapeError,
            f"can't compute input and output sizes of a {len(shape)}-dimensional weights "
            "tensor; it must be at least 2-D. Fix: use normal/uniform for biases.",
        )

    def size(axes):
        if isinstance(axes, int):
            return shape[axes]
        return math.prod(shape[i] for i in axes)

    in_size, out_size, batch_size = size(in_axis), size(out_axis), size(batch_axis)
    receptive = math.prod(shape) / in_size / out_size / batch_size
    return in_size * receptive, out_size * receptive


def _init_shape(shape):
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    return tuple(int(d) for d in shape)


def zeros(key, shape, dtype=None):
    return jnp.zeros(_init_shape(shape), dtype or dtypes.float_)


def ones(key, shape, dtype=None):
    return jnp.ones(_init_shape(shape), dtype or dtypes.float_)


def constant(value, dtype=None):
    def init(key, shape, dtype=dtype):
        return jnp.full(_init_shape(shape), value, dtype or dtypes.float_)

    return init


def normal(stddev=1e-2, dtype=None):
    def init(key, shape, dtype=dtype):
        dtype = dtype or dtypes.float_
        return random.normal(key, _init_shape(shape), dtype) * np.asarray(stddev, dtype)

    return init


def uniform(scale=1e-2, dtype=None):
    def init(key, shape, dtype=dtype):
        dtype = dtype or dtypes.float_
        return random.uniform(key, _init_shape(shape), dtype) * np.asarray(scale, dtype)

    return init


def truncated_normal(stddev=1e-2, dtype=None, lower=-2.0, upper=2.0):
    def init(key, shape, dtype=dtype):
        dtype = dtype or dtypes.float_
        sample = random.truncated_normal(key, lower, upper, _init_shape(shape), dtype)
        return sample * np.asarray(stddev, dtype)

    return init


def variance_scaling(scale, mode, distribution, in_axis=-2, out_axis=-1, batch_axis=(), dtype=None):
    """Samples with variance `scale / fan` (fan_in, fan_out or fan_avg)."""

    def init(key, shape, dtype=dtype):
        dtype = dtypes.canonicalize(dtype or dtypes.float_)
        shape = _init_shape(shape)
        fan_in, fan_out = _compute_fans(shape, in_axis, out_axis, batch_axis)
        if mode == "fan_in":
            denominator = fan_in
        elif mode == "fan_out":
            denominator = fan_out
        elif mode == "fan_avg":
            denominator = (fan_in + fan_out) / 2
        else:
            raise ValueError(f"invalid mode for variance scaling initializer: {mode}")
        variance = np.asarray(scale / denominator, dtype=dtype)
        if distribution == "truncated_normal":
            # the stddev of a standard normal truncated to (-2, 2)
            stddev = np.sqrt(variance) / np.asarray(0.87962566103423978, dtype)
            return random.truncated_normal(key, -2, 2, shape, dtype) * stddev.astype(dtype)
        if distribution == "normal":
            return random.normal(key, shape, dtype) * np.sqrt(variance).astype(dtype)
        if distribution == "uniform":
            limit = np.sqrt(3 * variance).astype(dtype)
            return random.uniform(key, shape, dtype, -1) * limit
        raise ValueError(f"invalid distribution for variance scaling initializer: {distribution}")

    return init


def glorot_uniform(in_axis=-2, out_axis=-1, batch_axis=(), dtype=None):
    return variance_scaling(1.0, "fan_avg", "uniform", in_axis, out_axis, batch_axis, dtype)


def glorot_normal(in_axis=-2, out_axis=-1, batch_axis=(), dtype=None):
    return variance_scaling(
        1.0, "fan_avg", "truncated_normal", in_axis, out_axis, batch_axis, dtype
    )


def lecun_uniform(in_axis=-2, out_axis=-1, batch_axis=(), dtype=None):
    return variance_scaling(1.0, "fan_in", "uniform", in_axis, out_axis, batch_axis, dtype)


def lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(), dtype=None):
    return variance_scaling(1.0, "fan_in", "truncated_normal", in_axis, out_axis, batch_axis, dtype)


def he_uniform(in_axis=-2, out_axis=-1, batch_axis=(), dtype=None):
    return variance_scaling(2.0, "fan_in", "uniform", in_axis, out_axis, batch_axis, dtype)


def he_normal(in_axis=-2, out_axis=-1, batch_axis=(), dtype=None):
    return variance_scaling(2.0, "fan_in", "truncated_normal", in_axis, out_axis, batch_axis, dtype)


def orthogonal(scale=1.0, column_axis=-1, dtype=None):
    """Orthogonal matrices (QR of a normal sample, computed eagerly with NumPy)."""

    def init(key, shape, dtype=dtype):
        dtype = dtypes.canonicalize(dtype or dtypes.float_)
        shape = _init_shape(shape)
        if len(shape) < 2:
            raise ValueError("orthogonal initializer requires at least a 2D shape")
        n_rows = math.prod(shape) // shape[column_axis]
        n_cols = shape[column_axis]
        matrix_shape = (n_cols, n_rows) if n_rows < n_cols else (n_rows, n_cols)
        a = np.asarray(random.normal(key, matrix_shape, dtype), np.float64)
        q, r = np.linalg.qr(a)
        q = q * np.sign(np.diag(r))
        if n_rows < n_cols:
            q = q.T
        q = np.moveaxis(
            q.reshape(tuple(np.delete(shape, column_axis)) + (n_cols,)), -1, column_axis
        )
        return jnp.asarray((scale * q).astype(dtype))

    return init


xavier_uniform, xavier_normal = glorot_uniform, glorot_normal
kaiming_uniform, kaiming_normal = he_uniform, he_normal
