"""Comparisons, logical/bitwise ops and `select_n`."""

import numpy as np
from fflow.primitives.registrar import binary
from fflow.transforms.autodiff import (
    Zero,
    defzero,
    instantiate,
    is_undefined,
    jvp_rules,
    transpose_rules,
    zeros_like_aval,
)

from fflow import lax_ops as lax
from fflow.core import Primitive, ShapedArray, aval_of_value
from fflow.dtypes import bool_
from fflow.errors import DtypeError, ShapeError, user_error

eq_p = binary("eq", np.equal, out_dtype=bool_)
ne_p = binary("ne", np.not_equal, out_dtype=bool_)
lt_p = binary("lt", np.less, out_dtype=bool_)
le_p = binary("le", np.less_equal, out_dtype=bool_)
gt_p = binary("gt", np.greater, out_dtype=bool_)
ge_p = binary("ge", np.greater_equal, out_dtype=bool_)
and_p = binary("and", np.bitwise_and, kinds="biu")
or_p = binary("or", np.bitwise_or, kinds="biu")
xor_p = binary("xor", np.bitwise_xor, kinds="biu")


def _shift_right_logical(x, y):
    x = np.asarray(x)
    if x.dtype.kind == "i":  # logical: shift the bits as unsigned (zero-filling), as JAX
        u = np.dtype(f"uint{x.dtype.itemsize * 8}")
        return np.right_shift(x.view(u), np.asarray(y).astype(u)).view(x.dtype)
    return np.right_shift(x, y)


def _shift_left(x, y):
    return np.left_shift(x, y)


shift_left_p = binary("shift_left", _shift_left, kinds="iu")
shift_right_logical_p = binary("shift_right_logical", _shift_right_logical, kinds="iu")
# arithmetic (sign-filling) right shift of signed integers
shift_right_arithmetic_p = binary("shift_right_arithmetic", np.right_shift, kinds="iu")

for _p in (
    eq_p,
    ne_p,
    lt_p,
    le_p,
    gt_p,
    ge_p,
    and_p,
    or_p,
    xor_p,
    shift_left_p,
    shift_right_logical_p,
    shift_right_arithmetic_p,
):
    defzero(_p)
    _p.traits.add("compare")


# select_n(which, *cases): cases[which] elementwise; `which` is bool (2 cases) or int.
select_n_p = Primitive("select_n")
select_n_p.traits.add("elementwise")
select_n_p.amp_class = "follow"


@select_n_p.def_impl
def _select_n_impl(which, *cases):
    if len(cases) == 2 and which.dtype == np.bool_:
        return np.where(which, cases[1], cases[0])
    return np.choose(np.clip(which, 0, len(cases) - 1), cases)


@select_n_p.def_abstract_eval
def _select_n_abstract_eval(which, *cases):
    if not cases:
        raise user_error(ValueError, "select_n needs at least one case")
    first = cases[0]
    for c in cases[1:]:
        if c.shape != first.shape or c.dtype != first.dtype:
            raise user_error(
                ShapeError,
                f"select_n cases must have equal shapes and dtypes, got "
                f"{first.str_short()} and {c.str_short()}",
            )
    if which.shape != first.shape and which.shape != ():
        raise user_error(
            ShapeError,
            f"select_n predicate of shape {which.shape} does not match cases {first.shape}",
        )
    if which.dtype != bool_ and which.dtype.kind not in "iu":
        raise user_error(DtypeError, f"select_n predicate must be bool or int, got {which.dtype}")
    return ShapedArray(first.shape, first.dtype, all(c.weak_type for c in cases))


def _select_n_jvp(primals, tangents):
    which, *cases = primals
    out = lax.select_n(which, *cases)
    case_tangents = tangents[1:]
    if all(type(t) is Zero for t in case_tangents):
        return out, Zero(case_tangents[0].aval)
    return out, lax.select_n(which, *[instantiate(t) for t in case_tangents])


def _select_n_transpose(ct, which, *cases):
    if is_undefined(which):
        raise ValueError("select_n is not linear in its predicate")
    if type(ct) is Zero:
        return [None] * (1 + len(cases))
    # ct may be a plain NumPy array (a known cotangent), so take its aval from the value
    zeros = zeros_like_aval(aval_of_value(ct).strip_weak_type())
    out = [None]
    for i, c in enumerate(cases):
        if is_undefined(c):
            branches = [zeros] * len(cases)
            branches[i] = ct
            out.append(lax.select_n(which, *branches))
        else:
            out.append(None)
    return out


jvp_rules[select_n_p] = _select_n_jvp
transpose_rules[select_n_p] = _select_n_transpose
select_n_p.traits.add("linear_in_cases")
