# Unadjusted Langevin dynamics for a Bayesian logistic regression: grad of a log
# posterior, keys folded per step, samples collected with scan
import jax
import jax.numpy as jnp

key = jax.random.PRNGKey(11)
kx, kw, ks = jax.random.split(key, 3)
X = jax.random.normal(kx, (50, 3))
w_true = jnp.array([1.0, -2.0, 0.5])
y = (jax.nn.sigmoid(X @ w_true) > 0.5).astype(jnp.float32)


def log_post(w):
    logits = X @ w
    ll = jnp.sum(y * jax.nn.log_sigmoid(logits) + (1 - y) * jax.nn.log_sigmoid(-logits))
    return ll - 0.5 * jnp.sum(w**2)


def step(w, i, eps=1e-2):
    noise = jax.random.normal(jax.random.fold_in(ks, i), w.shape)
    w = w + eps * jax.grad(log_post)(w) + jnp.sqrt(2 * eps) * noise
    return w, w


w0 = jnp.zeros(3)
_, samples = jax.jit(lambda w: jax.lax.scan(step, w, jnp.arange(200)))(w0)
result = (
    samples[-1],
    samples[100:].mean(0),
    log_post(samples[-1]),
    jax.hessian(log_post)(w0)[0],
    jax.random.fold_in(ks, 3),
)
