# In the spirit of JAX's "Autodidax" / "JAX as a library" examples: forward-mode by
# jvp, jacobian-vector and vector-jacobian products on a pytree function, jacfwd vs
# jacrev agreement, and vmap of grad with in_axes on dict inputs
import jax
import jax.numpy as jnp


def f(params, x):
    return jnp.tanh(params["a"] * x + params["b"]) ** 2 + jnp.sin(params["a"]) * x


params = {"a": jnp.float32(0.7), "b": jnp.float32(-0.3)}
xs = jnp.linspace(-2.0, 2.0, 5)
y, tangent = jax.jvp(
    lambda p: f(p, xs), (params,), ({"a": jnp.float32(1.0), "b": jnp.float32(0.0)},)
)
y2, vjp_fn = jax.vjp(lambda p: f(p, xs), params)
cot = vjp_fn(jnp.ones_like(xs))
jf = jax.jacfwd(f)(params, xs)
jr = jax.jacrev(f)(params, xs)
per_x = jax.vmap(jax.grad(f), in_axes=(None, 0))(params, xs)
dx = jax.vmap(jax.grad(f, argnums=1), in_axes=(None, 0))(params, xs)
hx = jax.vmap(jax.hessian(f, argnums=1), in_axes=(None, 0))(params, xs)
result = (y, tangent, cot, jf, jnp.abs(jf["a"] - jr["a"]).max() < 1e-5, per_x, dx, hx)
