"""fflow.numpy: JAX's `jax.numpy` names and semantics (NumPy broadcasting, JAX type
promotion, immutable arrays).

Example:
    >>> import fflow.numpy as jnp
    >>> x = jnp.arange(6.0).reshape(2, 3)
    >>> jnp.sum(x * 2, axis=1).tolist()
    [6.0, 24.0]
"""

import numpy as _np

from fflow.array import Array as ndarray
from fflow.dtypes import (
    bfloat16_dtype as _bf16,
)
from fflow.numpy import linalg
from fflow.numpy.creation import *
from fflow.numpy.elementwise import *
from fflow.numpy.elementwise import abs, divmod, pow, round
from fflow.numpy.indexing import getitem as _getitem
from fflow.numpy.linalg_ops import (
    diag,
    diagonal,
    dot,
    einsum,
    inner,
    kron,
    matmul,
    outer,
    tensordot,
    trace,
    vdot,
)
from fflow.numpy.reductions import *
from fflow.numpy.reductions import all, any, max, min, sum
from fflow.numpy.shapes import *
from fflow.numpy.shapes import shape, size

Array = ndarray

float16 = _np.float16
float32 = _np.float32
float64 = _np.float64
int8 = _np.int8
int16 = _np.int16
int32 = _np.int32
int64 = _np.int64
uint8 = _np.uint8
uint16 = _np.uint16
uint32 = _np.uint32
uint64 = _np.uint64
bool_ = _np.bool_
complex64 = _np.complex64
complex128 = _np.complex128
float_ = _np.float32
int_ = _np.int32
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


def __getattr__(name):
    if name == "bfloat16":
        return _bf16().type
    raise AttributeError(f"module 'fflow.numpy' has no attribute {name!r}")


def finfo(dtype):
    from fflow import dtypes as _d

    return _d.finfo(dtype)


def result_type(*args):
    from fflow.numpy._util import promote_dtypes

    return promote_dtypes(*args)[0]


def promote_types(a, b):
    from fflow import dtypes as _d

    return _d.result_type((_np.dtype(a), False), (_np.dtype(b), False))[0]


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
