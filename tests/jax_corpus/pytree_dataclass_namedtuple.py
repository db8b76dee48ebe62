# NamedTuple and dataclass pytrees in a training-state pattern
import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp


class Params(NamedTuple):
    weight: jnp.ndarray
    bias: jnp.ndarray


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class State:
    params: Params
    step: jnp.ndarray


def init(rng):
    w_key, b_key = jax.random.split(rng)
    return Params(jax.random.normal(w_key, ()), jax.random.normal(b_key, ()))


def loss(p, x, y):
    return jnp.mean((p.weight * x + p.bias - y) ** 2)


@jax.jit
def update(state, x, y):
    grads = jax.grad(loss)(state.params, x, y)
    params = jax.tree.map(lambda p, g: p - 0.005 * g, state.params, grads)
    return State(params, state.step + 1)


rng = jax.random.key(42)
xs = jax.random.normal(rng, (128, 1))
noise = jax.random.normal(jax.random.key(1), (128, 1)) * 0.5
ys = xs * 3 - 1 + noise
state = State(init(rng), jnp.array(0))
for _ in range(50):
    state = update(state, xs, ys)
result = (state.params.weight, state.params.bias, state.step, loss(state.params, xs, ys))
