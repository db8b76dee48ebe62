"""Elementwise unary primitives: math functions, rounding, predicates.

Each primitive: NumPy implementation, shape/dtype rule (via the registrar), JVP,
and its AMP class ("follow" inputs, "fp32" always, or "low" precision).
"""

import math

import numpy as np
from fflow.primitives.registrar import unary
from fflow.transforms.autodiff import defjvp, defjvp_with_output, deflinear, defzero

from fflow import lax_ops as lax
from fflow.core import aval_of_value
from fflow.dtypes import bool_

neg_p = unary("neg", np.negative, float_only=False)
deflinear(neg_p, lambda ct, x: [lax.neg(ct)])

sin_p = unary("sin", np.sin, c_math="sin")
defjvp(sin_p, lambda g, x: lax.mul(g, lax.cos(x)))

cos_p = unary("cos", np.cos, c_math="cos")
defjvp(cos_p, lambda g, x: lax.neg(lax.mul(g, lax.sin(x))))

tan_p = unary("tan", np.tan, amp="fp32", c_math="tan")
defjvp_with_output(
    tan_p, lambda out, xs, ts: lax.mul(ts[0], lax.add(lax.full_like(out, 1), lax.mul(out, out)))
)

asin_p = unary("asin", np.arcsin, amp="fp32", c_math="asin")
defjvp(asin_p, lambda g, x: lax.mul(g, lax.rsqrt(lax.sub(lax.full_like(x, 1), lax.mul(x, x)))))

acos_p = unary("acos", np.arccos, amp="fp32", c_math="acos")
defjvp(
    acos_p,
    lambda g, x: lax.neg(lax.mul(g, lax.rsqrt(lax.sub(lax.full_like(x, 1), lax.mul(x, x))))),
)

atan_p = unary("atan", np.arctan, c_math="atan")
defjvp(atan_p, lambda g, x: lax.div(g, lax.add(lax.full_like(x, 1), lax.mul(x, x))))

sinh_p = unary("sinh", np.sinh, amp="fp32", c_math="sinh")
defjvp(sinh_p, lambda g, x: lax.mul(g, lax.cosh(x)))

cosh_p = unary("cosh", np.cosh, amp="fp32", c_math="cosh")
defjvp(cosh_p, lambda g, x: lax.mul(g, lax.sinh(x)))

tanh_p = unary("tanh", np.tanh, c_math="tanh")
defjvp_with_output(
    tanh_p, lambda out, xs, ts: lax.mul(ts[0], lax.sub(lax.full_like(out, 1), lax.mul(out, out)))
)

asinh_p = unary("asinh", np.arcsinh)
defjvp(asinh_p, lambda g, x: lax.mul(g, lax.rsqrt(lax.add(lax.mul(x, x), lax.full_like(x, 1)))))

acosh_p = unary("acosh", np.arccosh)
defjvp(acosh_p, lambda g, x: lax.mul(g, lax.rsqrt(lax.sub(lax.mul(x, x), lax.full_like(x, 1)))))

atanh_p = unary("atanh", np.arctanh)
defjvp(atanh_p, lambda g, x: lax.div(g, lax.sub(lax.full_like(x, 1), lax.mul(x, x))))

exp_p = unary("exp", np.exp, amp="fp32", c_math="exp")
defjvp_with_output(exp_p, lambda out, xs, ts: lax.mul(ts[0], out))

exp2_p = unary("exp2", np.exp2, amp="fp32", c_math="exp2")
defjvp_with_output(
    exp2_p, lambda out, xs, ts: lax.mul(ts[0], lax.mul(out, lax.full_like(out, math.log(2.0))))
)

expm1_p = unary("expm1", np.expm1, amp="fp32", c_math="expm1")
defjvp_with_output(expm1_p, lambda out, xs, ts: lax.mul(ts[0], lax.add(out, lax.full_like(out, 1))))

log_p = unary("log", np.log, amp="fp32", c_math="log")
defjvp(log_p, lambda g, x: lax.div(g, x))

log1p_p = unary("log1p", np.log1p, amp="fp32", c_math="log1p")
defjvp(log1p_p, lambda g, x: lax.div(g, lax.add(x, lax.full_like(x, 1))))

sqrt_p = unary("sqrt", np.sqrt, c_math="sqrt")
defjvp_with_output(sqrt_p, lambda out, xs, ts: lax.div(ts[0], lax.mul(out, lax.full_like(out, 2))))


def _rsqrt(x):
    return np.asarray(1 / np.sqrt(x), dtype=x.dtype)


rsqrt_p = unary("rsqrt", _rsqrt, amp="fp32")
defjvp_with_output(
    rsqrt_p,
    lambda out, xs, ts: lax.mul(ts[0], lax.mul(lax.div(out, xs[0]), lax.full_like(out, -0.5))),
)


def _cbrt(x):
    return np.cbrt(x)


cbrt_p = unary("cbrt", _cbrt, c_math="cbrt")
cbrt_p.ufunc = (np.cbrt, "f")  # its impl for floats (see Primitive.ufunc)
defjvp_with_output(
    cbrt_p,
    lambda out, xs, ts: lax.div(ts[0], lax.mul(lax.mul(out, out), lax.full_like(out, 3))),
)


def _logistic(x):
    # 1/(1+exp(-x)) without overflow warnings for large negative x
    with np.errstate(over="ignore"):
        return np.asarray(1 / (1 + np.exp(-x)), dtype=x.dtype)


logistic_p = unary("logistic", _logistic)
defjvp_with_output(
    logistic_p,
    lambda out, xs, ts: lax.mul(ts[0], lax.mul(out, lax.sub(lax.full_like(out, 1), out))),
)

_erf_ufunc = None


def _erf(x):
    global _erf_ufunc
    if _erf_ufunc is None:
        try:
            from scipy.special import erf as _scipy_erf

            _erf_ufunc = _scipy_erf
        except ImportError:  # pragma: no cover - scipy is optional
            _erf_ufunc = np.vectorize(math.erf, otypes=[np.float64])
    return np.asarray(_erf_ufunc(x), dtype=x.dtype)


erf_p = unary("erf", _erf, amp="fp32", c_math="erf")
defjvp(
    erf_p,
    lambda g, x: lax.mul(
        g, lax.mul(lax.full_like(x, 2 / math.sqrt(math.pi)), lax.exp(lax.neg(lax.mul(x, x))))
    ),
)


# XLA's single-precision erf_inv (M. Giles' polynomials), so fflow draws the same
# normal samples as JAX; each step rounds once to float32, as an FMA does.
_ERF_INV_LT5 = (
    2.81022636e-08,
    3.43273939e-07,
    -3.5233877e-06,
    -4.39150654e-06,
    0.00021858087,
    -0.00125372503,
    -0.00417768164,
    0.246640727,
    1.50140941,
)
_ERF_INV_GE5 = (
    -0.000200214257,
    0.000100950558,
    0.00134934322,
    -0.00367342844,
    0.00573950773,
    -0.0076224613,
    0.00943887047,
    1.00167406,
    2.83297682,
)


def _erf_inv(x):
    if x.dtype == np.float64:
        try:
            from scipy.special import erfinv
        except ImportError:  # scipy is optional: refine the float32 guess with Newton
            y = _erf_inv(x.astype(np.float32)).astype(np.float64)
            for _ in range(3):
                y = y - (_erf(y) - x) / (2 / math.sqrt(math.pi) * np.exp(-y * y))
            return y
        return erfinv(x)
    x32 = np.asarray(x, np.float32)
    with np.errstate(all="ignore"):
        w = -np.log1p(-x32 * x32)
        lt = w < np.float32(5)
        w = np.where(lt, w - np.float32(2.5), np.sqrt(w) - np.float32(3)).astype(np.float64)
        p = np.where(lt, _ERF_INV_LT5[0], _ERF_INV_GE5[0]).astype(np.float32)
        for a, b in zip(_ERF_INV_LT5[1:], _ERF_INV_GE5[1:]):
            c = np.where(lt, np.float32(a), np.float32(b)).astype(np.float64)
            p = (c + p.astype(np.float64) * w).astype(np.float32)
        out = np.where(np.abs(x32) == 1, x32 * np.float32(np.inf), p * x32)
    return np.asarray(out, dtype=x.dtype)


erf_inv_p = unary("erf_inv", _erf_inv, amp="fp32")
defjvp_with_output(
    erf_inv_p,
    lambda out, xs, ts: lax.mul(
        ts[0], lax.mul(lax.full_like(out, math.sqrt(math.pi) / 2), lax.exp(lax.mul(out, out)))
    ),
)


def _abs_jvp(g, x):
    dtype = aval_of_value(x).dtype
    if dtype.kind == "c":
        # JAX: d|x| = re(conj(x) t) / |x| (0 at x == 0), a real tangent; conj(x) is
        # 2 re(x) - x and re a cast to the real dtype, as in fflow.numpy
        real = np.dtype(np.float64 if dtype.itemsize == 16 else np.float32)
        re_x = lax.convert_element_type(lax.convert_element_type(x, real), dtype)
        num = lax.convert_element_type(lax.mul(lax.sub(lax.add(re_x, re_x), x), g), real)
        ax = lax.abs(x)
        zero = lax.eq(ax, 0.0)
        safe = lax.select(zero, lax.full_like(ax, 1), ax)
        return lax.select(zero, lax.full_like(ax, 0), lax.div(num, safe))
    # JAX: select(x >= 0, g, -g), so d|x|/dx at 0 is 1
    return lax.select(lax.ge(x, lax.full_like(x, 0)), g, lax.neg(g))


def _popcount(x):
    # the set bits of x's two's-complement pattern (np.bitwise_count counts those of |x|)
    x = np.asarray(x)
    return np.bitwise_count(x.view(np.dtype(f"u{x.dtype.itemsize}"))).astype(x.dtype)


population_count_p = unary("population_count", _popcount, float_only=False)
defzero(population_count_p)

abs_p = unary("abs", np.abs, float_only=False, c_math="fabs")
defjvp(abs_p, _abs_jvp)
_abs_eval_same_dtype = abs_p.abstract_eval


def _abs_abstract_eval(x, **params):
    out = _abs_eval_same_dtype(x, **params)
    if x.dtype.kind == "c":  # |complex| is real (as np.abs gives)
        return out.update(dtype=np.dtype(np.float64 if x.dtype.itemsize == 16 else np.float32))
    return out


abs_p.abstract_eval = _abs_abstract_eval

sign_p = unary("sign", np.sign, float_only=False)
defzero(sign_p)

floor_p = unary("floor", np.floor, c_math="floor")
defzero(floor_p)

ceil_p = unary("ceil", np.ceil, c_math="ceil")
defzero(ceil_p)


def _round(x):
    # JAX's round rounds half away from zero (lax.RoundingMethod.AWAY_FROM_ZERO)
    return np.asarray(np.sign(x) * np.floor(np.abs(x) + 0.5), dtype=x.dtype)


round_p = unary("round", _round)
defzero(round_p)


def _round_even(x):
    return np.round(x)


round_even_p = unary("round_even", _round_even)
defzero(round_even_p)

is_finite_p = unary("is_finite", np.isfinite, out_dtype=bool_)
defzero(is_finite_p)


def _not(x):
    return np.logical_not(x) if x.dtype == np.bool_ else np.invert(x)


not_p = unary("not", _not, float_only=False)
defzero(not_p)


def _square(x):
    return np.square(x)


# fp32: squares of fp16 values overflow above 256 (norms, variances)
square_p = unary("square", _square, float_only=False, amp="fp32")
square_p.ufunc = (np.square, "fiu")
defjvp(square_p, lambda g, x: lax.mul(g, lax.mul(x, lax.full_like(x, 2))))


def integer_pow_by_squaring(x, n, mul=np.multiply):
    """x**n (n >= 1) by repeated squaring, as XLA lowers integer_pow: exact products
    and much faster than NumPy's float power (which calls powf per element)."""
    acc = None
    base = x
    while n:
        if n & 1:
            acc = base if acc is None else mul(acc, base)
        n >>= 1
        if n:
            base = mul(base, base)
    return acc


def _integer_pow(x, *, y):
    if y == 0:
        return np.ones_like(x)
    out = integer_pow_by_squaring(x, abs(y))
    if y < 0:
        out = 1 / out
    return np.asarray(out, dtype=x.dtype)


def _integer_pow_jvp(g, x, *, y):
    if y == 0:
        return lax.full_like(g, 0)
    return lax.mul(g, lax.mul(lax.full_like(x, y), lax.integer_pow(x, y - 1)))


integer_pow_p = unary("integer_pow", _integer_pow, float_only=False, amp="fp32")
integer_pow_p.traits.add("view")  # y == 1 returns the input itself
defjvp(integer_pow_p, _integer_pow_jvp)


def _stop_gradient(x):
    return x


stop_gradient_p = unary("stop_gradient", _stop_gradient, float_only=False)
stop_gradient_p.traits.add("view")  # returns the input itself
defzero(stop_gradient_p)


def _copy(x):
    return np.array(x)


copy_p = unary("copy", _copy, float_only=False)
deflinear(copy_p, lambda ct, x: [ct])

# Increasing functions commute with max and min, so partial max/min values pass
# through them under shard (transforms/shard_rules.py); neg swaps the two.
for _p in (exp_p, exp2_p, expm1_p, log_p, log1p_p, sqrt_p, cbrt_p, tanh_p, logistic_p, atan_p,
           sinh_p, asinh_p, erf_p, floor_p, ceil_p, round_p, round_even_p, copy_p,
           stop_gradient_p):  # fmt: skip
    _p.traits.add("monotone_up")
neg_p.traits.add("monotone_down")
# compute-bound per element (a libm call or more): the CPU backend runs large fused
# groups of them on its thread pool (lowering/native.py), the shard planner weighs them
# above plain arithmetic (transforms/shard_cost.py); pow and atan2 in binary.py
for _p in (exp_p, exp2_p, expm1_p, log_p, log1p_p, cbrt_p, tanh_p, logistic_p, atan_p, sin_p,
           cos_p, tan_p, asin_p, acos_p, sinh_p, cosh_p, erf_p):  # fmt: skip
    _p.traits.add("transcendental")
