# jax.checkpoint (remat) with policies: same gradients, rematerialised
import jax
import jax.numpy as jnp


def g(W, x):
    y = jnp.dot(W, x)
    return jnp.sin(y)


def f(W1, W2, W3, x):
    x = g(W1, x)
    x = g(W2, x)
    x = g(W3, x)
    return x


key = jax.random.PRNGKey(0)
W1 = jax.random.normal(key, (5, 4))
W2 = jax.random.normal(jax.random.fold_in(key, 1), (6, 5))
W3 = jax.random.normal(jax.random.fold_in(key, 2), (7, 6))
x = jnp.ones(4)
f_remat = jax.checkpoint(f)
f_policy = jax.checkpoint(f, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
loss = lambda f: lambda *a: jnp.sum(f(*a))
result = (
    jax.grad(loss(f))(W1, W2, W3, x)[0, :2],
    jax.grad(loss(f_remat))(W1, W2, W3, x)[0, :2],
    jax.grad(loss(f_policy), argnums=3)(W1, W2, W3, x),
    jax.grad(jax.remat(jnp.sin))(1.0),
    jax.jit(jax.grad(loss(jax.checkpoint(g))))(W1, x).sum(),
)
