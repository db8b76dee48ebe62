"""Elementwise binary arithmetic primitives (operands of equal shape and dtype)."""

import numpy as np
from fflow.primitives.registrar import binary
from fflow.transforms.autodiff import defjvp, deflinear, is_undefined, jvp_rules, transpose_rules

from fflow import lax_ops as lax


def _linear_ct(ct, x):
    return ct if is_undefined(x) else None


add_p = binary("add", np.add)
deflinear(add_p, lambda ct, x, y: [_linear_ct(ct, x), _linear_ct(ct, y)])

sub_p = binary("sub", np.subtract)
deflinear(
    sub_p,
    lambda ct, x, y: [_linear_ct(ct, x), lax.neg(ct) if is_undefined(y) else None],
)

mul_p = binary("mul", np.multiply)
defjvp(mul_p, lambda g, x, y: lax.mul(g, y), lambda g, x, y: lax.mul(x, g))


def _mul_transpose(ct, x, y):
    if is_undefined(x) and is_undefined(y):
        raise ValueError("mul is linear in one operand at a time; both are unknown")
    if is_undefined(x):
        return [lax.mul(ct, y), None]
    return [None, lax.mul(x, ct)]


transpose_rules[mul_p] = _mul_transpose
mul_p.traits.add("linear_in_one")


def _div(x, y):
    if x.dtype.kind in "iu":
        # lax.div on integers rounds towards zero, like C; x / 0 is -1 (all ones), as in XLA
        with np.errstate(divide="ignore", over="ignore"):
            q = np.floor_divide(x, y)
            fix = (np.remainder(x, y) != 0) & ((x < 0) != (y < 0))
        return np.where(y == 0, np.array(-1).astype(x.dtype), q + fix).astype(x.dtype)
    return np.true_divide(x, y)


div_p = binary("div", _div)
div_p.ufunc = (np.true_divide, "f")  # its impl for floats (see Primitive.ufunc)


def _div_jvp(primals, tangents):
    x, y = primals
    gx, gy = tangents
    out = lax.div(x, y)
    t = None
    if type(gx).__name__ != "Zero":
        t = lax.div(gx, y)
    if type(gy).__name__ != "Zero":
        ty = lax.neg(lax.mul(gy, lax.div(out, y)))
        t = ty if t is None else lax.add(t, ty)
    return out, t


jvp_rules[div_p] = _div_jvp
transpose_rules[div_p] = lambda ct, x, y: [lax.div(ct, y), None]
div_p.traits.add("linear_in_one")


def _rem(x, y):
    if x.dtype.kind in "iu":
        # x % 0 is x for integers, as in XLA (random.randint relies on it)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(y == 0, x, np.fmod(x, y)).astype(x.dtype)
    return np.fmod(x, y)


rem_p = binary("rem", _rem)
rem_p.ufunc = (np.fmod, "f")
defjvp(
    rem_p,
    lambda g, x, y: g,
    lambda g, x, y: lax.mul(lax.neg(g), lax.round(lax.div(lax.sub(x, lax.rem(x, y)), y))),
)


def _pow(x, y):
    return np.power(x, y)


pow_p = binary("pow", _pow, amp="fp32")
pow_p.ufunc = (np.power, "f")
pow_p.traits.add("transcendental")  # see unary.py


def _pow_jvp_x(g, x, y):
    # y * x**(y-1), and exactly 0 where y == 0 (not 0 * inf = nan at x == 0), as in JAX
    one = lax.full_like(y, 1)
    zero = lax.full_like(y, 0)
    jac = lax.select_n(lax.eq(y, zero), lax.mul(y, lax.pow(x, lax.sub(y, one))), zero)
    return lax.mul(g, jac)


def _pow_jvp_y(g, x, y):
    # log of x with zeros replaced by ones: no -inf even in higher derivatives (JAX's rule)
    out = lax.pow(x, y)
    zero, one = lax.full_like(x, 0), lax.full_like(x, 1)
    safe_log = lax.log(lax.select_n(lax.eq(x, zero), x, one))
    return lax.mul(g, lax.mul(out, safe_log))


defjvp(pow_p, _pow_jvp_x, _pow_jvp_y)


def _minmax_jvp(pick_x):
    # ties split the gradient evenly, as in JAX
    def rule(for_y):
        def jvp(g, x, y):
            half = lax.full_like(g, 0.5)
            one = lax.full_like(g, 1)
            zero = lax.full_like(g, 0)
            picked = pick_x(y, x) if for_y else pick_x(x, y)
            w = lax.select_n(picked, lax.select_n(lax.eq(x, y), zero, half), one)
            return lax.mul(g, w)

        return jvp

    return rule(for_y=False), rule(for_y=True)


max_p = binary("max", np.maximum)
defjvp(max_p, *_minmax_jvp(lax.gt))

min_p = binary("min", np.minimum)
defjvp(min_p, *_minmax_jvp(lax.lt))


def _atan2(y, x):
    return np.arctan2(y, x)


atan2_p = binary("atan2", _atan2, float_only=True)
atan2_p.ufunc = (np.arctan2, "f")
atan2_p.traits.add("transcendental")  # as pow and the libm functions of unary.py


def _atan2_jvp_y(g, y, x):
    return lax.mul(g, lax.div(x, lax.add(lax.mul(x, x), lax.mul(y, y))))


def _atan2_jvp_x(g, y, x):
    return lax.neg(lax.mul(g, lax.div(y, lax.add(lax.mul(x, x), lax.mul(y, y)))))


defjvp(atan2_p, _atan2_jvp_y, _atan2_jvp_x)


def _nextafter(x, y):
    return np.nextafter(x, y)


nextafter_p = binary("nextafter", _nextafter, float_only=True)
nextafter_p.ufunc = (np.nextafter, "f")
defjvp(nextafter_p, None, None)

# SBP facts (transforms/shard_rules.py): mul is linear in each operand on its own, div in
# its first; max/min combine partial max/min values.
mul_p.traits.add("linear_in_each")
div_p.traits.add("linear_in_first")
max_p.sbp_partial = "max"
min_p.sbp_partial = "min"
