# Per-example gradients: vmap(grad) with in_axes, out_axes and a batched loss
import jax
import jax.numpy as jnp

key = jax.random.PRNGKey(1)
w = jax.random.normal(key, (3,))
xs = jnp.arange(12.0).reshape(4, 3) / 10
ys = jnp.array([0.5, -0.5, 1.0, 0.0])


def loss(w, x, y):
    return (jnp.tanh(x @ w) - y) ** 2


per_ex = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(w, xs, ys)
mean_grad = jax.grad(lambda w: jax.vmap(loss, (None, 0, 0))(w, xs, ys).mean())(w)
transposed = jax.vmap(lambda x: x * 2, in_axes=1, out_axes=1)(xs)
dict_batch = jax.vmap(lambda d: d["a"] + d["b"], in_axes=({"a": 0, "b": None},))(
    {"a": jnp.arange(3.0), "b": 1.0}
)
nested = jax.vmap(jax.vmap(lambda a, b: a * b, (0, None)), (None, 0))(
    jnp.arange(3.0), jnp.arange(2.0)
)
result = (
    per_ex,
    mean_grad,
    per_ex.mean(0),
    transposed,
    dict_batch,
    nested,
    jax.vmap(jnp.sum, axis_size=None)(xs),
)
