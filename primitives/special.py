"""Special functions: lgamma, digamma and polygamma (scipy.special is the
implementation, loaded on first use). Each one's derivative is the next one:
lgamma' = digamma = polygamma(0), polygamma(n)' = polygamma(n + 1)."""

import numpy as np
from fflow.primitives.registrar import unary
from fflow.transforms.autodiff import defjvp

from fflow import lax_ops as lax


def _scipy_special():
    import scipy.special

    return scipy.special


def _lgamma(x):
    return np.asarray(_scipy_special().gammaln(x), dtype=x.dtype)


def _digamma(x):
    return np.asarray(_scipy_special().psi(x), dtype=x.dtype)


lgamma_p = unary("lgamma", _lgamma, amp="fp32")
digamma_p = unary("digamma", _digamma, amp="fp32")
defjvp(lgamma_p, lambda g, x: lax.mul(g, digamma_p.bind(x)))
defjvp(digamma_p, lambda g, x: lax.mul(g, polygamma_p.bind(x, n=1)))


def _polygamma(x, *, n):
    return np.asarray(_scipy_special().polygamma(n, x), dtype=x.dtype)


polygamma_p = unary("polygamma", _polygamma, amp="fp32")
defjvp(polygamma_p, lambda g, x, *, n: lax.mul(g, polygamma_p.bind(x, n=n + 1)))
