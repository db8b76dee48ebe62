"""Mixed-precision training state in the optimizer: fp32 master weights and a dynamic
loss scale, with overflowed steps skipped.

`mixed_precision(inner)` wraps any optimizer. Its state holds an fp32 copy of every
parameter (the master weights: the model itself may be bf16/fp16), the inner
optimizer's state (which sees only fp32 master weights and fp32 gradients), the loss
scale S and counters. The training step multiplies its loss by `state.loss_scale`
before differentiating; `update` divides the gradients by S, and when any of them
is inf/NaN the step is skipped (master weights and inner state unchanged) and S is
divided by `factor`; after `period` finite steps in a row S is multiplied by
`factor`. The returned updates move each parameter to its (rounded) master weight.
Everything is `where`s on arrays, so it runs under `jit`, `shard` and `amp`.

Example:
    >>> import fflow.numpy as jnp
    >>> from fflow import optim
    >>> tx = optim.mixed_precision(optim.sgd(1.0), init_scale=4.0)
    >>> p = jnp.array([1.0], jnp.bfloat16)
    >>> s = tx.init(p)
    >>> u, s = tx.update(jnp.array([jnp.inf], jnp.bfloat16), s, p)  # overflow: skipped
    >>> optim.apply_updates(p, u).tolist(), float(s.loss_scale), int(s.skipped)
    ([1.0], 2.0, 1)
    >>> u, s = tx.update(jnp.array([1.0]), s, p)  # 1.0 / S = 0.5: a step of -0.5
    >>> optim.apply_updates(p, u).tolist(), s.master.tolist()
    ([0.5], [0.5])
"""

from typing import Any, NamedTuple

import fflow.numpy as jnp
from fflow import dtypes
from fflow.optim.base import GradientTransformation
from fflow.tree_util import tree_leaves, tree_map


class MixedPrecisionState(NamedTuple):
    master: Any  # fp32 copy of the parameters
    inner_state: Any  # the wrapped optimizer's state (over the master weights)
    loss_scale: Any  # f32 scalar: multiply the loss by it before differentiating
    good_steps: Any  # int32: finite steps since the scale last changed
    skipped: Any  # int32: overflowed (skipped) steps so far


def _f32(x):
    return x.astype(jnp.float32) if dtypes.is_float(x.dtype) else x  # bf16 included


def mixed_precision(inner, init_scale=2.0**15, period=2000, factor=2.0, min_scale=1.0,
                    dynamic=True):  # fmt: skip
    """Wrap `inner` with fp32 master weights and a (dynamic) loss scale.

    Args:
        inner: the optimizer applied to the fp32 master weights.
        init_scale: the first loss scale (use 1.0 with `dynamic=False` for bf16, whose
            exponent range is fp32's).
        period: finite steps in a row before the scale grows by `factor`.
        factor: growth and backoff factor.
        min_scale: the scale never drops below this.
        dynamic: False keeps the scale fixed (overflowed steps are still skipped).
    """

    def init(params):
        master = tree_map(lambda p: _f32(jnp.asarray(p)), params)
        zero = jnp.zeros((), jnp.int32)
        scale = jnp.asarray(init_scale, jnp.float32)
        return MixedPrecisionState(master, inner.init(master), scale, zero, zero)

    def update(grads, state, params=None):
        inv = 1.0 / state.loss_scale
        grads = tree_map(lambda g: _f32(g) * inv, grads)
        finite = jnp.array(True)
        for g in tree_leaves(grads):
            finite = jnp.logical_and(finite, jnp.all(jnp.isfinite(g)))
        # an inf/NaN gradient would poison the inner state even where it is not kept
        safe = tree_map(lambda g: jnp.where(finite, g, jnp.zeros_like(g)), grads)
        step, new_inner = inner.update(safe, state.inner_state, state.master)
        master = tree_map(
            lambda m, u: jnp.where(finite, m + u.astype(m.dtype), m), state.master, step
        )
        inner_state = tree_map(lambda a, b: jnp.where(finite, a, b), new_inner, state.inner_state)
        scale, good = _next_scale(state, finite)
        skipped = (state.skipped + jnp.logical_not(finite).astype(jnp.int32)).astype(jnp.int32)
        base = master if params is None else params
        # p + (master - p) in fp32 is the master weight; apply_updates rounds it to p's dtype
        updates = tree_map(lambda m, p: m - _f32(jnp.asarray(p)), master, base)
        return updates, MixedPrecisionState(master, inner_state, scale, good, skipped)

    def _next_scale(state, finite):
        if not dynamic:
            return state.loss_scale, state.good_steps
        good = state.good_steps + 1
        grow = good >= period
        grown = state.loss_scale * factor
        grown = jnp.where(jnp.isfinite(grown), grown, state.loss_scale)
        shrunk = jnp.maximum(state.loss_scale / factor, jnp.float32(min_scale))
        scale = jnp.where(finite, jnp.where(grow, grown, state.loss_scale), shrunk)
        good = jnp.where(jnp.logical_and(finite, jnp.logical_not(grow)), good, 0)
        return scale.astype(jnp.float32), good.astype(jnp.int32)

    return GradientTransformation(init, update)
