"""`fft`: discrete Fourier transforms over the trailing axes (NumPy's pocketfft is the
implementation). Leading axes are batch axes, which is also the batching rule.

fft_type is "fft", "ifft", "rfft" (real -> half spectrum) or "irfft" (half spectrum
-> real, of length fft_lengths[-1]). The transform is linear: its JVP applies it to
the tangent, and the transpose of the (symmetric) DFT matrix is the DFT itself.
"""

import numpy as np
from fflow.transforms import vmap as vm
from fflow.transforms.autodiff import Zero, deflinear
from fflow.transforms.shard_rules import Sig, def_sbp

from fflow import dtypes
from fflow import lax_ops as lax
from fflow.core import Primitive, ShapedArray
from fflow.errors import DtypeError, ShapeError, user_error
from fflow.sbp import S

fft_p = Primitive("fft")
fft_p.amp_class = "fp32"

_COMPLEX = {
    np.dtype(np.float32): np.dtype(np.complex64),
    np.dtype(np.float64): np.dtype(np.complex128),
}
_REAL = {v: k for k, v in _COMPLEX.items()}


def _complex_of(dtype):
    dtype = np.dtype(dtype)
    return dtype if dtype.kind == "c" else _COMPLEX.get(dtype, np.dtype(np.complex64))


def _real_of(dtype):
    return _REAL.get(np.dtype(dtype), np.dtype(np.float32))


@fft_p.def_impl
def _fft_impl(x, *, fft_type, fft_lengths):
    axes = tuple(range(x.ndim - len(fft_lengths), x.ndim))
    if fft_type == "fft":
        return np.fft.fftn(x, s=fft_lengths, axes=axes).astype(_complex_of(x.dtype))
    if fft_type == "ifft":
        return np.fft.ifftn(x, s=fft_lengths, axes=axes).astype(_complex_of(x.dtype))
    if fft_type == "rfft":
        return np.fft.rfftn(x, s=fft_lengths, axes=axes).astype(_complex_of(x.dtype))
    return np.fft.irfftn(x, s=fft_lengths, axes=axes).astype(_real_of(x.dtype))


@fft_p.def_abstract_eval
def _fft_abstract_eval(x, *, fft_type, fft_lengths):
    k = len(fft_lengths)
    if x.ndim < k:
        raise user_error(ShapeError, f"fft over {k} axes of a rank-{x.ndim} array")
    if fft_type == "rfft":
        if dtypes.is_inexact(x.dtype) and x.dtype.kind == "c":
            raise user_error(DtypeError, "rfft needs a real input; use fft for complex input")
        if tuple(x.shape[-k:]) != tuple(fft_lengths):
            raise user_error(ShapeError, f"rfft: shape {x.shape} does not end in {fft_lengths}")
        shape = x.shape[:-1] + (fft_lengths[-1] // 2 + 1,)
        return ShapedArray(shape, _complex_of(x.dtype))
    if fft_type == "irfft":
        if x.shape[-1] != fft_lengths[-1] // 2 + 1:
            raise user_error(
                ShapeError, f"irfft: last dim {x.shape[-1]} != {fft_lengths[-1]} // 2 + 1"
            )
        return ShapedArray(x.shape[:-1] + (fft_lengths[-1],), _real_of(x.dtype))
    return ShapedArray(x.shape, _complex_of(x.dtype))


def _conj(z):
    # conj(z) = 2 re(z) - z, over convert_element_type (every transform has its rules)
    re = lax.convert_element_type(lax.convert_element_type(z, _real_of(z.dtype)), z.dtype)
    return lax.sub(lax.add(re, re), z)


def _fft_transpose(ct, x, *, fft_type, fft_lengths):

    if type(ct) is Zero:
        return [None]
    if fft_type == "rfft":
        # rfft = slice(fft(complex(x))): transposed, zero-pad, fft, take the real part
        n = fft_lengths[-1]
        cfg = [(0, 0, 0)] * (ct.ndim - 1) + [(0, n - ct.shape[-1], 0)]
        padded = lax.pad(ct, np.zeros((), ct.dtype), cfg)
        full = fft_p.bind(padded, fft_type="fft", fft_lengths=fft_lengths)
        return [lax.convert_element_type(full, _real_of(ct.dtype))]
    if fft_type == "irfft":
        # JAX's rule: conj(scale * mask * rfft(ct)), mask = [1, 2, ..., 2, (1 if n even)]
        spec = fft_p.bind(ct, fft_type="rfft", fft_lengths=fft_lengths)
        m = spec.shape[-1]
        odd = fft_lengths[-1] % 2
        mask = np.concatenate([[1.0], np.full(m - 2 + odd, 2.0), np.ones(1 - odd)])[:m]
        mask = mask / np.prod(fft_lengths)
        weights = lax.broadcast_in_dim(np.asarray(mask, spec.dtype), spec.shape, (spec.ndim - 1,))
        return [_conj(lax.mul(spec, weights))]
    return [fft_p.bind(ct, fft_type=fft_type, fft_lengths=fft_lengths)]


deflinear(fft_p, _fft_transpose)


def _register_rules():

    def batch_rule(args, dims, **params):
        (x,), (d,) = args, dims
        return fft_p.bind(vm.moveaxis(x, d, 0), **params), 0

    vm.batch_rules[fft_p] = batch_rule

    def sbp_rule(in_avals, out_avals, *, fft_type, fft_lengths):
        nb = in_avals[0].ndim - len(fft_lengths)
        return [Sig((S(k),), (S(k),)) for k in range(nb)]

    def_sbp(fft_p, sbp_rule)


_register_rules()
