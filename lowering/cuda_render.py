"""C-style renderer table for the CUDA backend (in the spirit of tinygrad's cstyle).

A `Renderer` per dtype turns one elementwise primitive applied to C expressions
into a C expression. The float32 renderer holds one row per primitive; the
float64, integer and bool renderers override the rows that differ; half and
bfloat16 compute in float (each result rounded back to 16 bits, as the NumPy
backend rounds every operation) and override only how values are loaded, stored
and rounded. Generated code uses no CUDA headers: 16-bit floats are `unsigned
short` with the conversions in `PREAMBLE`, and infinities/NaNs are bit patterns.
"""

import math
import struct

import numpy as np

from fflow.core import primitives

# Helpers every generated kernel source starts with. They compile with NVRTC (no
# headers) and with g++ through cuda_shim.h; `#ifdef __CUDA_ARCH__` picks the
# hardware conversions on the GPU and exact bit manipulation on the host.
PREAMBLE = r"""
#ifndef FFLOW_PREAMBLE
#define FFLOW_PREAMBLE
__device__ __forceinline__ float fflow_h2f(unsigned short h) {
#ifdef __CUDA_ARCH__
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
#else
  unsigned sign = (h >> 15) & 1u, e = (h >> 10) & 31u, m = h & 1023u, bits;
  if (e == 0) {
    if (m == 0) { bits = sign << 31; }
    else { int k = -1; do { ++k; m <<= 1; } while (!(m & 1024u)); m &= 1023u;
           bits = (sign << 31) | ((unsigned)(112 - k) << 23) | (m << 13); }
  } else if (e == 31) { bits = (sign << 31) | 0x7f800000u | (m << 13); }
  else { bits = (sign << 31) | ((e + 112u) << 23) | (m << 13); }
  return __uint_as_float(bits);
#endif
}
__device__ __forceinline__ unsigned short fflow_f2h(float f) {
#ifdef __CUDA_ARCH__
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
#else
  unsigned x = __float_as_uint(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return (unsigned short)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
  if (ax >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);
  if (ax < 0x38800000u) {  // subnormal half: round the shifted mantissa to nearest even
    if (ax < 0x33000000u) return (unsigned short)sign;
    unsigned e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u, shift = 126u - e;
    unsigned r = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return (unsigned short)(sign | r);
  }
  unsigned r = ax + 0xc8000fffu + ((ax >> 13) & 1u);
  return (unsigned short)(sign | (r >> 13));
#endif
}
__device__ __forceinline__ float fflow_bf2f(unsigned short h) {
  return __uint_as_float(((unsigned)h) << 16);
}
__device__ __forceinline__ unsigned short fflow_f2bf(float f) {
  unsigned x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40u);
  return (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ bool fflow_isfinite(float x) {
  return (__float_as_uint(x) & 0x7f800000u) != 0x7f800000u;
}
__device__ __forceinline__ bool fflow_isfinite(double x) {
  return (__double_as_longlong(x) & 0x7ff0000000000000LL) != 0x7ff0000000000000LL;
}
template <class T> __device__ __forceinline__ T fflow_max(T a, T b) {
  return (a != a || a > b) ? a : b;
}
template <class T> __device__ __forceinline__ T fflow_min(T a, T b) {
  return (a != a || a < b) ? a : b;
}
template <class T> __device__ __forceinline__ T fflow_sign(T x) {
  return x > T(0) ? T(1) : (x < T(0) ? T(-1) : x);
}
template <class T> __device__ __forceinline__ T fflow_iabs(T x) { return x < T(0) ? T(0) - x : x; }
template <class T> __device__ __forceinline__ T fflow_sq(T x) { return x * x; }
template <class T> __device__ __forceinline__ T fflow_popc(T x) {  // the set bits of x's width
  unsigned mask = sizeof(T) >= 4 ? 0xffffffffu : (1u << (8 * sizeof(T) % 32)) - 1u;
  return sizeof(T) == 8 ? (T)__popcll((unsigned long long)x) : (T)__popc((unsigned)x & mask);
}
template <class To, class From> __device__ __forceinline__ To fflow_bitcast(From x) {
  union { From f; To t; } u;  // same widths (checked when traced); NVCC and GCC define this
  u.f = x;
  return u.t;
}
template <class T> __device__ __forceinline__ T fflow_idiv(T a, T b) {
  if (b == T(0)) return T(-1);
  if (T(-1) < T(0) && b == T(-1)) return T(0) - a;
  return a / b;
}
template <class T> __device__ __forceinline__ T fflow_irem(T a, T b) {
  if (b == T(0)) return a;
  if (T(-1) < T(0) && b == T(-1)) return T(0);
  return a % b;
}
template <class T> __device__ __forceinline__ T fflow_ipow(T x, long long n) {
  T r = T(1);
  while (n > 0) { if (n & 1) r *= x; x *= x; n >>= 1; }
  return r;
}
template <class T> __device__ __forceinline__ T fflow_shl(T x, T y) {
  return (y < T(0) || y >= T(8 * sizeof(T))) ? T(0) : (T)((unsigned long long)x << y);
}
template <class T> __device__ __forceinline__ T fflow_shr(T x, T y) {
  return (y >= T(8 * sizeof(T))) ? T(0) : (T)(x >> y);
}
template <class T> __device__ __forceinline__ T fflow_sar(T x, T y) {
  return ((unsigned long long)(long long)y < 8 * sizeof(T)) ? (T)(x >> y)
                                                            : (x < T(0) ? T(-1) : T(0));
}
__device__ __forceinline__ float fflow_erfinv(float x) {
  // XLA's single-precision erf_inv (M. Giles), the same numbers as the NumPy backend
  float w = -log1pf(-x * x), p;
  if (w < 5.0f) {
    w = w - 2.5f; p = 2.81022636e-08f;
    p = fmaf(p, w, 3.43273939e-07f); p = fmaf(p, w, -3.5233877e-06f);
    p = fmaf(p, w, -4.39150654e-06f); p = fmaf(p, w, 0.00021858087f);
    p = fmaf(p, w, -0.00125372503f); p = fmaf(p, w, -0.00417768164f);
    p = fmaf(p, w, 0.246640727f); p = fmaf(p, w, 1.50140941f);
  } else {
    w = sqrtf(w) - 3.0f; p = -0.000200214257f;
    p = fmaf(p, w, 0.000100950558f); p = fmaf(p, w, 0.00134934322f);
    p = fmaf(p, w, -0.00367342844f); p = fmaf(p, w, 0.00573950773f);
    p = fmaf(p, w, -0.0076224613f); p = fmaf(p, w, 0.00943887047f);
    p = fmaf(p, w, 1.00167406f); p = fmaf(p, w, 2.83297682f);
  }
  return fabsf(x) == 1.0f ? x * __int_as_float(0x7f800000) : p * x;
}
__device__ __forceinline__ long long fflow_clamp(long long x, long long lo, long long hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}
__device__ __forceinline__ unsigned fflow_rotl(unsigned x, int r) {
  return (x << r) | (x >> (32 - r));
}
// Threefry-2x32, 20 rounds (primitives/random_bits.py); returns word `which`.
__device__ __forceinline__ unsigned fflow_threefry(unsigned k0, unsigned k1, unsigned x0,
                                                   unsigned x1, int which) {
  const unsigned ks[3] = {k0, k1, k0 ^ k1 ^ 0x1BD11BDAu};
  const int rot[2][4] = {{13, 15, 26, 6}, {17, 29, 16, 24}};
  x0 += ks[0]; x1 += ks[1];
  for (int b = 0; b < 5; ++b) {
    for (int i = 0; i < 4; ++i) { x0 += x1; x1 = fflow_rotl(x1, rot[b & 1][i]); x1 ^= x0; }
    x0 += ks[(b + 1) % 3]; x1 += ks[(b + 2) % 3] + (unsigned)(b + 1);
  }
  return which ? x1 : x0;
}
#endif
"""

_STORAGE = {
    "float32": "float",
    "float64": "double",
    "float16": "unsigned short",
    "bfloat16": "unsigned short",
    "int8": "signed char",
    "int16": "short",
    "int32": "int",
    "int64": "long long",
    "uint8": "unsigned char",
    "uint16": "unsigned short",
    "uint32": "unsigned int",
    "uint64": "unsigned long long",
    "bool": "bool",
}


class Renderer:
    """float32: the base table. `code_for_op[name](*args, **params)` -> C expression."""

    ctype = "float"  # storage type
    compute = "float"  # arithmetic type
    suffix = "f"  # for math functions: sinf / sin

    def __init__(self, dtype):
        self.dtype = np.dtype(dtype)
        fn = self.fn
        self.code_for_op = {
            "neg": lambda x: f"(-{x})",
            "abs": lambda x: f"{fn('fabs')}({x})",
            "sign": lambda x: f"fflow_sign({x})",
            "floor": lambda x: f"{fn('floor')}({x})",
            "ceil": lambda x: f"{fn('ceil')}({x})",
            "round": lambda x: f"{fn('round')}({x})",
            "round_even": lambda x: f"{fn('rint')}({x})",
            "is_finite": lambda x: f"fflow_isfinite({x})",
            "square": lambda x: f"fflow_sq({x})",
            "integer_pow": self._integer_pow,
            "stop_gradient": lambda x: x,
            "copy": lambda x: x,
            "rsqrt": lambda x: f"{fn('rsqrt')}({x})",
            "logistic": lambda x: f"({self.lit(1)} / ({self.lit(1)} + {fn('exp')}(-{x})))",
            "erf_inv": lambda x: f"fflow_erfinv({x})",
            "add": lambda x, y: f"({x} + {y})",
            "sub": lambda x, y: f"({x} - {y})",
            "mul": lambda x, y: f"({x} * {y})",
            "div": lambda x, y: f"({x} / {y})",
            "rem": lambda x, y: f"{fn('fmod')}({x}, {y})",
            "pow": lambda x, y: f"{fn('pow')}({x}, {y})",
            "max": lambda x, y: f"fflow_max({x}, {y})",
            "min": lambda x, y: f"fflow_min({x}, {y})",
            "atan2": lambda x, y: f"{fn('atan2')}({x}, {y})",
            "nextafter": lambda x, y: f"{fn('nextafter')}({x}, {y})",
            "eq": lambda x, y: f"({x} == {y})",
            "ne": lambda x, y: f"({x} != {y})",
            "lt": lambda x, y: f"({x} < {y})",
            "le": lambda x, y: f"({x} <= {y})",
            "gt": lambda x, y: f"({x} > {y})",
            "ge": lambda x, y: f"({x} >= {y})",
        }
        # libm functions: each primitive that declares one (Primitive.c_math, next to
        # its definition: sin, exp, erf...), so a new one needs no row here
        libm = {p.name: p.c_math for p in primitives.values() if p.c_math is not None}
        libm.update(asinh="asinh", acosh="acosh", atanh="atanh")
        for name, c_name in libm.items():
            if name not in self.code_for_op:
                self.code_for_op[name] = (lambda n: lambda x: f"{fn(n)}({x})")(c_name)

    def fn(self, name):
        return name + self.suffix

    def _integer_pow(self, x, *, y):
        if y == 0:
            return self.lit(1)
        if y < 0:
            return f"({self.lit(1)} / fflow_ipow({x}, {-y}LL))"
        return f"fflow_ipow({x}, {y}LL)"

    # -- values ---------------------------------------------------------------------
    def load(self, expr):
        """A stored value (C expression of `ctype`) as a `compute` value."""
        return expr

    def store(self, expr):
        """A `compute` value as the stored `ctype`."""
        return expr

    def round(self, expr):
        """Round a computed value to this dtype's precision (16-bit floats only)."""
        return expr

    def lit(self, value):
        """A C literal of the compute type (infinities and NaN as bit patterns)."""
        v = float(value)
        if math.isnan(v):
            return "__int_as_float(0x7fc00000)"
        if math.isinf(v):
            return "__int_as_float(0x7f800000)" if v > 0 else "__int_as_float(0xff800000)"
        f32 = float(np.float32(v))
        return f"{f32!r}f" if f32 != int(f32) or abs(f32) >= 1e16 else f"{int(f32)}.0f"

    def cast_from(self, expr, src):
        """Convert a value computed by renderer `src` to this dtype (convert_element_type)."""
        if src.kind == "b":
            return f"({self.compute})({expr} ? 1 : 0)"
        return self.round(f"({self.compute})({expr})")

    @property
    def kind(self):
        return self.dtype.kind


class F64Renderer(Renderer):
    ctype = compute = "double"
    suffix = ""

    def __init__(self, dtype):
        super().__init__(dtype)
        self.code_for_op["erf_inv"] = lambda x: f"erfinv({x})"

    def lit(self, value):
        v = float(value)
        if math.isnan(v) or math.isinf(v):
            bits = struct.unpack("<q", struct.pack("<d", v))[0]
            return f"__longlong_as_double({bits}LL)"
        return repr(v) if v != int(v) or abs(v) >= 1e16 else f"{int(v)}.0"


class HalfRenderer(Renderer):
    """float16: float arithmetic, 16-bit storage; every result rounds to half."""

    ctype = "unsigned short"

    def load(self, expr):
        return f"fflow_h2f({expr})"

    def store(self, expr):
        return f"fflow_f2h({expr})"

    def round(self, expr):
        return f"fflow_h2f(fflow_f2h({expr}))"

    def lit(self, value):
        return super().lit(float(np.float16(value)))


class BF16Renderer(HalfRenderer):
    """bfloat16: like half, with bf16 conversions."""

    def load(self, expr):
        return f"fflow_bf2f({expr})"

    def store(self, expr):
        return f"fflow_f2bf({expr})"

    def round(self, expr):
        return f"fflow_bf2f(fflow_f2bf({expr}))"

    def lit(self, value):
        import ml_dtypes

        return Renderer.lit(self, float(np.asarray(value, ml_dtypes.bfloat16).astype(np.float32)))


class IntRenderer(Renderer):
    """Signed and unsigned integers: C arithmetic, XLA's division by zero, NumPy's shifts."""

    def __init__(self, dtype):
        super().__init__(dtype)
        self.ctype = self.compute = _STORAGE[self.dtype.name]
        narrow = self.dtype.itemsize < 4
        t = self.compute

        def wrap(e):
            # C promotes narrow ints to int; cast back so wrapping matches NumPy
            return f"(({t})({e}))" if narrow else e

        unsigned = self.dtype.kind == "u"
        self.code_for_op.update(
            {
                "neg": lambda x: wrap(f"({t})0 - {x}"),
                "abs": lambda x: x if unsigned else wrap(f"fflow_iabs({x})"),
                "add": lambda x, y: wrap(f"{x} + {y}"),
                "sub": lambda x, y: wrap(f"{x} - {y}"),
                "mul": lambda x, y: wrap(f"{x} * {y}"),
                "div": lambda x, y: f"fflow_idiv<{t}>({x}, {y})",
                "rem": lambda x, y: f"fflow_irem<{t}>({x}, {y})",
                "pow": lambda x, y: f"fflow_ipow<{t}>({x}, (long long)({y}))",
                "max": lambda x, y: f"fflow_max<{t}>({x}, {y})",
                "min": lambda x, y: f"fflow_min<{t}>({x}, {y})",
                "sign": lambda x: f"fflow_sign<{t}>({x})",
                "square": lambda x: wrap(f"fflow_sq<{t}>({x})"),
                "population_count": lambda x: f"fflow_popc<{t}>({x})",
                "and": lambda x, y: wrap(f"{x} & {y}"),
                "or": lambda x, y: wrap(f"{x} | {y}"),
                "xor": lambda x, y: wrap(f"{x} ^ {y}"),
                "not": lambda x: wrap(f"~{x}"),
                "shift_left": lambda x, y: f"fflow_shl<{t}>({x}, {y})",
                "shift_right_logical": lambda x, y: f"fflow_shr<{t}>({x}, {y})",
                "shift_right_arithmetic": lambda x, y: f"fflow_sar<{t}>({x}, {y})",
            }
        )
        for name in ("floor", "ceil", "round", "round_even", "copy", "stop_gradient"):
            self.code_for_op[name] = lambda x: x
        self.code_for_op["is_finite"] = lambda x: "true"

    def _integer_pow(self, x, *, y):
        if y < 0:
            return f"({self.compute})(1 / fflow_ipow<{self.compute}>({x}, {-y}LL))"
        return f"fflow_ipow<{self.compute}>({x}, {y}LL)"

    def lit(self, value):
        v = int(value)
        if self.dtype.kind == "u":
            return f"{v}ULL" if self.dtype.itemsize == 8 else f"{v}u"
        if self.dtype.itemsize == 8:
            return f"{v}LL" if v != -(2**63) else "(-9223372036854775807LL - 1)"
        return str(v) if v != -(2**31) else "(-2147483647 - 1)"

    def cast_from(self, expr, src):
        if src.kind == "b":
            return f"({self.compute})({expr} ? 1 : 0)"
        return f"({self.compute})({expr})"


class BoolRenderer(IntRenderer):
    def __init__(self, dtype):
        Renderer.__init__(self, dtype)
        self.ctype = self.compute = "bool"
        self.code_for_op.update(
            {
                "and": lambda x, y: f"({x} && {y})",
                "or": lambda x, y: f"({x} || {y})",
                "xor": lambda x, y: f"({x} != {y})",
                "not": lambda x: f"(!{x})",
                "max": lambda x, y: f"({x} || {y})",
                "min": lambda x, y: f"({x} && {y})",
                "mul": lambda x, y: f"({x} && {y})",
                "add": lambda x, y: f"({x} || {y})",
                "copy": lambda x: x,
                "stop_gradient": lambda x: x,
            }
        )

    def lit(self, value):
        return "true" if bool(value) else "false"

    def cast_from(self, expr, src):
        return f"(({expr}) != 0)"


def renderer_for(dtype):
    """The renderer of one dtype (cached)."""
    dtype = np.dtype(dtype)
    r = _cache.get(dtype)
    if r is None:
        name = dtype.name
        if name == "float32":
            r = Renderer(dtype)
        elif name == "float64":
            r = F64Renderer(dtype)
        elif name == "float16":
            r = HalfRenderer(dtype)
        elif name == "bfloat16":
            r = BF16Renderer(dtype)
        elif name == "bool":
            r = BoolRenderer(dtype)
        elif dtype.kind in "iu":
            r = IntRenderer(dtype)
        else:
            raise NotImplementedError(f"the CUDA backend has no {name} arithmetic")
        _cache[dtype] = r
    return r


_cache = {}


def storage_ctype(dtype):
    dtype = np.dtype(dtype)
    try:
        return _STORAGE[dtype.name]
    except KeyError:
        raise NotImplementedError(f"the CUDA backend cannot store {dtype.name}") from None


def supported_dtype(dtype):
    return np.dtype(dtype).name in _STORAGE
