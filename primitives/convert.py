"""`convert_element_type`: dtype casts (the AMP rewrite inserts these)."""

import numpy as np
from fflow.transforms.amp_rules import amp_rules
from fflow.transforms.autodiff import Zero, defzero, jvp_rules, tangent_aval, transpose_rules

from fflow import dtypes
from fflow import lax_ops as lax
from fflow.core import Primitive, ShapedArray
from fflow.errors import DtypeError, user_error

convert_element_type_p = Primitive("convert_element_type")
convert_element_type_p.traits.add("elementwise")
convert_element_type_p.amp_class = "follow"
convert_element_type_p.traits.add("view")  # astype(copy=False) may return the input


@convert_element_type_p.def_impl
def _convert_impl(x, *, new_dtype, weak_type=False):
    if x.dtype == new_dtype:
        return x
    if x.dtype.kind == "f" and np.dtype(new_dtype).kind in "iu":
        # float -> int truncates towards zero and saturates (NaN -> 0), like XLA/JAX
        info = np.iinfo(new_dtype)
        with np.errstate(invalid="ignore"):
            t = np.trunc(x.astype(np.float64) if x.dtype.itemsize < 8 else x)
            hi, lo = t >= info.max, t <= info.min
            safe = np.where(hi | lo | np.isnan(t), 0, t).astype(new_dtype)
            return np.where(hi, info.max, np.where(lo, info.min, safe)).astype(new_dtype)
    if x.dtype.kind == "c" and np.dtype(new_dtype).kind != "c":
        x = x.real  # complex -> real keeps the real part (as XLA), without NumPy's warning
    with np.errstate(over="ignore"):
        # narrowing floats overflow to inf (AMP's fp16 casts; loss scaling detects it)
        return x.astype(new_dtype)


@convert_element_type_p.def_abstract_eval
def _convert_abstract_eval(x, *, new_dtype, weak_type=False):
    return ShapedArray(x.shape, new_dtype, weak_type)


def _convert_jvp(primals, tangents, *, new_dtype, weak_type=False):
    (x,), (t,) = primals, tangents
    out = lax.convert_element_type(x, new_dtype, weak_type)
    out_aval = ShapedArray(np.shape(out), new_dtype)
    if type(t) is Zero or not dtypes.is_inexact(new_dtype) or not dtypes.is_inexact(x.dtype):
        return out, Zero(tangent_aval(out_aval))
    return out, lax.convert_element_type(t, new_dtype, weak_type)


def _convert_transpose(ct, x, *, new_dtype, weak_type=False):
    if type(ct) is Zero:
        return [None]
    return [lax.convert_element_type(ct, x.aval.dtype, x.aval.weak_type)]


jvp_rules[convert_element_type_p] = _convert_jvp
transpose_rules[convert_element_type_p] = _convert_transpose
convert_element_type_p.traits.add("linear")
# SBP (transforms/shard_rules.py): monotone; a cast commutes with sums only when it does
# not narrow (each device's partial would be rounded), which the "cast" trait makes it check
convert_element_type_p.traits.update(("monotone_up", "cast"))


def _convert_amp(trace, prim, cls, ins, params):
    """AMP: a cast the user wrote; its output dtype is honoured whatever AMP did upstream."""
    (t,) = ins
    new_dtype = params["new_dtype"]
    if params.get("weak_type", False) or not t.is_float:
        if t.physical_dtype == new_dtype and not params.get("weak_type", False):
            return t.value
        return convert_element_type_p.bind(t.value, **params)
    return trace.cast(t, new_dtype)


amp_rules[convert_element_type_p] = _convert_amp


bitcast_convert_type_p = Primitive("bitcast_convert_type")
bitcast_convert_type_p.traits.add("elementwise")
bitcast_convert_type_p.amp_class = "keep"  # the bits are the value: no AMP cast


@bitcast_convert_type_p.def_impl
def _bitcast_impl(x, *, new_dtype):
    return np.array(x, order="C").view(new_dtype)


@bitcast_convert_type_p.def_abstract_eval
def _bitcast_abstract_eval(x, *, new_dtype):
    if np.dtype(new_dtype).itemsize != np.dtype(x.dtype).itemsize:
        raise user_error(
            DtypeError,
            f"bitcast_convert_type from {x.dtype.name} to {np.dtype(new_dtype).name}: fflow "
            f"bitcasts between dtypes of one width. Fix: pick a {x.dtype.itemsize}-byte dtype.",
        )
    return ShapedArray(x.shape, new_dtype)


defzero(bitcast_convert_type_p)  # JAX: the bits of a value have no derivative
