"""The optimizer interface (optax's shape) and the transformations that combine others.

A `GradientTransformation` is a pair of pure functions: `init(params) -> state` and
`update(updates, state, params=None) -> (updates, state)`; the state is a pytree, so
it passes through `jit`, `grad`, `vmap` and `shard` like the parameters do.

Example:
    >>> import fflow.numpy as jnp
    >>> from fflow import optim
    >>> tx = optim.chain(optim.clip_by_global_norm(1.0), optim.sgd(0.1))
    >>> params = {"w": jnp.array([1.0, 2.0])}
    >>> state = tx.init(params)
    >>> updates, state = tx.update({"w": jnp.array([3.0, 4.0])}, state, params)
    >>> [round(v, 4) for v in optim.apply_updates(params, updates)["w"].tolist()]
    [0.94, 1.92]
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

import fflow.numpy as jnp
from fflow.array import Array
from fflow.errors import user_error
from fflow.sharding import to_global
from fflow.tree_util import (
    prefix_broadcast,
    tree_flatten,
    tree_leaves,
    tree_map,
    tree_structure,
    tree_unflatten,
)


class GradientTransformation(NamedTuple):
    """`init(params) -> state`, `update(updates, state, params=None) -> (updates, state)`."""

    init: Callable
    update: Callable


class EmptyState(NamedTuple):
    """The state of a stateless transformation."""


# ----------------------------------------------------------------------------
# Helpers shared by every transformation


def is_global(x):
    return type(x) is Array and getattr(x, "_sharding", None) is not None


def zeros_like(p, dtype=None):
    """Zeros shaped like `p`; a global `p` gives a global array with `p`'s placement and
    SBP (so optimizer state is sharded like its parameter)."""
    return full_like(p, 0, dtype)


def full_like(p, value, dtype=None):
    dtype = np.dtype(dtype or p.dtype)
    if is_global(p):
        return to_global(jnp.full(p.shape, value, dtype), p.placement, p.sbp)
    return jnp.full(jnp.shape(p), value, dtype)


def safe_increment(count):
    """count + 1 in int32, saturating at the largest int32 (as optax)."""
    big = np.iinfo(np.int32).max
    return jnp.where(count < big, count + 1, big).astype(jnp.int32)


def as_schedule(value):
    return value if callable(value) else (lambda count: value)


def cast_like(u, p):
    return u.astype(p.dtype) if hasattr(p, "dtype") and u.dtype != p.dtype else u


# ----------------------------------------------------------------------------
# Combinators


def chain(*transforms):
    """Apply `transforms` one after the other; the state is a tuple of their states.

    Example:
        >>> from fflow import optim
        >>> tx = optim.chain(optim.scale_by_adam(), optim.scale(-1e-3))
    """

    def init(params):
        return tuple(t.init(params) for t in transforms)

    def update(updates, state, params=None):
        if len(state) != len(transforms):
            raise user_error(
                ValueError,
                f"chain: the state has {len(state)} parts but the chain has {len(transforms)} "
                "transformations. Fix: pass the state made by this chain's init.",
            )
        new_state = []
        for t, s in zip(transforms, state):
            updates, s = t.update(updates, s, params)
            new_state.append(s)
        return updates, tuple(new_state)

    return GradientTransformation(init, update)


def identity():
    """Pass updates through unchanged."""
    return GradientTransformation(lambda params: EmptyState(), lambda u, s, p=None: (u, s))


def stateless(fn):
    """A transformation from `fn(updates, params) -> updates`."""
    return GradientTransformation(lambda params: EmptyState(), lambda u, s, p=None: (fn(u, p), s))


def apply_updates(params, updates):
    """params + updates, leaf by leaf, keeping each parameter's dtype.

    Example:
        >>> import fflow.numpy as jnp
        >>> from fflow import optim
        >>> optim.apply_updates([jnp.ones(2)], [jnp.ones(2)])[0].tolist()
        [2.0, 2.0]
    """
    return tree_map(lambda p, u: None if p is None else cast_like(p + u, p), params, updates)


def global_norm(tree):
    """sqrt of the sum of squares of every leaf."""
    leaves = tree_leaves(tree)
    if not leaves:
        return jnp.zeros((), jnp.float32)
    return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in leaves))


# ----------------------------------------------------------------------------
# Simple stateless and schedule transformations


def scale(step_size):
    """updates * step_size."""
    return stateless(lambda u, p: tree_map(lambda g: g * step_size, u))


class ScaleByScheduleState(NamedTuple):
    count: Any


def scale_by_schedule(step_size_fn):
    """updates * step_size_fn(count); count starts at 0 and increments each update."""

    def init(params):
        return ScaleByScheduleState(jnp.zeros((), jnp.int32))

    def update(updates, state, params=None):
        step = step_size_fn(state.count)
        updates = tree_map(lambda g: cast_like(g * step, g), updates)
        return updates, ScaleByScheduleState(safe_increment(state.count))

    return GradientTransformation(init, update)


def scale_by_learning_rate(learning_rate, flip_sign=True):
    sign = -1.0 if flip_sign else 1.0
    if callable(learning_rate):
        return scale_by_schedule(lambda count: sign * learning_rate(count))
    return scale(sign * learning_rate)


def clip(max_delta):
    """Clip every entry of the updates to [-max_delta, max_delta]."""
    return stateless(lambda u, p: tree_map(lambda g: jnp.clip(g, -max_delta, max_delta), u))


def clip_by_global_norm(max_norm):
    """Rescale the updates so that their global norm is at most `max_norm`."""

    def fn(updates, params):
        g_norm = global_norm(updates)
        trigger = g_norm < max_norm
        # the untaken branch divides by 1, not by a zero norm
        safe = jnp.where(trigger, 1.0, g_norm)
        return tree_map(
            lambda t: jnp.where(trigger, t, cast_like(t / safe.astype(t.dtype) * max_norm, t)),
            updates,
        )

    return stateless(fn)


def _mask_tree(mask, params):
    return mask(params) if callable(mask) else mask


def add_decayed_weights(weight_decay=0.0, mask=None):
    """updates + weight_decay * params (decoupled weight decay); `mask` (a pytree of
    bools or a function of the params giving one) limits it to some parameters."""

    def fn(updates, params):
        if params is None:
            raise user_error(
                ValueError,
                "add_decayed_weights needs the parameters: call update(grads, state, params).",
            )
        return tree_map(lambda g, p: g + weight_decay * p, updates, params)

    tx = stateless(fn)
    return tx if mask is None else masked(tx, mask)


# ----------------------------------------------------------------------------
# Masks and per-label transformations


class MaskedState(NamedTuple):
    inner_state: Any


def _select(tree, mask_leaves, treedef):
    """`tree` with the unmasked leaves replaced by None (None has no leaves)."""
    leaves = tree_flatten(tree)[0]
    return tree_unflatten(treedef, [x if m else None for x, m in zip(leaves, mask_leaves)])


def _mask_leaves(mask, params):
    mask = _mask_tree(mask, params)
    leaves, treedef = tree_flatten(params)
    m_leaves = tree_flatten(mask)[0]
    if tree_structure(mask) != treedef:
        # a prefix (e.g. one bool per sub-module) broadcasts over its subtree
        m_leaves = prefix_broadcast(mask, params, "mask")
    return [bool(m) for m in m_leaves], treedef


def masked(inner, mask):
    """Apply `inner` only to the leaves where `mask` is True; the others pass through.

    Args:
        inner: a GradientTransformation.
        mask: a pytree of bools shaped like the params (or a prefix of them), or a
            function of the params returning one.
    """

    def init(params):
        m, treedef = _mask_leaves(mask, params)
        return MaskedState(inner.init(_select(params, m, treedef)))

    def update(updates, state, params=None):
        m, treedef = _mask_leaves(mask, updates if params is None else params)
        sub_p = None if params is None else _select(params, m, treedef)
        sub_u, inner_state = inner.update(_select(updates, m, treedef), state.inner_state, sub_p)
        new = tree_flatten(sub_u)[0]
        it = iter(new)
        leaves = tree_flatten(updates)[0]
        out = [next(it) if mk else u for u, mk in zip(leaves, m)]
        return tree_unflatten(treedef, out), MaskedState(inner_state)

    return GradientTransformation(init, update)


class MultiTransformState(NamedTuple):
    inner_states: Any


def multi_transform(transforms, param_labels):
    """Apply `transforms[label]` to the parameters carrying that label.

    Args:
        transforms: dict label -> GradientTransformation.
        param_labels: pytree of labels shaped like the params, or a function of the
            params returning one.
    """

    def masks(params):
        labels = param_labels(params) if callable(param_labels) else param_labels
        leaves = tree_flatten(labels)[0]
        unknown = set(leaves) - set(transforms)
        if unknown:
            raise user_error(
                ValueError,
                f"multi_transform: labels {sorted(map(str, unknown))} have no transformation. "
                f"Fix: add them to the transforms dict (it has {sorted(transforms)}).",
            )
        treedef = tree_structure(labels)
        return {k: tree_unflatten(treedef, [lab == k for lab in leaves]) for k in transforms}

    def init(params):
        ms = masks(params)
        return MultiTransformState(
            {k: masked(t, ms[k]).init(params) for k, t in transforms.items()}
        )

    def update(updates, state, params=None):
        ms = masks(updates if params is None else params)
        new_states = {}
        for k, t in transforms.items():
            updates, new_states[k] = masked(t, ms[k]).update(updates, state.inner_states[k], params)
        return updates, MultiTransformState(new_states)

    return GradientTransformation(init, update)
