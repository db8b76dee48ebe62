"""float32 <-> bfloat16 and float32 <-> float16 casts on the CPU backend: what
`fflow.amp` does around every matmul and attention.

ml_dtypes' cast loop takes about 0.75 ns per element from float32 to bfloat16, and
NumPy's float16 casts are a software loop (several ns per element). Here each direction
is one vectorized C loop (gcc, lowering/native.py's cache). The results are bit for bit
what `astype` gives:
- float32 -> bfloat16 rounds to nearest, ties to even, and NaN becomes the canonical
  quiet NaN of its sign, as in ml_dtypes.
- float32 <-> float16 uses the F16C instructions where the CPU has them. NaN payloads
  are treated as NumPy treats them.
- bfloat16 -> float32 is exact.

Small arrays, non-contiguous arrays and machines without a C compiler use `astype`.
"""

import ctypes

import numpy as np

MIN_SIZE = 1 << 12  # below this, astype's fixed cost is the smaller one

_SOURCE = r"""
#include <stdint.h>
#include <string.h>
#ifdef __F16C__
#include <immintrin.h>
#endif
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
#ifdef __FLT16_MAX__  /* _Float16: gcc 12+ on x86 (else astype runs) */
static uint16_t f16_nan(uint32_t u) {  /* NumPy's: the sign and the payload's top */
    uint16_t sig = (uint16_t)((u & 0x7fffffu) >> 13);
    return (uint16_t)(((u >> 16) & 0x8000u) | 0x7c00u | (sig ? sig : 1u));
}
void fflow_f32_to_f16(const uint32_t *x, uint16_t *y, long n) {
    long i = 0;
#ifdef __F16C__
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps((const float *)(x + i));
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
#endif
    for (; i < n; i++) {
        float f;
        memcpy(&f, x + i, 4);
        _Float16 h = (_Float16)f;
        memcpy(y + i, &h, 2);
    }
    for (i = 0; i < n; i++)
        if ((x[i] & 0x7fffffffu) > 0x7f800000u) y[i] = f16_nan(x[i]);
}
void fflow_f16_to_f32(const uint16_t *x, uint32_t *y, long n) {
    long i = 0;
#ifdef __F16C__
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(x + i));
        _mm256_storeu_ps((float *)(y + i), _mm256_cvtph_ps(h));
    }
#endif
    for (; i < n; i++) {
        _Float16 h;
        memcpy(&h, x + i, 2);
        float f = (float)h;
        memcpy(y + i, &f, 4);
    }
    for (i = 0; i < n; i++)  /* NumPy keeps a signaling NaN signaling */
        if ((x[i] & 0x7fffu) > 0x7c00u)
            y[i] = ((uint32_t)(x[i] & 0x8000u) << 16) | 0x7f800000u
                   | ((uint32_t)(x[i] & 0x3ffu) << 13);
}
#endif
"""

_kernels = {}  # name -> the ctypes function, or None when there is no C compiler


def _kernel(name):
    if name not in _kernels:
        from fflow.lowering import native  # the C compiler path (optional, heavy)

        try:
            fn = native.load(_SOURCE, name) if native.enabled() else None
        except AttributeError:  # a compiler without _Float16: no float16 loops
            fn = None
        if fn is not None:
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
        _kernels[name] = fn
    return _kernels[name]


def _fast(x):
    return type(x) is np.ndarray and x.size >= MIN_SIZE and x.flags.c_contiguous


def to_bf16(x, dtype):
    """float32 `x` rounded to bfloat16 `dtype` (bit for bit what `x.astype(dtype)` gives)."""
    return cast(x, dtype)


def from_bf16(x):
    """bfloat16 `x` as float32 (exact)."""
    return cast(x, np.float32)


_KERNELS = {
    ("float32", "bfloat16"): "fflow_f32_to_bf16",
    ("bfloat16", "float32"): "fflow_bf16_to_f32",
    ("float32", "float16"): "fflow_f32_to_f16",
    ("float16", "float32"): "fflow_f16_to_f32",
}
PAIRS = frozenset(_KERNELS)  # (from, to) dtype names with a C loop


def cast(x, dtype):
    """`x.astype(dtype)`, bit for bit, through a C loop for the pairs in PAIRS."""
    dtype = np.dtype(dtype)
    name = _KERNELS.get((x.dtype.name, dtype.name))
    fn = _kernel(name) if name is not None and _fast(x) else None
    if fn is None:
        return x.astype(dtype)
    out = np.empty(x.shape, dtype)
    fn(x.ctypes.data, out.ctypes.data, x.size)
    return out


__all__ = ["cast", "from_bf16", "to_bf16"]
