# JAX tutorial "Stateful computations": explicit state, a counter, linear regression with
# NamedTuple params updated under jit
from typing import NamedTuple

import jax
import jax.numpy as jnp

CounterState = int


class CounterV2:
    def count(self, n: CounterState) -> tuple[int, CounterState]:
        return n + 1, n + 1

    def reset(self) -> CounterState:
        return 0


counter = CounterV2()
state = counter.reset()
counts = []
for _ in range(3):
    value, state = jax.jit(counter.count)(state)
    counts.append(value)


class Params(NamedTuple):
    weight: jnp.ndarray
    bias: jnp.ndarray


def init(rng) -> Params:
    weights_key, bias_key = jax.random.split(rng)
    weight = jax.random.normal(weights_key, ())
    bias = jax.random.normal(bias_key, ())
    return Params(weight, bias)


def loss(params: Params, x: jnp.ndarray, y: jnp.ndarray) -> jnp.ndarray:
    pred = params.weight * x + params.bias
    return jnp.mean((pred - y) ** 2)


LEARNING_RATE = 0.005


@jax.jit
def update(params: Params, x: jnp.ndarray, y: jnp.ndarray) -> Params:
    grad = jax.grad(loss)(params, x, y)
    return jax.tree_util.tree_map(lambda param, g: param - g * LEARNING_RATE, params, grad)


rng = jax.random.key(42)
xs_key, noise_key = jax.random.split(rng)
xs = jax.random.normal(xs_key, (128, 1))
noise = jax.random.normal(noise_key, (128, 1)) * 0.5
ys = xs * 3 - 1 + noise

params = init(rng)
for _ in range(1000):
    params = update(params, xs, ys)
result = (
    counts,
    counts[-1].weak_type if hasattr(counts[-1], "weak_type") else None,
    params.weight,
    params.bias,
    loss(params, xs, ys),
)
