# Hessian-vector products, linearize, jacobians of pytrees, value_and_grad with has_aux
import jax
import jax.numpy as jnp


def f(x):
    return jnp.sum(jnp.sin(x) * x**2)


def hvp(f, x, v):
    return jax.jvp(jax.grad(f), (x,), (v,))[1]


x = jnp.array([0.5, 1.0, 1.5])
v = jnp.array([1.0, 0.0, -1.0])
y, f_jvp = jax.linearize(jnp.sin, x)


def loss_with_aux(w):
    pred = jnp.tanh(w * 2)
    return jnp.sum(pred**2), {"pred": pred}


(val, aux), g = jax.value_and_grad(loss_with_aux, has_aux=True)(x)
jac_tree = jax.jacrev(lambda d: {"s": d["a"] * d["b"]})({"a": 2.0, "b": 3.0})
result = (
    hvp(f, x, v),
    jax.hessian(f)(x) @ v,
    f_jvp(v),
    val,
    aux["pred"],
    g,
    jac_tree,
    jax.grad(jax.grad(jax.grad(jnp.tanh)))(0.3),
    jax.jacobian(lambda x: x**2)(x),
    jax.grad(lambda x: jnp.abs(x))(0.0),
    jax.grad(lambda x: jnp.sqrt(x))(4.0),
    jax.grad(lambda z: jnp.real(z * jnp.conj(z)), holomorphic=False)(1.0),
)
