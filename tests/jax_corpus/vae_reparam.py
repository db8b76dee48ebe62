# A tiny VAE step: an encoder giving mean and log-variance, the reparameterisation trick
# with a PRNG key, a Bernoulli decoder and the ELBO's gradient, as in JAX/Flax examples
import jax
import jax.numpy as jnp

key = jax.random.PRNGKey(21)
ks = jax.random.split(key, 5)
params = {
    "enc": jax.random.normal(ks[0], (6, 4)) * 0.3,
    "dec": jax.random.normal(ks[1], (2, 6)) * 0.3,
    "dec_b": jnp.zeros(6),
}
x = (jax.random.uniform(ks[2], (5, 6)) > 0.5).astype(jnp.float32)


def elbo(params, x, key):
    h = x @ params["enc"]
    mean, logvar = jnp.split(h, 2, axis=-1)
    eps = jax.random.normal(key, mean.shape)
    z = mean + jnp.exp(0.5 * logvar) * eps
    logits = z @ params["dec"] + params["dec_b"]
    rec = -jnp.sum(jax.nn.softplus(-logits) * x + jax.nn.softplus(logits) * (1 - x), axis=-1)
    kl = -0.5 * jnp.sum(1 + logvar - mean**2 - jnp.exp(logvar), axis=-1)
    return jnp.mean(rec - kl)


val, grads = jax.jit(jax.value_and_grad(elbo))(params, x, ks[3])
samples = jax.nn.sigmoid(jax.random.normal(ks[4], (3, 2)) @ params["dec"] + params["dec_b"])
result = (
    val,
    grads["enc"][:2],
    grads["dec_b"],
    samples[0],
    jax.nn.softplus(jnp.array([-30.0, 0.0, 30.0])),
)
