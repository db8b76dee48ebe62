"""dtypes: JAX's defaults (float32, int32), its 64-bit rule and its promotion lattice.

With 64-bit mode off (the default, as in JAX) every 64-bit dtype a value has or a
user asks for is canonicalised to its 32-bit counterpart: a NumPy float64 array
becomes float32, `dtype=jnp.int64` gives int32. `fflow.config.update(
"jax_enable_x64", True)` (or `JAX_ENABLE_X64=1` / `FFLOW_ENABLE_X64=1` in the
environment) turns 64-bit mode on; then the defaults are float64/int64 too.

Example:
    >>> import numpy as np, fflow.numpy as jnp
    >>> jnp.asarray(np.ones(2)).dtype
    dtype('float32')
"""

import os

import numpy as np

from fflow.config import config
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
complex128 = np.dtype(np.complex128)
uint16 = np.dtype(np.uint16)
complex_ = complex64
uint = uint32

# 64-bit dtype -> its 32-bit counterpart, used while 64-bit mode is off
_NARROW = {
    float64: float32,
    int64: int32,
    uint64: uint32,
    complex128: complex64,
}
_narrow = dict(_NARROW)  # the table in force (empty while x64 is on)


def x64_enabled():
    """Whether 64-bit mode (JAX's `jax_enable_x64`) is on."""
    return not _narrow


def set_x64(on):
    """Turn 64-bit mode on or off (use `fflow.config.update("jax_enable_x64", on)`)."""
    global float_, int_, complex_, uint
    on = bool(on)
    _narrow.clear()
    if not on:
        _narrow.update(_NARROW)
    float_, int_, complex_, uint = (
        (float64, int64, complex128, uint64) if on else (float32, int32, complex64, uint32)
    )


def _env_x64():
    for name in ("JAX_ENABLE_X64", "FFLOW_ENABLE_X64"):
        text = os.environ.get(name)
        if text is not None and text.strip().lower() in ("1", "true", "yes", "on"):
            return True
    return False


def canonical(dtype):
    """`dtype` (a np.dtype) as fflow stores it: 64-bit -> 32-bit unless x64 is on."""
    return _narrow.get(dtype, dtype)


def canonical_array(arr):
    """A NumPy array in its canonical dtype (the same array when it already is)."""
    narrow = _narrow.get(arr.dtype)
    return arr if narrow is None else arr.astype(narrow)


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
    """The dtype fflow uses for a user-requested dtype (bfloat16 by name included;
    64-bit dtypes are narrowed to 32 bits unless x64 is on, as in JAX)."""
    if isinstance(dtype, str) and dtype in ("bfloat16", "bf16"):
        return bfloat16_dtype()
    if dtype is float:
        return float_
    if dtype is int:
        return int_
    if dtype is bool:
        return bool_
    if dtype is complex:
        return complex_
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise _bad_dtype(dtype) from None
    return _narrow.get(dtype, dtype)


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
        return complex_
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


def promote_pairs(*dtypes_and_weak):
    """Promote (dtype, weak) pairs the way JAX does; returns (dtype, weak)."""
    dtype, weak = _result_type(*dtypes_and_weak)
    return _narrow.get(dtype, dtype), weak


def _result_type(*dtypes_and_weak):
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
                    return (complex128 if wide else complex_), True
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


# fflow.config holds the option (`jax_enable_x64`, env JAX_ENABLE_X64 / FFLOW_ENABLE_X64)
config.on_update("enable_x64", set_x64)
set_x64(config.enable_x64 or _env_x64())


# -- JAX's `jax.dtypes` functions -------------------------------------------------

_ML_KINDS = {"bfloat16": "f", "float8_e4m3fn": "f", "float8_e5m2": "f", "float8_e4m3b11fnuz": "f",
             "float8_e4m3fnuz": "f", "float8_e5m2fnuz": "f", "float8_e3m4": "f",
             "float8_e4m3": "f", "float8_e8m0fnu": "f", "float4_e2m1fn": "f",
             "int4": "i", "uint4": "u", "int2": "i", "uint2": "u"}  # fmt: skip


_PARENTS = {
    "f": (np.floating, np.inexact, np.number, np.generic),
    "i": (np.signedinteger, np.integer, np.number, np.generic),
    "u": (np.unsignedinteger, np.integer, np.number, np.generic),
}


def _ml_kind(x):
    """ "f"/"i"/"u" for an ml_dtypes type (bfloat16, float8_*, int4...), else None."""
    if isinstance(x, type) and issubclass(x, np.generic) and x.__module__ == "numpy":
        return None
    try:
        return _ML_KINDS.get(np.dtype(x).name)
    except TypeError:
        return None


def issubdtype(a, b):
    """`np.issubdtype` that also knows bfloat16/float8/int4 (as `jax.dtypes.issubdtype`).

    Example:
        >>> import numpy as np
        >>> from fflow import dtypes
        >>> dtypes.issubdtype(dtypes.bfloat16_dtype(), np.floating)
        True
    """
    if a is None or b is None:
        return False
    kind = _ml_kind(a)
    if kind is not None:
        if b in _PARENTS[kind]:
            return True
        return _ml_kind(b) is not None and np.dtype(a) == np.dtype(b)
    if _ml_kind(b) is not None:
        return False
    return bool(np.issubdtype(_dtype_arg(a), _dtype_arg(b)))


def _dtype_arg(x):
    # fflow.numpy's scalar types carry a np.dtype; NumPy's abstract types do not
    dtype = getattr(x, "dtype", None)
    return dtype if isinstance(dtype, np.dtype) else x


def canonicalize_dtype(dtype, allow_extended_dtype=False):
    """The dtype fflow stores for `dtype` (64-bit -> 32-bit unless x64 is on)."""
    return canonicalize(dtype)


def is_weakly_typed(x):
    return bool(getattr(x, "weak_type", isinstance(x, (bool, int, float, complex))))


def _dtype_and_weak(x):
    if x is int or x is float or x is complex:
        return canonicalize(x), True
    if x is bool:
        return bool_, False
    if isinstance(x, (bool, int, float, complex)) and not isinstance(x, np.generic):
        return python_scalar_dtype(x), not isinstance(x, bool)
    if isinstance(x, (np.dtype, str, type)):
        return canonicalize(x), False
    dtype = getattr(x, "dtype", None)
    if isinstance(dtype, np.dtype):
        return canonical(dtype), bool(getattr(x, "weak_type", False))
    return canonical(np.asarray(x).dtype), False


def result_type(*args, return_weak_type_flag=False):
    """The dtype JAX's promotion gives for arrays, scalars and dtypes (`jax.dtypes.result_type`).

    Example:
        >>> import numpy as np
        >>> from fflow import dtypes
        >>> dtypes.result_type(np.int32, 2.5)
        dtype('float32')
    """
    if not args:
        raise ValueError("at least one array or dtype is required")
    dtype, weak = promote_pairs(*[_dtype_and_weak(a) for a in args])
    return (dtype, weak) if return_weak_type_flag else dtype


def scalar_type_of(x):
    """The Python scalar type (bool, int, float, complex) of an array's dtype."""
    kind = np.dtype(getattr(x, "dtype", np.asarray(x).dtype)).kind
    return {"b": bool, "i": int, "u": int, "f": float, "c": complex}.get(kind, float)


def iinfo(dtype):
    return np.iinfo(dtype)
