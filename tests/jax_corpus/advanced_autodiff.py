# JAX "Advanced automatic differentiation": hvp, jacobians of dicts, linearize, vjp with
# has_aux, custom_jvp with defjvps, holomorphic grads, checkpoint with a policy
import jax
import jax.numpy as jnp
from jax import grad, jacfwd, jacrev, jit, jvp, vjp


def f(x):
    return jnp.sum(jnp.tanh(x) ** 2 * jnp.arange(1.0, x.shape[0] + 1))


def hvp(f, x, v):
    return jvp(grad(f), (x,), (v,))[1]


def hvp_revfwd(f, x, v):
    return grad(lambda x: jnp.vdot(grad(f)(x), v))(x)


x = jnp.array([0.1, -0.4, 0.7])
v = jnp.array([1.0, 0.5, -2.0])
hessian = jacfwd(jacrev(f))(x)


def g(params, x):
    return jnp.tanh(params["W"] @ x + params["b"])


params = {"W": jnp.array([[1.0, 2.0, 0.5], [0.3, -0.1, 0.2]]), "b": jnp.array([0.1, -0.2])}
jac_tree = jacrev(g)(params, x)

y, f_jvp = jax.linearize(jnp.sin, x)
out, vjp_fn, aux = vjp(lambda x: (jnp.cos(x) * 2, x.sum()), x, has_aux=True)


@jax.custom_jvp
def f2(x, y):
    return jnp.sin(x) * y


f2.defjvps(
    lambda x_dot, primal_out, x, y: jnp.cos(x) * x_dot * y,
    lambda y_dot, primal_out, x, y: jnp.sin(x) * y_dot,
)


def holo(z):
    return z**2 + 3 * z


policy = jax.checkpoint_policies.dots_with_no_batch_dims_saveable


@jax.checkpoint
def block(w, x):
    return jnp.sin(jnp.dot(w, x))


ck = jax.checkpoint(lambda w, x: jnp.sin(jnp.dot(w, x)), policy=policy)
W = jnp.array([[0.5, -0.2, 0.1], [0.3, 0.8, -0.5], [0.0, 0.1, 0.9]])
result = (
    hvp(f, x, v),
    hvp_revfwd(f, x, v),
    hessian,
    jac_tree,
    f_jvp(v),
    vjp_fn(jnp.ones(3)),
    aux,
    grad(f2)(2.0, 3.0),
    grad(f2, 1)(2.0, 3.0),
    jit(grad(holo, holomorphic=True))(jnp.complex64(1.0 + 2.0j)),
    grad(lambda w: block(w, x).sum())(W),
    grad(lambda w: ck(w, x).sum())(W),
    jax.hessian(lambda x: jnp.prod(x))(jnp.array([1.0, 2.0, 3.0])),
)
