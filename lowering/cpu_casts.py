"""float32 <-> bfloat16 casts on the CPU backend: what `fflow.amp` does around every
matmul and attention.

ml_dtypes' cast loop takes about 0.75 ns per element from float32 to bfloat16 and 0.3 ns
back. Here float32 -> bfloat16 is one vectorized C loop (gcc, lowering/native.py's cache),
with ml_dtypes' rounding: to nearest, ties to even, and NaN to the canonical quiet NaN of
its sign; bfloat16 -> float32 is exact: the 16 bits moved up. Small, non-contiguous or
compiler-less inputs use `astype`.
"""

import ctypes

import numpy as np

MIN_SIZE = 1 << 12  # below this, astype's fixed cost is the smaller one

_SOURCE = r"""
#include <stdint.h>
void fflow_f32_to_bf16(const uint32_t *x, uint16_t *y, long n) {
    #pragma omp simd
    for (long i = 0; i < n; i++) {
        uint32_t u = x[i];
        uint16_t rounded = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
        uint16_t nan = (uint16_t)(((u >> 16) & 0x8000u) | 0x7fc0u);
        y[i] = (u & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
    }
}
void fflow_bf16_to_f32(const uint16_t *x, uint32_t *y, long n) {
    #pragma omp simd
    for (long i = 0; i < n; i++) y[i] = (uint32_t)x[i] << 16;
}
"""

_kernels = {}  # name -> the ctypes function, or None when there is no C compiler


def _kernel(name):
    if name not in _kernels:
        from fflow.lowering import native  # the C compiler path (optional, heavy)

        fn = native.load(_SOURCE, name) if native.enabled() else None
        if fn is not None:
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
        _kernels[name] = fn
    return _kernels[name]


def _fast(x):
    return type(x) is np.ndarray and x.size >= MIN_SIZE and x.flags.c_contiguous


def to_bf16(x, dtype):
    """float32 `x` rounded to bfloat16 `dtype` (bit for bit what `x.astype(dtype)` gives)."""
    fn = _kernel("fflow_f32_to_bf16") if _fast(x) and x.dtype == np.float32 else None
    if fn is None:
        return x.astype(dtype)
    out = np.empty(x.shape, dtype)
    fn(x.ctypes.data, out.ctypes.data, x.size)
    return out


def from_bf16(x):
    """bfloat16 `x` as float32 (exact)."""
    fn = _kernel("fflow_bf16_to_f32") if _fast(x) and x.dtype.name == "bfloat16" else None
    if fn is None:
        return x.astype(np.float32)
    out = np.empty(x.shape, np.float32)
    fn(x.ctypes.data, out.ctypes.data, x.size)
    return out


def cast(x, dtype):
    """`x.astype(dtype)`, through the fast paths for float32 <-> bfloat16."""
    dtype = np.dtype(dtype)
    if dtype.name == "bfloat16" and x.dtype == np.float32:
        return to_bf16(x, dtype)
    if dtype == np.float32 and x.dtype.name == "bfloat16":
        return from_bf16(x)
    return x.astype(dtype)


__all__ = ["cast", "from_bf16", "to_bf16"]
