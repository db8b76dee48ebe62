"""Convolutions and pooling over `lax.conv_general_dilated` / `lax.reduce_window`.

Inputs are channels-first, (N, C, *spatial) or unbatched (C, *spatial), weights
(out_channels, in_channels // groups, *kernel), as PyTorch and lax's default layout.

Example:
    >>> import fflow, fflow.numpy as jnp
    >>> from fflow import nn
    >>> conv = nn.Conv2d(3, 8, kernel_size=3, padding=1, key=fflow.random.PRNGKey(0))
    >>> conv(jnp.ones((2, 3, 5, 5))).shape
    (2, 8, 5, 5)
    >>> nn.MaxPool2d(2)(jnp.ones((2, 8, 4, 4))).shape
    (2, 8, 2, 2)
"""

import math

import numpy as np

import fflow.numpy as jnp
from fflow import lax, random
from fflow.errors import user_error
from fflow.nn import initializers as init
from fflow.nn.module import Module, field


def _tuple(v, n, what):
    if isinstance(v, int):
        return (v,) * n
    v = tuple(int(x) for x in v)
    if len(v) != n:
        raise user_error(ValueError, f"{what} needs {n} values, got {v}")
    return v


def _padding(padding, n):
    if isinstance(padding, str):
        return padding.upper()
    if isinstance(padding, int):
        return [(padding, padding)] * n
    return [(p, p) if isinstance(p, int) else tuple(p) for p in padding]


def _batched(x, nsp, layer):
    x = jnp.asarray(x)
    if x.ndim == nsp + 1:
        return x[None], True
    if x.ndim != nsp + 2:
        raise user_error(
            ValueError,
            f"{layer} expects (N, C, {nsp} spatial dims) or (C, spatial...) input, "
            f"got shape {tuple(x.shape)}",
        )
    return x, False


class Conv(Module):
    """An N-d convolution (Conv1d/Conv2d/Conv3d fix N)."""

    weight: object
    bias: object
    num_spatial_dims: int = field(static=True)
    stride: tuple = field(static=True)
    padding: object = field(static=True)
    dilation: tuple = field(static=True)
    groups: int = field(static=True)
    sbp: object = field(static=True)

    def __init__(self, num_spatial_dims, in_channels, out_channels, kernel_size, stride=1,
                 padding=0, dilation=1, groups=1, use_bias=True, *, key, dtype=None,
                 sbp=None):  # fmt: skip
        n = int(num_spatial_dims)
        if in_channels % groups or out_channels % groups:
            raise user_error(
                ValueError,
                f"groups={groups} must divide in_channels={in_channels} and "
                f"out_channels={out_channels}",
            )
        k = _tuple(kernel_size, n, "kernel_size")
        wkey, bkey = random.split(key)
        shape = (out_channels, in_channels // groups) + k
        fan_in = (in_channels // groups) * math.prod(k)
        bound = 1.0 / math.sqrt(fan_in)  # PyTorch's default for weight and bias
        self.weight = init.uniform(2 * bound, dtype)(wkey, shape) - bound
        self.bias = (
            init.uniform(2 * bound, dtype)(bkey, (out_channels,)) - bound if use_bias else None
        )
        self.num_spatial_dims = n
        self.stride = _tuple(stride, n, "stride")
        self.padding = _padding(padding, n)
        self.dilation = _tuple(dilation, n, "dilation")
        self.groups = int(groups)
        self.sbp = sbp

    def __call__(self, x, *, key=None):
        x, unbatched = _batched(x, self.num_spatial_dims, type(self).__name__)
        y = lax.conv_general_dilated(
            x,
            self.weight,
            self.stride,
            self.padding,
            rhs_dilation=self.dilation,
            feature_group_count=self.groups,
        )
        if self.bias is not None:
            y = y + jnp.reshape(self.bias, (1, -1) + (1,) * self.num_spatial_dims)
        return y[0] if unbatched else y

    def param_sbp(self):
        return {"weight": self.sbp}


class Conv1d(Conv):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, use_bias=True, *, key, dtype=None, sbp=None):  # fmt: skip
        super().__init__(1, in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, use_bias, key=key, dtype=dtype, sbp=sbp)  # fmt: skip


class Conv2d(Conv):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, use_bias=True, *, key, dtype=None, sbp=None):  # fmt: skip
        super().__init__(2, in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, use_bias, key=key, dtype=dtype, sbp=sbp)  # fmt: skip


# ----------------------------------------------------------------------------
# Pooling


def _pool(x, nsp, kernel, stride, padding, reducer, init_value, name):
    x, unbatched = _batched(x, nsp, name)
    window = (1, 1) + kernel
    strides = (1, 1) + stride
    pads = padding if isinstance(padding, str) else [(0, 0), (0, 0)] + list(padding)
    y = lax.reduce_window(x, init_value, reducer, window, strides, pads)
    return y, unbatched


def max_pool(x, window_shape, strides=None, padding="VALID"):
    """Max over windows of the spatial dims of (N, C, *spatial) `x` (padding is -inf)."""
    x = jnp.asarray(x)
    nsp = len(window_shape)
    stride = tuple(strides or window_shape)
    pads = _padding(padding, nsp)
    y, unbatched = _pool(x, nsp, tuple(window_shape), stride, pads, lax.max, -np.inf, "max_pool")
    return y[0] if unbatched else y


def avg_pool(x, window_shape, strides=None, padding="VALID", count_include_pad=True):
    """Mean over windows of the spatial dims of (N, C, *spatial) `x`."""
    x = jnp.asarray(x)
    nsp = len(window_shape)
    stride = tuple(strides or window_shape)
    pads = _padding(padding, nsp)
    y, unbatched = _pool(x, nsp, tuple(window_shape), stride, pads, lax.add, 0.0, "avg_pool")
    if count_include_pad or pads == "VALID":
        y = y / math.prod(window_shape)
    else:
        ones = jnp.ones((1, 1) + tuple(x.shape[-nsp:]), x.dtype)
        counts, _ = _pool(ones, nsp, tuple(window_shape), stride, pads, lax.add, 0.0, "avg_pool")
        y = y / counts
    return y[0] if unbatched else y


class _Pool(Module):
    kernel_size: tuple = field(static=True)
    stride: tuple = field(static=True)
    padding: object = field(static=True)

    def __init__(self, kernel_size, stride=None, padding=0):
        n = self._nsp
        self.kernel_size = _tuple(kernel_size, n, "kernel_size")
        self.stride = _tuple(stride, n, "stride") if stride is not None else self.kernel_size
        self.padding = _padding(padding, n)


class MaxPool1d(_Pool):
    _nsp = 1

    def __call__(self, x, *, key=None):
        return max_pool(x, self.kernel_size, self.stride, self.padding)


class MaxPool2d(_Pool):
    _nsp = 2

    def __call__(self, x, *, key=None):
        return max_pool(x, self.kernel_size, self.stride, self.padding)


class AvgPool1d(_Pool):
    _nsp = 1

    def __call__(self, x, *, key=None):
        return avg_pool(x, self.kernel_size, self.stride, self.padding)


class AvgPool2d(_Pool):
    _nsp = 2

    def __call__(self, x, *, key=None):
        return avg_pool(x, self.kernel_size, self.stride, self.padding)
