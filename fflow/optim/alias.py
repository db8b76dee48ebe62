"""The usual optimizers as chains of scalings (optax's definitions and defaults).

`learning_rate` is a float or a schedule (a function of the step count).

Example:
    >>> import fflow, fflow.numpy as jnp
    >>> from fflow import optim
    >>> params = jnp.array([1.0, -2.0])
    >>> tx = optim.adamw(1e-2)
    >>> state = tx.init(params)
    >>> grads = fflow.grad(lambda p: jnp.sum(p**2))(params)
    >>> updates, state = tx.update(grads, state, params)
    >>> [round(v, 4) for v in optim.apply_updates(params, updates).tolist()]
    [0.99, -1.99]
"""

from fflow.optim.base import add_decayed_weights, chain, identity, scale_by_learning_rate
from fflow.optim.scalers import (
    scale_by_adam,
    scale_by_lion,
    scale_by_rms,
    scale_by_rss,
    scale_by_stddev,
    scale_by_trust_ratio,
    trace,
)
from fflow.optim.sharding import zero as _zero_tx


def sgd(learning_rate, momentum=None, nesterov=False, accumulator_dtype=None, zero=False):
    """Stochastic gradient descent, with optional (Nesterov) momentum."""
    mom = identity() if momentum is None else trace(momentum, nesterov, accumulator_dtype)
    return _zero(zero, chain(mom, scale_by_learning_rate(learning_rate)))


def adam(
    learning_rate,
    b1=0.9,
    b2=0.999,
    eps=1e-8,
    eps_root=0.0,
    mu_dtype=None,
    nesterov=False,
    zero=False,
):
    """Adam (Kingma & Ba, 2014)."""
    return _zero(
        zero,
        chain(
            scale_by_adam(b1, b2, eps, eps_root, mu_dtype, nesterov),
            scale_by_learning_rate(learning_rate),
        ),
    )


def adamw(
    learning_rate,
    b1=0.9,
    b2=0.999,
    eps=1e-8,
    eps_root=0.0,
    mu_dtype=None,
    weight_decay=1e-4,
    mask=None,
    nesterov=False,
    zero=False,
):
    """Adam with decoupled weight decay (Loshchilov & Hutter); `mask` picks the decayed
    parameters (a pytree of bools or a function of the params)."""
    return _zero(
        zero,
        chain(
            scale_by_adam(b1, b2, eps, eps_root, mu_dtype, nesterov),
            add_decayed_weights(weight_decay, mask),
            scale_by_learning_rate(learning_rate),
        ),
    )


def lamb(
    learning_rate, b1=0.9, b2=0.999, eps=1e-6, eps_root=0.0, weight_decay=0.0, mask=None, zero=False
):
    """LAMB: Adam with decoupled decay scaled by each layer's trust ratio."""
    return _zero(
        zero,
        chain(
            scale_by_adam(b1, b2, eps, eps_root),
            add_decayed_weights(weight_decay, mask),
            scale_by_trust_ratio(),
            scale_by_learning_rate(learning_rate),
        ),
    )


def lion(learning_rate, b1=0.9, b2=0.99, mu_dtype=None, weight_decay=1e-3, mask=None, zero=False):
    """Lion (Chen et al., 2023): the sign of an interpolated momentum."""
    return _zero(
        zero,
        chain(
            scale_by_lion(b1, b2, mu_dtype),
            add_decayed_weights(weight_decay, mask),
            scale_by_learning_rate(learning_rate),
        ),
    )


def rmsprop(
    learning_rate,
    decay=0.9,
    eps=1e-8,
    initial_scale=0.0,
    centered=False,
    momentum=None,
    nesterov=False,
    zero=False,
):
    """RMSProp (centered: divide by the running standard deviation instead)."""
    scaler = scale_by_stddev if centered else scale_by_rms
    return _zero(
        zero,
        chain(
            scaler(decay, eps, initial_scale),
            scale_by_learning_rate(learning_rate),
            identity() if momentum is None else trace(momentum, nesterov),
        ),
    )


def adagrad(learning_rate, initial_accumulator_value=0.1, eps=1e-7, zero=False):
    """Adagrad: divide by the root of the summed squared gradients."""
    return _zero(
        zero,
        chain(scale_by_rss(initial_accumulator_value, eps), scale_by_learning_rate(learning_rate)),
    )


def _zero(on, tx):
    """`zero=True`: the optimizer's state is ZeRO-split under `shard` (`optim.zero`)."""
    return _zero_tx(tx) if on else tx
