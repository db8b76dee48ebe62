# custom_vjp: gradient clipping and a fixed point solver's implicit gradient
from functools import partial

import jax
import jax.numpy as jnp


@jax.custom_vjp
def clip_gradient(lo, hi, x):
    return x


def clip_gradient_fwd(lo, hi, x):
    return x, (lo, hi)


def clip_gradient_bwd(res, g):
    lo, hi = res
    return (None, None, jnp.clip(g, lo, hi))


clip_gradient.defvjp(clip_gradient_fwd, clip_gradient_bwd)


def clip_sin(x):
    x = clip_gradient(-0.75, 0.75, x)
    return jnp.sin(x)


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def scale_grad(factor, x):
    return x


def scale_fwd(factor, x):
    return x, None


def scale_bwd(factor, res, g):
    return (factor * g,)


scale_grad.defvjp(scale_fwd, scale_bwd)

xs = jnp.linspace(-3.0, 3.0, 7)
result = (
    jax.vmap(jax.grad(clip_sin))(xs),
    jax.grad(lambda x: scale_grad(3.0, x) ** 2)(2.0),
    jax.jit(jax.grad(clip_sin))(0.1),
)
