"""fflow.scipy.stats: log-densities and distribution functions (`jax.scipy.stats`
names) for norm, uniform, expon, bernoulli, poisson, beta, gamma, laplace, t,
multivariate_normal.

Example:
    >>> from fflow.scipy.stats import norm
    >>> round(float(norm.logpdf(0.0)), 4)
    -0.9189
"""

import math
import sys
import types

import numpy as np

import fflow.numpy as jnp
from fflow import lax
from fflow.numpy._util import promote_inexact
from fflow.scipy import special


def _namespace(**fns):
    # a module object, so `import fflow.scipy.stats.norm` works as `jax.scipy.stats.norm` does;
    # registered in sys.modules once the distribution's name is known (below)
    module = types.ModuleType("fflow.scipy.stats._dist")
    for name, fn in fns.items():
        setattr(module, name, fn)
    return module


def _f(*xs):
    return promote_inexact(*xs)  # Python scalars stay weak (JAX's promote_args_inexact)


def _norm_logpdf(x, loc=0, scale=1):
    x, loc, scale = _f(x, loc, scale)
    z = (x - loc) / scale
    return -0.5 * z * z - jnp.log(scale) - 0.5 * math.log(2 * math.pi)


def _norm_cdf(x, loc=0, scale=1):
    x, loc, scale = _f(x, loc, scale)
    return special.ndtr((x - loc) / scale)


def _norm_ppf(q, loc=0, scale=1):
    q, loc, scale = _f(q, loc, scale)
    return loc + scale * special.ndtri(q)


norm = _namespace(
    logpdf=_norm_logpdf,
    pdf=lambda x, loc=0, scale=1: jnp.exp(_norm_logpdf(x, loc, scale)),
    cdf=_norm_cdf,
    logcdf=lambda x, loc=0, scale=1: jnp.log(_norm_cdf(x, loc, scale)),
    sf=lambda x, loc=0, scale=1: 1 - _norm_cdf(x, loc, scale),
    ppf=_norm_ppf,
)


def _uniform_logpdf(x, loc=0, scale=1):
    x, loc, scale = _f(x, loc, scale)
    inside = jnp.logical_and(x >= loc, x <= loc + scale)
    return jnp.where(inside, -jnp.log(scale), -np.inf)


uniform = _namespace(
    logpdf=_uniform_logpdf,
    pdf=lambda x, loc=0, scale=1: jnp.exp(_uniform_logpdf(x, loc, scale)),
)


def _expon_logpdf(x, loc=0, scale=1):
    x, loc, scale = _f(x, loc, scale)
    z = (x - loc) / scale
    return jnp.where(z >= 0, -z - jnp.log(scale), -np.inf)


expon = _namespace(
    logpdf=_expon_logpdf, pdf=lambda x, loc=0, scale=1: jnp.exp(_expon_logpdf(x, loc, scale))
)


def _laplace_logpdf(x, loc=0, scale=1):
    x, loc, scale = _f(x, loc, scale)
    return -jnp.abs(x - loc) / scale - jnp.log(2 * scale)


laplace = _namespace(
    logpdf=_laplace_logpdf,
    pdf=lambda x, loc=0, scale=1: jnp.exp(_laplace_logpdf(x, loc, scale)),
)


def _bernoulli_logpmf(k, p, loc=0):
    k, p, loc = _f(k, p, loc)
    k = k - loc
    one = np.ones((), k.dtype)  # strongly typed, as JAX's: the result is never weak
    val = special.xlogy(k, p) + special.xlog1py(jnp.subtract(one, k), -p)
    return jnp.where(jnp.logical_or(k == 0, k == 1), val, -np.inf)


bernoulli = _namespace(
    logpmf=_bernoulli_logpmf, pmf=lambda k, p, loc=0: jnp.exp(_bernoulli_logpmf(k, p, loc))
)


def _poisson_logpmf(k, mu, loc=0):
    k, mu, loc = _f(k, mu, loc)
    k = k - loc
    val = special.xlogy(k, mu) - special.gammaln(k + 1) - mu
    return jnp.where(jnp.logical_and(k >= 0, k == jnp.floor(k)), val, -np.inf)


poisson = _namespace(
    logpmf=_poisson_logpmf, pmf=lambda k, mu, loc=0: jnp.exp(_poisson_logpmf(k, mu, loc))
)


def _gamma_logpdf(x, a, loc=0, scale=1):
    x, a, loc, scale = _f(x, a, loc, scale)
    y = (x - loc) / scale
    val = special.xlogy(a - 1, y) - y - special.gammaln(a) - jnp.log(scale)
    return jnp.where(y >= 0, val, -np.inf)


gamma = _namespace(
    logpdf=_gamma_logpdf,
    pdf=lambda x, a, loc=0, scale=1: jnp.exp(_gamma_logpdf(x, a, loc, scale)),
)


def _beta_logpdf(x, a, b, loc=0, scale=1):
    x, a, b, loc, scale = _f(x, a, b, loc, scale)
    y = (x - loc) / scale
    val = special.xlogy(a - 1, y) + special.xlog1py(b - 1, -y) - special.betaln(a, b)
    val = val - jnp.log(scale)
    return jnp.where(jnp.logical_and(y >= 0, y <= 1), val, -np.inf)


beta = _namespace(
    logpdf=_beta_logpdf,
    pdf=lambda x, a, b, loc=0, scale=1: jnp.exp(_beta_logpdf(x, a, b, loc, scale)),
)


def _t_logpdf(x, df, loc=0, scale=1):
    x, df, loc, scale = _f(x, df, loc, scale)
    z = (x - loc) / scale
    half = (df + 1) / 2
    out = special.gammaln(half) - special.gammaln(df / 2)
    out = out - 0.5 * jnp.log(df * math.pi) - jnp.log(scale)
    return out - half * jnp.log1p(z * z / df)


t = _namespace(
    logpdf=_t_logpdf, pdf=lambda x, df, loc=0, scale=1: jnp.exp(_t_logpdf(x, df, loc, scale))
)


def _mvn_logpdf(x, mean, cov, allow_singular=None):
    x, mean, cov = _f(x, mean, cov)
    n = mean.shape[-1]
    L = jnp.linalg.cholesky(cov)
    diff = x - mean
    batch = np.broadcast_shapes(diff.shape[:-1], L.shape[:-2])
    Lb = jnp.broadcast_to(L, batch + (n, n))
    z = jnp.linalg.solve(Lb, jnp.broadcast_to(diff, batch + (n,)))
    log_det = jnp.sum(jnp.log(jnp.diagonal(L, 0, -2, -1)), axis=-1)
    return -0.5 * jnp.sum(z * z, axis=-1) - log_det - 0.5 * n * math.log(2 * math.pi)


multivariate_normal = _namespace(
    logpdf=_mvn_logpdf,
    pdf=lambda x, mean, cov, allow_singular=None: jnp.exp(_mvn_logpdf(x, mean, cov)),
)

for _name in ("norm", "uniform", "expon", "laplace", "bernoulli", "poisson", "gamma", "beta", "t",
              "multivariate_normal"):  # fmt: skip
    _module = globals()[_name]
    _module.__name__ = f"{__name__}.{_name}"
    sys.modules[_module.__name__] = _module

del lax
