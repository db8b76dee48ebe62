"""fflow.numpy: JAX's `jax.numpy` names and semantics (NumPy broadcasting, JAX type
promotion, immutable arrays).

Example:
    >>> import fflow.numpy as jnp
    >>> x = jnp.arange(6.0).reshape(2, 3)
    >>> jnp.sum(x * 2, axis=1).tolist()
    [6.0, 24.0]
"""

import importlib as _importlib

import numpy as _np

from fflow import dtypes as _dtypes
from fflow.array import Array as ndarray
from fflow.dtypes import (
    bfloat16_dtype as _bf16,
)
from fflow.numpy import creation as _creation
from fflow.numpy import elementwise as _elementwise
from fflow.numpy import more as _more
from fflow.numpy import reductions as _reductions
from fflow.numpy import shapes as _shapes
from fflow.numpy import statistics as _statistics
from fflow.numpy._util import info as _info
from fflow.numpy.creation import *
from fflow.numpy.elementwise import *
from fflow.numpy.elementwise import abs, divmod, pow, round
from fflow.numpy.indexing import getitem as _getitem
from fflow.numpy.linalg_ops import (
    diag,
    diagonal,
    dot,
    einsum,
    einsum_path,
    inner,
    kron,
    matmul,
    outer,
    tensordot,
    trace,
    vdot,
)
from fflow.numpy.more import *
from fflow.numpy.reductions import *
from fflow.numpy.reductions import all, any, max, min, sum
from fflow.numpy.shapes import *
from fflow.numpy.shapes import shape, size
from fflow.numpy.statistics import *

Array = ndarray


class _ScalarMeta(type):
    """`jnp.float32` & co.: usable as dtypes, and calling one makes a 0-d (or cast)
    fflow array, traced values included (as in JAX)."""

    @property
    def __numpy_dtype__(cls):
        return cls.dtype

    def __hash__(cls):
        return hash(cls.dtype.type)

    def __eq__(cls, other):
        return cls is other or cls.dtype.type == other

    def __ne__(cls, other):
        return not cls == other

    def __call__(cls, x):
        return asarray(x, dtype=cls.dtype)

    def __instancecheck__(cls, instance):
        return isinstance(instance, cls.dtype.type)

    def __repr__(cls):
        return f"<class 'fflow.numpy.{cls.__name__}'>"


def _scalar_type(np_type):
    return _ScalarMeta(_np.dtype(np_type).name, (object,), {"dtype": _np.dtype(np_type)})


float16 = _scalar_type(_np.float16)
float32 = single = _scalar_type(_np.float32)
float64 = double = _scalar_type(_np.float64)
int8 = _scalar_type(_np.int8)
int16 = _scalar_type(_np.int16)
int32 = _scalar_type(_np.int32)
int64 = _scalar_type(_np.int64)
uint8 = _scalar_type(_np.uint8)
uint16 = _scalar_type(_np.uint16)
uint32 = _scalar_type(_np.uint32)
uint64 = _scalar_type(_np.uint64)
bool_ = _scalar_type(_np.bool_)
complex64 = _scalar_type(_np.complex64)
complex128 = _scalar_type(_np.complex128)
inexact = _np.inexact
floating = _np.floating
integer = _np.integer
signedinteger = _np.signedinteger
unsignedinteger = _np.unsignedinteger
number = _np.number
complexfloating = _np.complexfloating
dtype = _np.dtype
iinfo = _np.iinfo
issubdtype = _np.issubdtype
pi = _np.pi
e = _np.e
inf = _np.inf
nan = _np.nan
newaxis = None
euler_gamma = _np.euler_gamma


_DEFAULT_TYPES = {"float_": "float_", "int_": "int_", "uint": "uint", "complex_": "complex_"}


def __getattr__(name):
    if name in ("fft", "linalg"):  # submodules, loaded on first use (import time)
        module = _importlib.import_module("fflow.numpy." + name)
        globals()[name] = module
        return module
    if name in _DEFAULT_TYPES:  # float32 or float64 as x64 is off or on
        return _scalar_type(getattr(_dtypes, _DEFAULT_TYPES[name]))
    if name.startswith(("float8_", "float4_")) or name in ("int4", "uint4", "int2", "uint2"):
        import ml_dtypes  # optional (the bf16 extra): the low-precision dtypes live there

        if hasattr(ml_dtypes, name):
            value = _scalar_type(getattr(ml_dtypes, name))
            globals()[name] = value
            return value
    if name == "bfloat16":
        global bfloat16
        bfloat16 = _scalar_type(_bf16())
        return bfloat16
    raise AttributeError(f"module 'fflow.numpy' has no attribute {name!r}")


def finfo(dtype):

    return _dtypes.finfo(dtype)


def result_type(*args):
    """The dtype JAX's promotion gives for arrays, scalars and dtypes together."""

    pairs = []
    for a in args:
        if a is int or a is float or a is complex or a is bool:
            pairs.append((_dtypes.canonicalize(a), a is not bool))
        elif isinstance(a, (_np.dtype, str, type)):
            pairs.append((_dtypes.canonicalize(a), False))
        else:
            d, weak, _ = _info(a)
            pairs.append((d, weak))
    return _dtypes.promote_pairs(*pairs)[0]


def promote_types(a, b):
    """The dtype a binary operation on dtypes `a` and `b` computes in (JAX's lattice; not
    narrowed to 32 bits: promote_types(int64, float32) is float64 as in JAX)."""

    def pair(t):
        if t is int or t is float or t is complex:
            return _dtypes.canonicalize(t), True
        if isinstance(t, str) and t in ("bfloat16", "bf16"):
            return _dtypes.bfloat16_dtype(), False
        return _np.dtype(t), False

    return _dtypes.promote_pairs(pair(a), pair(b))[0]


def can_cast(from_, to, casting="safe"):
    return _np.can_cast(from_, to, casting)


def isscalar(x):
    return _np.isscalar(x) or (hasattr(x, "shape") and x.shape == ())


def allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    return all(isclose(a, b, rtol, atol, equal_nan))


def array_equal(a1, a2, equal_nan=False):
    if shape(a1) != shape(a2):
        return asarray(False)
    eq = equal(a1, a2)
    if equal_nan:
        eq = logical_or(eq, logical_and(isnan(a1), isnan(a2)))
    return all(eq)


def copy(a):
    return array(a, copy=True)


def astype(x, dtype):
    return asarray(x).astype(dtype)


# The public names are jax.numpy's: each submodule's `__all__` (what its `import *`
# gives) and the ones defined or imported here (tests/test_numpy_namespace.py checks
# them against jax.numpy). `dir(fflow.numpy)` lists these and nothing else.
__all__ = sorted(
    set(_creation.__all__)
    | set(_elementwise.__all__)
    | set(_more.__all__)
    | set(_reductions.__all__)
    | set(_shapes.__all__)
    | set(_statistics.__all__)
    | {
        "allclose",
        "array_equal",
        "astype",
        "bool_",
        "can_cast",
        "complex128",
        "complex64",
        "complex_",
        "complexfloating",
        "copy",
        "diag",
        "diagonal",
        "dot",
        "double",
        "dtype",
        "e",
        "einsum",
        "einsum_path",
        "euler_gamma",
        "fft",
        "finfo",
        "float16",
        "float32",
        "float64",
        "float_",
        "floating",
        "iinfo",
        "inexact",
        "inf",
        "inner",
        "int16",
        "int32",
        "int64",
        "int8",
        "int_",
        "integer",
        "isscalar",
        "issubdtype",
        "kron",
        "linalg",
        "matmul",
        "nan",
        "ndarray",
        "newaxis",
        "number",
        "outer",
        "pi",
        "promote_types",
        "result_type",
        "signedinteger",
        "single",
        "tensordot",
        "trace",
        "uint",
        "uint16",
        "uint32",
        "uint64",
        "uint8",
        "unsignedinteger",
        "vdot",
    }
)


def __dir__():
    return __all__ + ["bfloat16"]  # bfloat16 loads on first use (ml_dtypes)
