"""dtypes: JAX's defaults (float32, int32) and its type-promotion lattice.

Requested dtypes are honoured: a float64 NumPy array stays float64. Only values
without a dtype of their own (Python scalars and lists) get the 32-bit defaults.
"""

import numpy as np

from fflow.errors import user_error

float_ = np.dtype(np.float32)
int_ = np.dtype(np.int32)
bool_ = np.dtype(np.bool_)
float16 = np.dtype(np.float16)
float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
int8 = np.dtype(np.int8)
int16 = np.dtype(np.int16)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
uint8 = np.dtype(np.uint8)
uint32 = np.dtype(np.uint32)
uint64 = np.dtype(np.uint64)
complex64 = np.dtype(np.complex64)

_bfloat16 = None


def bfloat16_dtype():
    """The bfloat16 dtype from ml_dtypes (loaded lazily: it is an optional extra)."""
    global _bfloat16
    if _bfloat16 is None:
        try:
            import ml_dtypes
        except ImportError as e:  # pragma: no cover - depends on the install
            raise ImportError(
                "bfloat16 needs the ml_dtypes package: pip install 'fflow[bf16]'"
            ) from e
        _bfloat16 = np.dtype(ml_dtypes.bfloat16)
    return _bfloat16


_SHORT = {
    "float16": "f16",
    "float32": "f32",
    "float64": "f64",
    "bfloat16": "bf16",
    "int8": "i8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "uint8": "u8",
    "uint16": "u16",
    "uint32": "u32",
    "uint64": "u64",
    "bool": "bool",
    "complex64": "c64",
    "complex128": "c128",
}


def short_name(dtype):
    """`float32` -> `f32`, as JAX prints avals."""
    dtype = np.dtype(dtype)
    return _SHORT.get(dtype.name, dtype.name)


def canonicalize(dtype):
    """The dtype fflow uses for a user-requested dtype (bfloat16 by name included)."""
    if isinstance(dtype, str) and dtype in ("bfloat16", "bf16"):
        return bfloat16_dtype()
    if dtype is float:
        return float_
    if dtype is int:
        return int_
    if dtype is bool:
        return bool_
    if dtype is complex:
        return complex64
    try:
        return np.dtype(dtype)
    except TypeError:
        raise _bad_dtype(dtype) from None


def _bad_dtype(dtype):
    return user_error(
        TypeError,
        f"{dtype!r} is not a dtype. Fix: a NumPy dtype or its name, e.g. 'float32', "
        f"jnp.int32 or 'bfloat16'.",
    )


def is_float(dtype):
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or dtype.name == "bfloat16"


def is_int(dtype):
    return np.dtype(dtype).kind in "iu"


def is_inexact(dtype):
    dtype = np.dtype(dtype)
    return dtype.kind in "fc" or dtype.name == "bfloat16"


def finfo(dtype):
    dtype = np.dtype(dtype)
    if dtype.name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.finfo(dtype)
    return np.finfo(dtype)


def python_scalar_dtype(x):
    """Default dtype of a Python scalar (bool, int, float, complex)."""
    if isinstance(x, bool):
        return bool_
    if isinstance(x, int):
        return int_
    if isinstance(x, float):
        return float_
    if isinstance(x, complex):
        return complex64
    raise TypeError(f"not a Python scalar: {x!r}")


_KIND_RANK = {"b": 0, "u": 1, "i": 1, "f": 2, "V": 2, "c": 3}


def _kind_rank(dtype):
    return _KIND_RANK[np.dtype(dtype).kind]


def _promote_two(a, b):
    """JAX's lattice: ints meet floats at the float (i32 + f16 -> f16), not at f64."""
    if a == b:
        return a
    ra, rb = _kind_rank(a), _kind_rank(b)
    if ra != rb:
        hi, lo = (a, b) if ra > rb else (b, a)
        if _kind_rank(hi) == 3 and lo.kind == "f" and lo.itemsize > 4:
            return np.dtype(np.complex128)
        return hi
    if a.name == "bfloat16" or b.name == "bfloat16":
        other = b if a.name == "bfloat16" else a
        return float32 if other.itemsize <= 2 else other
    if a.kind in "ui" and b.kind in "ui" and a.kind != b.kind:
        signed, unsigned = (a, b) if a.kind == "i" else (b, a)
        if unsigned.itemsize < signed.itemsize:
            return signed
        if unsigned.itemsize >= 8:
            return float_ if signed.itemsize < 8 else np.dtype(np.float64)
        return np.dtype(f"int{unsigned.itemsize * 16}")
    return np.promote_types(a, b)


def result_type(*dtypes_and_weak):
    """Promote (dtype, weak) pairs the way JAX does; returns (dtype, weak)."""
    strong = [d for d, weak in dtypes_and_weak if not weak]
    weak = [d for d, weak in dtypes_and_weak if weak]
    if strong:
        out = strong[0]
        for d in strong[1:]:
            out = _promote_two(out, d)
        if weak:
            top = max(weak, key=_kind_rank)
            if _kind_rank(top) > _kind_rank(out):
                # a weak scalar of a higher kind wins and stays weak (i32 + 2.5 -> weak f32)
                if top.kind == "c":
                    wide = out.kind == "f" and out.itemsize == 8
                    return np.dtype(np.complex128 if wide else np.complex64), True
                return (float_ if top.kind == "f" else int_), True
        return out, False
    top = max(weak, key=_kind_rank)
    return top, True


# JAX's dtype of the tangent of an integer or boolean value: it carries no data.
float0 = np.dtype([("float0", np.void, 0)])


def scalar_to(x, dtype):
    """`x` as a 0-d array of `dtype`; a Python int out of range wraps around (JAX's
    conversion of a weak int: uint8 + -1 adds 255) instead of NumPy's OverflowError."""
    dtype = np.dtype(dtype)
    if type(x) is int and dtype.kind in "iu":
        info = np.iinfo(dtype)
        if not info.min <= x <= info.max:
            return np.asarray(x % (1 << (8 * dtype.itemsize)), np.uint64).astype(dtype)
    return np.asarray(x, dtype)
