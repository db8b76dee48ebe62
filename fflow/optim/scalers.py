"""Stateful gradient scalings (the building blocks of the optimizers in alias.py).

Each follows optax's formula and state layout (`count`, `mu`, `nu`...), so the
numbers equal optax's on the same gradient sequence.

Example:
    >>> import fflow.numpy as jnp
    >>> from fflow import optim
    >>> tx = optim.scale_by_adam()
    >>> u, s = tx.update([jnp.array([2.0])], tx.init([jnp.zeros(1)]))
    >>> round(float(u[0][0]), 4)  # the first Adam step is sign(g)
    1.0
"""

from typing import Any, NamedTuple

import fflow.numpy as jnp
from fflow.optim.base import (
    EmptyState,
    GradientTransformation,
    cast_like,
    full_like,
    safe_increment,
    zeros_like,
)
from fflow.tree_util import tree_map


def _moment(updates, moments, decay, order):
    return tree_map(lambda g, t: (1 - decay) * (g**order) + decay * t, updates, moments)


def _bias_correction(moment, decay, count):
    correction = 1 - decay ** count.astype(jnp.float32)
    return tree_map(lambda t: t / correction.astype(t.dtype), moment)


class TraceState(NamedTuple):
    trace: Any


def trace(decay, nesterov=False, accumulator_dtype=None):
    """Momentum: t = g + decay * t; the update is t (or g + decay * t with nesterov)."""

    def init(params):
        return TraceState(tree_map(lambda p: zeros_like(p, accumulator_dtype), params))

    def update(updates, state, params=None):
        new_trace = tree_map(lambda g, t: g + decay * t, updates, state.trace)
        if nesterov:
            updates = tree_map(lambda g, t: g + decay * t, updates, new_trace)
        else:
            updates = new_trace
        return updates, TraceState(new_trace)

    return GradientTransformation(init, update)


class ScaleByAdamState(NamedTuple):
    count: Any
    mu: Any
    nu: Any


def scale_by_adam(b1=0.9, b2=0.999, eps=1e-8, eps_root=0.0, mu_dtype=None, nesterov=False):
    """Adam's scaling: m_hat / (sqrt(v_hat + eps_root) + eps)."""

    def init(params):
        mu = tree_map(lambda p: zeros_like(p, mu_dtype), params)
        nu = tree_map(zeros_like, params)
        return ScaleByAdamState(jnp.zeros((), jnp.int32), mu, nu)

    def update(updates, state, params=None):
        mu = _moment(updates, state.mu, b1, 1)
        nu = _moment(updates, state.nu, b2, 2)
        count = safe_increment(state.count)
        if nesterov:
            mu_hat = tree_map(
                lambda m, g: (
                    b1 * m / (1 - b1 ** (count + 1).astype(jnp.float32))
                    + (1 - b1) * g / (1 - b1 ** count.astype(jnp.float32))
                ),
                mu,
                updates,
            )
        else:
            mu_hat = _bias_correction(mu, b1, count)
        nu_hat = _bias_correction(nu, b2, count)
        updates = tree_map(lambda m, v: m / (jnp.sqrt(v + eps_root) + eps), mu_hat, nu_hat)
        mu = tree_map(lambda m, p: cast_like(m, p), mu, state.mu)
        return updates, ScaleByAdamState(count, mu, nu)

    return GradientTransformation(init, update)


class ScaleByRmsState(NamedTuple):
    nu: Any


class ScaleByRStdDevState(NamedTuple):
    mu: Any
    nu: Any


def scale_by_rms(decay=0.9, eps=1e-8, initial_scale=0.0):
    """g / sqrt(nu + eps) with nu an exponential moving average of g^2 (RMSProp)."""

    def init(params):
        return ScaleByRmsState(tree_map(lambda p: full_like(p, initial_scale), params))

    def update(updates, state, params=None):
        nu = _moment(updates, state.nu, decay, 2)
        updates = tree_map(lambda g, n: g * jnp.reciprocal(jnp.sqrt(n + eps)), updates, nu)
        return updates, ScaleByRmsState(nu)

    return GradientTransformation(init, update)


def scale_by_stddev(decay=0.9, eps=1e-8, initial_scale=0.0):
    """Centered RMSProp: g / sqrt(nu - mu^2 + eps)."""

    def init(params):
        mu = tree_map(zeros_like, params)
        nu = tree_map(lambda p: full_like(p, initial_scale), params)
        return ScaleByRStdDevState(mu, nu)

    def update(updates, state, params=None):
        mu = _moment(updates, state.mu, decay, 1)
        nu = _moment(updates, state.nu, decay, 2)
        updates = tree_map(
            lambda g, m, n: g * jnp.reciprocal(jnp.sqrt(n - m**2 + eps)), updates, mu, nu
        )
        return updates, ScaleByRStdDevState(mu, nu)

    return GradientTransformation(init, update)


class ScaleByRssState(NamedTuple):
    sum_of_squares: Any


def scale_by_rss(initial_accumulator_value=0.1, eps=1e-7):
    """Adagrad's scaling: g / sqrt(sum of g^2 + eps) (0 where the sum is 0)."""

    def init(params):
        return ScaleByRssState(tree_map(lambda p: full_like(p, initial_accumulator_value), params))

    def update(updates, state, params=None):
        sos = tree_map(lambda g, s: g * g + s, updates, state.sum_of_squares)
        inv = tree_map(
            lambda s: jnp.where(s > 0, jnp.reciprocal(jnp.sqrt(s + eps)), 0.0).astype(s.dtype), sos
        )
        return tree_map(lambda s, g: s * g, inv, updates), ScaleByRssState(sos)

    return GradientTransformation(init, update)


class ScaleByLionState(NamedTuple):
    count: Any
    mu: Any


def scale_by_lion(b1=0.9, b2=0.99, mu_dtype=None):
    """Lion's update: sign((1 - b1) g + b1 mu); mu follows g with decay b2."""

    def init(params):
        return ScaleByLionState(
            jnp.zeros((), jnp.int32), tree_map(lambda p: zeros_like(p, mu_dtype), params)
        )

    def update(updates, state, params=None):
        new = tree_map(lambda g, m: jnp.sign((1.0 - b1) * g + b1 * m), updates, state.mu)
        mu = _moment(updates, state.mu, b2, 1)
        return new, ScaleByLionState(safe_increment(state.count), mu)

    return GradientTransformation(init, update)


def scale_by_trust_ratio(min_norm=0.0, trust_coefficient=1.0, eps=0.0):
    """LAMB/LARS layer-wise trust ratio ||p|| / ||u|| (1 where either norm is 0)."""

    def norm(x):
        return jnp.maximum(jnp.sqrt(jnp.sum(jnp.square(x))), min_norm)

    def fn(u, p):
        p_norm, u_norm = norm(p), norm(u)
        ratio = trust_coefficient * p_norm / (u_norm + eps)
        ratio = jnp.where((p_norm == 0.0) | (u_norm == 0.0), 1.0, ratio)
        return cast_like(u * ratio, u)

    def update(updates, state, params=None):
        return tree_map(fn, updates, params), state

    return GradientTransformation(lambda params: EmptyState(), update)
