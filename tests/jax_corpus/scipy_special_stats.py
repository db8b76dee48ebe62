# jax.scipy.special and jax.scipy.stats in a log-likelihood
import jax
import jax.numpy as jnp
from jax.scipy import special, stats
from jax.scipy.special import logsumexp

x = jnp.linspace(-2.0, 2.0, 5)
result = (
    logsumexp(x),
    logsumexp(jnp.stack([x, 2 * x]), axis=0),
    special.expit(x),
    special.logit(jnp.array([0.2, 0.5, 0.9])),
    special.erf(x),
    special.erfc(x),
    special.gammaln(jnp.array([0.5, 1.0, 4.0])),
    special.digamma(jnp.array([1.0, 2.5])),
    special.xlogy(jnp.array([0.0, 2.0]), jnp.array([0.0, 3.0])),
    stats.norm.logpdf(x, loc=0.5, scale=2.0),
    stats.norm.cdf(x),
    stats.norm.ppf(jnp.array([0.1, 0.5, 0.975])),
    stats.multivariate_normal.logpdf(jnp.array([0.5, -0.2]), jnp.zeros(2), jnp.eye(2) * 2),
    stats.bernoulli.logpmf(jnp.array([0, 1]), 0.3),
    stats.beta.logpdf(0.3, 2.0, 3.0),
    stats.gamma.logpdf(2.0, 3.0),
    stats.poisson.logpmf(3, 2.5),
    stats.uniform.logpdf(0.5),
    stats.t.logpdf(0.3, 4.0),
    jax.grad(lambda m: -stats.norm.logpdf(x, m, 1.0).sum())(0.3),
)
