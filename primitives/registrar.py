"""One-line registrars for the common primitive families.

Each returns the new `Primitive` with its NumPy implementation and shape/dtype
rule set, and tags it with traits (e.g. "elementwise") that transforms use to
apply a family rule (batching, SBP signatures, AMP class) unless the primitive's
own file registers a specific one.
"""

import numpy as np

from fflow import dtypes
from fflow.core import Primitive, ShapedArray
from fflow.errors import DtypeError, ShapeError, user_error


def _check_float(prim_name, aval):
    if not dtypes.is_inexact(aval.dtype):
        raise user_error(
            DtypeError,
            f"{prim_name} needs a floating-point input, got {aval.str_short()}. "
            f"Fix: cast with .astype(jnp.float32).",
        )


def unary(name, impl, *, float_only=True, out_dtype=None, amp="follow", c_math=None):
    """An elementwise unary primitive; `impl` is a NumPy function of one array;
    `c_math` the libm function computing it (see `Primitive.c_math`)."""
    prim = Primitive(name)
    prim.traits.add("elementwise")
    prim.amp_class = amp
    prim.c_math = c_math

    def abstract_eval(x, **params):
        if float_only:
            _check_float(name, x)
        return ShapedArray(x.shape, out_dtype or x.dtype, x.weak_type)

    prim.impl = impl
    prim.abstract_eval = abstract_eval
    return prim


def binary(name, impl, *, float_only=False, out_dtype=None, amp="follow", kinds=None):
    """An elementwise binary primitive over operands of equal shape and dtype."""
    prim = Primitive(name)
    prim.traits.add("elementwise")
    prim.amp_class = amp

    def abstract_eval(x, y, **params):
        if x.shape != y.shape:
            raise user_error(
                ShapeError,
                f"{name} got operands of shapes {x.shape} and {y.shape}; primitives need "
                f"equal shapes. Fix: broadcast first (fflow.numpy functions do this).",
            )
        if x.dtype != y.dtype:
            raise user_error(
                DtypeError,
                f"{name} got operands of dtypes {x.dtype.name} and {y.dtype.name}. "
                f"Fix: cast one with .astype().",
            )
        if float_only:
            _check_float(name, x)
        if kinds is not None and x.dtype.kind not in kinds:
            raise user_error(DtypeError, f"{name} does not accept dtype {x.dtype.name}.")
        return ShapedArray(x.shape, out_dtype or x.dtype, x.weak_type and y.weak_type)

    prim.impl = impl
    prim.abstract_eval = abstract_eval
    return prim


def keep_dtype(np_fn):
    """Wrap a NumPy ufunc so 0-d and low-precision results keep the input dtype."""

    def impl(*args):
        out = np_fn(*args)
        dtype = args[0].dtype
        if type(out) is not np.ndarray or out.dtype != dtype:
            out = np.asarray(out, dtype=dtype)
        return out

    impl.__name__ = getattr(np_fn, "__name__", "impl")
    return impl
