# custom_jvp: a numerically stable log1pexp (from the custom derivative rules tutorial)
import jax
import jax.numpy as jnp


@jax.custom_jvp
def log1pexp(x):
    return jnp.log(1.0 + jnp.exp(x))


@log1pexp.defjvp
def log1pexp_jvp(primals, tangents):
    (x,) = primals
    (x_dot,) = tangents
    ans = log1pexp(x)
    ans_dot = (1 - 1 / (1 + jnp.exp(x))) * x_dot
    return ans, ans_dot


@jax.custom_jvp
def f(x, y):
    return jnp.sin(x) * y


f.defjvps(
    lambda x_dot, primal_out, x, y: jnp.cos(x) * x_dot * y,
    lambda y_dot, primal_out, x, y: jnp.sin(x) * y_dot,
)

result = (
    jax.grad(log1pexp)(100.0),
    jax.jit(jax.grad(log1pexp))(3.0),
    jax.vmap(jax.jit(jax.grad(log1pexp)))(jnp.arange(3.0)),
    f(2.0, 3.0),
    jax.grad(f)(2.0, 3.0),
    jax.grad(f, 1)(2.0, 3.0),
)
