"""fflow.numpy.fft: `jax.numpy.fft` (fft, ifft, rfft, irfft and their 2-D / N-D forms,
fftfreq, rfftfreq, fftshift, ifftshift) over the `fft` primitive.

Example:
    >>> import fflow.numpy as jnp
    >>> jnp.fft.fft(jnp.array([1.0, 0.0, 0.0, 0.0])).tolist()
    [(1+0j), (1+0j), (1+0j), (1+0j)]
"""

import math

import numpy as np

from fflow import dtypes
from fflow import lax_ops as lax
from fflow.array import Array
from fflow.numpy import shapes as _sh
from fflow.numpy._util import info, operand
from fflow.primitives.fft import fft_p


def _as_inexact(a, complex_input):
    a = operand(a)
    d = info(a)[0]
    if complex_input and d.kind != "c":
        target = np.complex128 if d == np.float64 else np.complex64
        return lax.convert_element_type(a, target)
    if not complex_input and not dtypes.is_inexact(d):
        return lax.convert_element_type(a, dtypes.float_)
    return a


def _resize(a, axis, n):
    """Truncate or zero-pad `a` along `axis` to length n (NumPy's `n=` argument)."""
    m = info(a)[2][axis]
    if n == m:
        return a
    if n < m:
        return lax.slice_in_dim(a, 0, n, axis=axis)
    widths = [(0, 0)] * len(info(a)[2])
    widths[axis] = (0, n - m)
    return _sh.pad(a, widths)


def _scale(out, norm, n, forward):
    """NumPy's `norm`: the primitive computes "backward" (1/n on the inverse)."""
    if norm in (None, "backward"):
        return out
    if norm == "ortho":
        factor = 1 / math.sqrt(n) if forward else math.sqrt(n)
    elif norm == "forward":
        factor = 1 / n if forward else n
    else:
        raise ValueError(f"invalid norm {norm!r}: use 'backward', 'ortho' or 'forward'")
    return out * np.asarray(factor, info(out)[0])


def _fftn(a, s, axes, norm, fft_type):
    forward = fft_type in ("fft", "rfft")
    a = _as_inexact(a, complex_input=fft_type in ("fft", "ifft", "irfft"))
    nd = len(info(a)[2])
    if axes is None:
        axes = tuple(range(nd)) if s is None else tuple(range(nd - len(s), nd))
    axes = tuple(ax % nd for ax in axes)
    if s is None:
        shape = info(a)[2]
        s = tuple(shape[ax] for ax in axes)
        if fft_type == "irfft":
            s = s[:-1] + (2 * (shape[axes[-1]] - 1),)
    s = tuple(int(n) for n in s)
    for ax, n in zip(axes, s):
        length = n // 2 + 1 if (fft_type == "irfft" and ax == axes[-1]) else n
        a = _resize(a, ax, length)
    k = len(axes)
    moved = _sh.moveaxis(a, axes, tuple(range(nd - k, nd)))
    out = fft_p.bind(moved, fft_type=fft_type, fft_lengths=s)
    out = _sh.moveaxis(out, tuple(range(nd - k, nd)), axes)
    return _scale(out, norm, int(np.prod(s)), forward)


def fft(a, n=None, axis=-1, norm=None):
    return _fftn(a, None if n is None else (n,), (axis,), norm, "fft")


def ifft(a, n=None, axis=-1, norm=None):
    return _fftn(a, None if n is None else (n,), (axis,), norm, "ifft")


def rfft(a, n=None, axis=-1, norm=None):
    return _fftn(a, None if n is None else (n,), (axis,), norm, "rfft")


def irfft(a, n=None, axis=-1, norm=None):
    return _fftn(a, None if n is None else (n,), (axis,), norm, "irfft")


def fftn(a, s=None, axes=None, norm=None):
    return _fftn(a, s, axes, norm, "fft")


def ifftn(a, s=None, axes=None, norm=None):
    return _fftn(a, s, axes, norm, "ifft")


def rfftn(a, s=None, axes=None, norm=None):
    return _fftn(a, s, axes, norm, "rfft")


def irfftn(a, s=None, axes=None, norm=None):
    return _fftn(a, s, axes, norm, "irfft")


def fft2(a, s=None, axes=(-2, -1), norm=None):
    return _fftn(a, s, axes, norm, "fft")


def ifft2(a, s=None, axes=(-2, -1), norm=None):
    return _fftn(a, s, axes, norm, "ifft")


def rfft2(a, s=None, axes=(-2, -1), norm=None):
    return _fftn(a, s, axes, norm, "rfft")


def irfft2(a, s=None, axes=(-2, -1), norm=None):
    return _fftn(a, s, axes, norm, "irfft")


def fftfreq(n, d=1.0, *, dtype=None):
    return Array(np.fft.fftfreq(n, d).astype(dtypes.canonicalize(dtype or dtypes.float_)))


def rfftfreq(n, d=1.0, *, dtype=None):
    return Array(np.fft.rfftfreq(n, d).astype(dtypes.canonicalize(dtype or dtypes.float_)))


def fftshift(x, axes=None):
    x = operand(x)
    nd = len(info(x)[2])
    axes = tuple(range(nd)) if axes is None else (axes,) if isinstance(axes, int) else axes
    shifts = tuple(info(x)[2][ax] // 2 for ax in axes)
    return _sh.roll(x, shifts, axes)


def ifftshift(x, axes=None):
    x = operand(x)
    nd = len(info(x)[2])
    axes = tuple(range(nd)) if axes is None else (axes,) if isinstance(axes, int) else axes
    shifts = tuple(-(info(x)[2][ax] // 2) for ax in axes)
    return _sh.roll(x, shifts, axes)


# the public names: jax's (jax.numpy.fft) that fflow has
__all__ = [
    "fft",
    "fft2",
    "fftfreq",
    "fftn",
    "fftshift",
    "ifft",
    "ifft2",
    "ifftn",
    "ifftshift",
    "irfft",
    "irfft2",
    "irfftn",
    "rfft",
    "rfft2",
    "rfftfreq",
    "rfftn",
]


def __dir__():
    return list(__all__)
