"""fflow.scipy.special: `jax.scipy.special` functions over fflow primitives.

Example:
    >>> import fflow.numpy as jnp
    >>> from fflow.scipy.special import expit, logsumexp
    >>> expit(jnp.array([0.0])).tolist()
    [0.5]
    >>> round(float(logsumexp(jnp.array([0.0, 0.0]))), 5)
    0.69315
"""

import math

import numpy as np

import fflow.numpy as jnp
from fflow import lax
from fflow.numpy._util import promote, promote_inexact
from fflow.primitives.special import digamma_p, lgamma_p, polygamma_p


def _float(x):
    # JAX's promote_args_inexact: ints become the default float, Python scalars stay weak
    return promote_inexact(x)[0]


def _promote_float(x, y):
    return promote(*promote_inexact(x, y))


# -- softmax and logsumexp (fflow.nn re-exports them, as jax.nn does) --------------


def _reduce_max(x, axis, where):
    if where is None:
        return jnp.max(x, axis=axis, keepdims=True)
    return jnp.max(x, axis=axis, keepdims=True, where=where, initial=-np.inf)


def softmax(x, axis=-1, where=None, initial=None):
    """exp(x) / sum(exp(x)) along `axis`, computed with the max subtracted.

    Example:
        >>> import fflow, fflow.numpy as jnp
        >>> from fflow.scipy.special import softmax
        >>> g = fflow.grad(lambda x: softmax(x)[0])(jnp.array([1e4, 0.0]))
        >>> bool(jnp.all(jnp.isfinite(g)))
        True
    """
    x = _float(x)
    x_max = _reduce_max(x, axis, where)
    x_safe = x if where is None else jnp.where(where, x, -np.inf)
    unnormalized = jnp.exp(x_safe - lax.stop_gradient(x_max))
    total = jnp.sum(unnormalized, axis=axis, keepdims=True, where=where)
    result = unnormalized / total
    if where is not None:
        result = jnp.where(where, result, 0)
    return result


def log_softmax(x, axis=-1, where=None, initial=None):
    """x - logsumexp(x) along `axis`."""
    x = _float(x)
    x_max = _reduce_max(x, axis, where)
    x_safe = x if where is None else jnp.where(where, x, -np.inf)
    shifted = x_safe - lax.stop_gradient(x_max)
    shifted_lse = jnp.log(jnp.sum(jnp.exp(shifted), axis=axis, keepdims=True, where=where))
    result = shifted - shifted_lse
    if where is not None:
        result = jnp.where(where, result, -np.inf)
    return result


def logsumexp(a, axis=None, b=None, keepdims=False, return_sign=False, where=None):
    """log(sum(b * exp(a))) along `axis`, stable for large inputs (JAX's algorithm).

    Example:
        >>> import fflow.numpy as jnp
        >>> from fflow.scipy.special import logsumexp
        >>> round(float(logsumexp(jnp.array([1000.0, 1000.0]))), 2)
        1000.69
    """
    a = _float(a)
    if b is not None:
        a, b = jnp.broadcast_arrays(a, jnp.asarray(b, a.dtype))
    if axis is None:
        dims = tuple(range(a.ndim))
    elif isinstance(axis, (tuple, list)):
        dims = tuple(int(d) % max(a.ndim, 1) for d in axis)
    else:
        dims = (int(axis) % max(a.ndim, 1),)
    if where is None:
        amax = jnp.max(a, axis=dims, keepdims=True) if dims else a
    else:
        amax = jnp.max(a, axis=dims, keepdims=True, where=where, initial=-np.inf)
    amax = lax.stop_gradient(jnp.where(jnp.isfinite(amax), amax, jnp.zeros_like(amax)))
    exp_a = jnp.exp(a - amax)
    if b is not None:
        exp_a = exp_a * b
    sumexp = jnp.sum(exp_a, axis=dims, keepdims=keepdims, where=where)
    sign = jnp.sign(sumexp)
    sumexp = jnp.abs(sumexp)
    out = jnp.log(sumexp) + (amax if keepdims else jnp.squeeze(amax, dims))
    if return_sign:
        return out, sign
    if b is not None:
        out = jnp.where(sign < 0, np.nan, out)
    return out


def erf(x):
    return lax.erf(_float(x))


def erfc(x):
    x = _float(x)
    return 1 - lax.erf(x)


def erfinv(x):
    return lax.erf_inv(_float(x))


def expit(x):
    """The logistic sigmoid 1 / (1 + exp(-x))."""
    return lax.logistic(_float(x))


def logit(x):
    """log(x / (1 - x)), the inverse of expit."""
    x = _float(x)
    return jnp.log(x / (1 - x))


def xlogy(x, y):
    """x * log(y), defined as 0 where x == 0."""
    x, y = _promote_float(x, y)
    safe_y = jnp.where(x == 0, jnp.ones_like(y), y)
    return jnp.where(x == 0, jnp.zeros_like(x), x * jnp.log(safe_y))


def xlog1py(x, y):
    """x * log1p(y), defined as 0 where x == 0."""
    x, y = _promote_float(x, y)
    safe_y = jnp.where(x == 0, jnp.zeros_like(y), y)
    return jnp.where(x == 0, jnp.zeros_like(x), x * jnp.log1p(safe_y))


def entr(x):
    """-x * log(x) for x > 0, 0 at 0, -inf below."""
    x = _float(x)
    safe = jnp.where(x > 0, x, jnp.ones_like(x))
    return jnp.where(x > 0, -x * jnp.log(safe), jnp.where(x == 0, 0.0, -np.inf))


def ndtr(x):
    """The standard normal CDF."""
    x = _float(x)
    return 0.5 * (1 + lax.erf(x * np.asarray(1 / math.sqrt(2), x.dtype)))


def ndtri(p):
    """The inverse of the standard normal CDF."""
    p = _float(p)
    return np.asarray(math.sqrt(2), p.dtype) * lax.erf_inv(2 * p - 1)


def log_ndtr(x):
    return jnp.log(ndtr(x))


def gammaln(x):
    """log|Gamma(x)|."""
    return lgamma_p.bind(_float(x))


loggamma = gammaln


def digamma(x):
    return digamma_p.bind(_float(x))


psi = digamma


def polygamma(n, x):
    return polygamma_p.bind(_float(x), n=int(n))


def gamma(x):
    x = _float(x)
    sign = jnp.where(jnp.logical_or(x > 0, jnp.floor(x) % 2 == 0), np.asarray(1, x.dtype), -1)
    return sign * jnp.exp(gammaln(x))


def betaln(a, b):
    a, b = _promote_float(a, b)
    return gammaln(a) + gammaln(b) - gammaln(a + b)


def factorial(n, exact=False):
    return jnp.exp(gammaln(_float(n) + 1))


def multigammaln(a, d):
    a = _float(a)
    out = np.asarray(d * (d - 1) / 4 * math.log(math.pi), a.dtype)
    for j in range(d):
        out = out + gammaln(a - j / 2)
    return out


def rel_entr(x, y):
    """x log(x / y) for x, y > 0; 0 at x == 0; inf otherwise."""
    x, y = _promote_float(x, y)
    pos = jnp.logical_and(x > 0, y > 0)
    safe_x = jnp.where(pos, x, 1)
    safe_y = jnp.where(pos, y, 1)
    val = safe_x * jnp.log(safe_x / safe_y)
    return jnp.where(pos, val, jnp.where(jnp.logical_and(x == 0, y >= 0), 0.0, np.inf))


def kl_div(x, y):
    x, y = _promote_float(x, y)
    return rel_entr(x, y) - x + y


# the public names: jax's (jax.scipy.special) that fflow has
__all__ = [
    "betaln",
    "digamma",
    "entr",
    "erf",
    "erfc",
    "erfinv",
    "expit",
    "factorial",
    "gamma",
    "gammaln",
    "kl_div",
    "log_ndtr",
    "log_softmax",
    "loggamma",
    "logit",
    "logsumexp",
    "multigammaln",
    "ndtr",
    "ndtri",
    "polygamma",
    "rel_entr",
    "softmax",
    "xlog1py",
    "xlogy",
]


def __dir__():
    return list(__all__)
