"""Gradient accumulation (`MultiSteps` applies the inner optimizer every k steps) and
`apply_if_finite` (skip steps whose gradients overflowed).

Example:
    >>> import fflow.numpy as jnp
    >>> from fflow import optim
    >>> tx = optim.MultiSteps(optim.sgd(1.0), every_k_schedule=2)
    >>> s = tx.init(jnp.zeros(1))
    >>> u, s = tx.update(jnp.array([2.0]), s)   # accumulated, no step yet
    >>> u.tolist()
    [0.0]
    >>> u, s = tx.update(jnp.array([4.0]), s)   # the mean gradient is applied
    >>> u.tolist()
    [-3.0]
"""

from typing import Any, NamedTuple

import fflow.numpy as jnp
from fflow.optim.base import GradientTransformation, as_schedule, zeros_like
from fflow.tree_util import tree_leaves, tree_map


class MultiStepsState(NamedTuple):
    mini_step: Any
    gradient_step: Any
    inner_opt_state: Any
    acc_grads: Any


class MultiSteps:
    """Accumulate `every_k_schedule` mini-batch gradients, then update once.

    The inner update is computed every call and selected with `where` (no Python
    branching on traced values, so it works under `jit` and `shard`).

    Args:
        opt: the inner GradientTransformation.
        every_k_schedule: an int k, or a function of the gradient step giving k.
        use_grad_mean: average the accumulated gradients (True) or sum them.
    """

    def __init__(self, opt, every_k_schedule, use_grad_mean=True):
        self.inner = opt
        self.every_k = as_schedule(every_k_schedule)
        self.use_grad_mean = use_grad_mean

    def init(self, params):
        return MultiStepsState(
            jnp.zeros((), jnp.int32),
            jnp.zeros((), jnp.int32),
            self.inner.init(params),
            tree_map(zeros_like, params),
        )

    def update(self, updates, state, params=None):
        k = self.every_k(state.gradient_step)
        if self.use_grad_mean:
            n = (state.mini_step + 1).astype(jnp.float32)
            acc = tree_map(lambda g, a: a + (g - a) / n.astype(a.dtype), updates, state.acc_grads)
        else:
            acc = tree_map(lambda g, a: a + g, updates, state.acc_grads)
        final = state.mini_step >= k - 1
        inner_updates, inner_state = self.inner.update(acc, state.inner_opt_state, params)

        def pick(new, old):
            return jnp.where(final, new, old)

        out = tree_map(lambda u: pick(u, jnp.zeros_like(u)), inner_updates)
        new_state = MultiStepsState(
            jnp.where(final, 0, state.mini_step + 1).astype(jnp.int32),
            jnp.where(final, state.gradient_step + 1, state.gradient_step).astype(jnp.int32),
            tree_map(pick, inner_state, state.inner_opt_state),
            tree_map(lambda a: pick(jnp.zeros_like(a), a), acc),
        )
        return out, new_state

    def has_updated(self, state):
        """True right after a step that applied the inner optimizer."""
        return state.mini_step == 0

    def gradient_transformation(self):
        return GradientTransformation(self.init, self.update)


class ApplyIfFiniteState(NamedTuple):
    notfinite_count: Any
    last_finite: Any
    total_notfinite: Any
    inner_state: Any


def apply_if_finite(inner, max_consecutive_errors):
    """Skip the update (zeros, inner state unchanged) when a gradient is inf/NaN, e.g.
    an fp16 step whose loss scale overflowed; after `max_consecutive_errors` bad steps
    in a row the inner update is applied anyway (optax's semantics).

    Example:
        >>> import fflow.numpy as jnp
        >>> from fflow import optim
        >>> tx = optim.apply_if_finite(optim.sgd(1.0), max_consecutive_errors=3)
        >>> u, s = tx.update(jnp.array([jnp.inf]), tx.init(jnp.zeros(1)))
        >>> u.tolist(), int(s.total_notfinite)
        ([0.0], 1)
    """

    def init(params):
        zero = jnp.zeros((), jnp.int32)
        return ApplyIfFiniteState(zero, jnp.array(True), zero, inner.init(params))

    def update(updates, state, params=None):
        leaves = tree_leaves(updates)
        finite = jnp.array(True)
        for g in leaves:
            finite = jnp.logical_and(finite, jnp.all(jnp.isfinite(g)))
        new_updates, new_inner = inner.update(updates, state.inner_state, params)
        count = jnp.where(finite, 0, state.notfinite_count + 1).astype(jnp.int32)
        apply = jnp.logical_or(finite, count > max_consecutive_errors)
        out = tree_map(lambda u: jnp.where(apply, u, jnp.zeros_like(u)), new_updates)
        inner_state = tree_map(lambda a, b: jnp.where(apply, a, b), new_inner, state.inner_state)
        total = (state.total_notfinite + jnp.logical_not(finite).astype(jnp.int32)).astype(
            jnp.int32
        )
        return out, ApplyIfFiniteState(count, finite, total, inner_state)

    return GradientTransformation(init, update)
