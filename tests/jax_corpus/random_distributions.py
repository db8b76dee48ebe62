# More samplers: beta, gamma, dirichlet, poisson, multivariate normal, laplace, shuffle
import jax.numpy as jnp
from jax import random

k = random.PRNGKey(3)
ks = random.split(k, 8)
result = (
    random.gamma(ks[0], 2.0, (3,)),
    random.beta(ks[1], 2.0, 3.0, (3,)),
    random.dirichlet(ks[2], jnp.array([1.0, 2.0, 3.0])),
    random.poisson(ks[3], 3.0, (4,)),
    random.multivariate_normal(ks[4], jnp.zeros(2), jnp.array([[1.0, 0.5], [0.5, 2.0]]), (3,)),
    random.laplace(ks[5], (3,)),
    random.logistic(ks[6], (2,)),
    random.rademacher(ks[7], (4,)),
    random.ball(ks[0], 3, shape=(2,)),
)
