# EM for a 1-D Gaussian mixture: vmapped log-densities, logsumexp responsibilities,
# a fixed number of steps in fori_loop, and a while_loop until convergence
import jax
import jax.numpy as jnp
from jax.scipy.special import logsumexp
from jax.scipy.stats import norm

key = jax.random.PRNGKey(0)
k1, k2, k3 = jax.random.split(key, 3)
data = jnp.concatenate(
    [jax.random.normal(k1, (60,)) * 0.5 - 2.0, jax.random.normal(k2, (40,)) * 0.8 + 1.5]
)
params = (jnp.array([0.5, 0.5]), jnp.array([-1.0, 1.0]), jnp.array([1.0, 1.0]))


def log_joint(params, x):
    w, mu, sigma = params
    return jnp.log(w) + jax.vmap(lambda m, s: norm.logpdf(x, m, s))(mu, sigma)


def em_step(params):
    lj = jax.vmap(lambda x: log_joint(params, x))(data)
    ll = logsumexp(lj, axis=1)
    r = jnp.exp(lj - ll[:, None])
    nk = r.sum(0)
    w = nk / data.shape[0]
    mu = (r * data[:, None]).sum(0) / nk
    sigma = jnp.sqrt((r * (data[:, None] - mu) ** 2).sum(0) / nk)
    return (w, mu, sigma), ll.sum()


fixed = jax.lax.fori_loop(0, 20, lambda i, p: em_step(p)[0], params)


def cond(state):
    p, prev, cur, i = state
    return (jnp.abs(cur - prev) > 1e-4) & (i < 200)


def body(state):
    p, prev, cur, i = state
    p, ll = em_step(p)
    return p, cur, ll, i + 1


final, _, ll, iters = jax.jit(lambda p: jax.lax.while_loop(cond, body, (p, -jnp.inf, 0.0, 0)))(
    params
)
result = (fixed, final[1], ll, iters > 2, em_step(params)[1])
