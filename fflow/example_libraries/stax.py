"""`jax.example_libraries.stax`: layers as `(init_fun, apply_fun)` pairs.

`init_fun(rng, input_shape) -> (output_shape, params)`, `apply_fun(params, inputs, **kw)`;
`serial` chains layers (splitting the key per layer as JAX's does, so the same key gives
JAX's parameters).

Example:
    >>> import fflow, fflow.numpy as jnp
    >>> from fflow.example_libraries import stax
    >>> init, apply = stax.serial(stax.Dense(4), stax.Relu, stax.Dense(2), stax.LogSoftmax)
    >>> out_shape, params = init(fflow.random.PRNGKey(0), (-1, 3))
    >>> out_shape, apply(params, jnp.ones((5, 3))).shape
    ((-1, 2), (5, 2))
"""

import fflow.numpy as jnp
from fflow import nn, random
from fflow.nn.initializers import glorot_normal, normal


def Dense(out_dim, W_init=glorot_normal(), b_init=normal()):  # noqa: N802, N803 (JAX's names)
    """A fully connected layer: inputs @ W + b."""

    def init_fun(rng, input_shape):
        output_shape = input_shape[:-1] + (out_dim,)
        k1, k2 = random.split(rng)
        return output_shape, (W_init(k1, (input_shape[-1], out_dim)), b_init(k2, (out_dim,)))

    def apply_fun(params, inputs, **kwargs):
        W, b = params  # noqa: N806
        return jnp.dot(inputs, W) + b

    return init_fun, apply_fun


def elementwise(fun, **fun_kwargs):
    """A layer applying `fun` elementwise (no parameters)."""

    def init_fun(rng, input_shape):
        return input_shape, ()

    def apply_fun(params, inputs, **kwargs):
        return fun(inputs, **fun_kwargs)

    return init_fun, apply_fun


Tanh = elementwise(jnp.tanh)
Relu = elementwise(nn.relu)
Exp = elementwise(jnp.exp)
LogSoftmax = elementwise(nn.log_softmax, axis=-1)
Softmax = elementwise(nn.softmax, axis=-1)
Softplus = elementwise(nn.softplus)
Sigmoid = elementwise(nn.sigmoid)
Elu = elementwise(nn.elu)
LeakyRelu = elementwise(nn.leaky_relu)
Selu = elementwise(nn.selu)
Gelu = elementwise(nn.gelu)


def _flatten_init(rng, input_shape):
    size = 1
    for d in input_shape[1:]:
        size *= d
    return (input_shape[0], size), ()


Flatten = (
    _flatten_init,
    lambda params, inputs, **kwargs: jnp.reshape(inputs, (inputs.shape[0], -1)),
)
Identity = (lambda rng, input_shape: (input_shape, ()), lambda params, inputs, **kwargs: inputs)


def FanOut(num):  # noqa: N802
    """Copy the input `num` times (for `parallel`)."""
    return (lambda rng, input_shape: ([input_shape] * num, ()),
            lambda params, inputs, **kwargs: [inputs] * num)  # fmt: skip


FanInSum = (lambda rng, input_shape: (input_shape[0], ()),
            lambda params, inputs, **kwargs: sum(inputs[1:], inputs[0]))  # fmt: skip


def _concat_init(axis):
    def init_fun(rng, input_shape):
        ax = axis % len(input_shape[0])
        total = sum(shape[ax] for shape in input_shape)
        return input_shape[0][:ax] + (total,) + input_shape[0][ax + 1 :], ()

    return init_fun


def FanInConcat(axis=-1):  # noqa: N802
    """Concatenate the inputs of `parallel` branches along `axis`."""
    return _concat_init(axis), lambda params, inputs, **kwargs: jnp.concatenate(inputs, axis)


def Dropout(rate, mode="train"):  # noqa: N802
    """Keep each value with probability `rate` (scaled by 1/rate) when mode == "train"."""

    def init_fun(rng, input_shape):
        return input_shape, ()

    def apply_fun(params, inputs, **kwargs):
        rng = kwargs.get("rng", None)
        if rng is None:
            raise ValueError(
                "Dropout's apply_fun needs rng= (a PRNG key). Fix: apply_fun(params, x, rng=key)."
            )
        if mode != "train":
            return inputs
        keep = random.bernoulli(rng, rate, inputs.shape)
        return jnp.where(keep, inputs / rate, 0)

    return init_fun, apply_fun


def serial(*layers):
    """Layers applied one after another (one key per layer, split as JAX's stax does)."""
    init_funs, apply_funs = zip(*layers)
    nlayers = len(layers)

    def init_fun(rng, input_shape):
        params = []
        for init in init_funs:
            rng, layer_rng = random.split(rng)
            input_shape, param = init(layer_rng, input_shape)
            params.append(param)
        return input_shape, params

    def apply_fun(params, inputs, **kwargs):
        rng = kwargs.pop("rng", None)
        rngs = random.split(rng, nlayers) if rng is not None else (None,) * nlayers
        for fun, param, r in zip(apply_funs, params, rngs):
            inputs = fun(param, inputs, rng=r, **kwargs)
        return inputs

    return init_fun, apply_fun


def parallel(*layers):
    """Layers applied to the matching items of a list input (use after FanOut)."""
    init_funs, apply_funs = zip(*layers)
    nlayers = len(layers)

    def init_fun(rng, input_shape):
        rngs = random.split(rng, nlayers)
        return zip(*[init(r, shape) for init, r, shape in zip(init_funs, rngs, input_shape)])

    def apply_fun(params, inputs, **kwargs):
        rng = kwargs.pop("rng", None)
        rngs = random.split(rng, nlayers) if rng is not None else (None,) * nlayers
        return [f(p, x, rng=r, **kwargs) for f, p, x, r in zip(apply_funs, params, inputs, rngs)]

    return init_fun, apply_fun


def shape_dependent(make_layer):
    """A layer built from the input shape at init time."""

    def init_fun(rng, input_shape):
        return make_layer(input_shape)[0](rng, input_shape)

    def apply_fun(params, inputs, **kwargs):
        return make_layer(inputs.shape)[1](params, inputs, **kwargs)

    return init_fun, apply_fun
