"""Loss scaling for fp16 training, as functional state (a pytree you carry and return).

fp16 has 5 exponent bits: gradients below ~6e-8 flush to zero. Multiplying the loss
by a large scale S before differentiating shifts every gradient up by S; dividing
the (fp32) gradients by S afterwards restores them. `DynamicLossScale` picks S
itself: it starts high (2^16), halves on every step whose gradients overflow (and
that step's update is skipped), and doubles after `period` consecutive finite
steps. bf16 has fp32's exponent range and needs no scaling (`NoOpLossScale`).

Everything here is jittable: the state is arrays, decisions are `where`s.
"""

import numpy as np

from fflow import core, dtypes
from fflow import lax_ops as lax
from fflow.array import Array
from fflow.tree_util import register_pytree_node_class, tree_leaves, tree_map


def _at_least_f32(x):
    d = core.aval_of_value(x).dtype
    if dtypes.is_float(d) and d.itemsize < 4:
        return lax.convert_element_type(x, np.float32)
    return x


def _scalar(value, dtype):
    if isinstance(value, (int, float, np.number)):
        return Array(np.asarray(value, dtype))
    return value


def all_finite(tree):
    """A scalar bool: True when no floating leaf of `tree` holds an inf or a NaN.

    Example:
        >>> import fflow, fflow.numpy as jnp
        >>> bool(fflow.amp.all_finite({"w": jnp.ones(3), "b": jnp.zeros(2)}))
        True
        >>> bool(fflow.amp.all_finite([jnp.array([1.0, jnp.inf])]))
        False
    """
    out = None
    for leaf in tree_leaves(tree):
        aval = core.aval_of_value(leaf)
        if not dtypes.is_inexact(aval.dtype):
            continue
        ok = lax.is_finite(leaf)
        ok = lax.reduce_and(ok, tuple(range(aval.ndim))) if aval.ndim else ok
        out = ok if out is None else lax.bitwise_and(out, ok)
    if out is None:
        return Array(np.asarray(True))
    return out


def select_tree(pred, on_true, on_false):
    """Leafwise `where(pred, on_true, on_false)` for a scalar bool `pred`.

    Used to skip an update when the gradients overflowed:
    ``params = select_tree(finite, new_params, params)``.
    """

    def pick(a, b):
        a_aval, b_aval = core.aval_of_value(a), core.aval_of_value(b)
        if a_aval.shape != b_aval.shape or a_aval.dtype != b_aval.dtype:
            raise TypeError(
                f"select_tree: leaves differ ({a_aval.str_short()} vs {b_aval.str_short()})"
            )
        p = pred
        if a_aval.ndim:
            p = lax.broadcast_in_dim(pred, a_aval.shape, ())
        return lax.select(p, a, b)

    return tree_map(pick, on_true, on_false)


@register_pytree_node_class
class NoOpLossScale:
    """No loss scaling (bf16 and fp32 training); same interface as `DynamicLossScale`."""

    def scale(self, tree):
        return tree

    def unscale(self, tree):
        return tree

    def adjust(self, grads_finite):
        return self

    @property
    def loss_scale(self):
        return 1.0

    def tree_flatten(self):
        return [], None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls()


@register_pytree_node_class
class StaticLossScale:
    """A fixed loss scale."""

    def __init__(self, loss_scale):
        self.loss_scale = _scalar(loss_scale, np.float32)

    def scale(self, tree):
        return tree_map(lambda x: _at_least_f32(x) * self.loss_scale, tree)

    def unscale(self, tree):
        inv = 1.0 / self.loss_scale
        return tree_map(lambda g: _unscale_leaf(g, inv), tree)

    def adjust(self, grads_finite):
        return self

    def tree_flatten(self):
        return [self.loss_scale], None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(children[0])


def _unscale_leaf(g, inv):
    d = core.aval_of_value(g).dtype
    if not dtypes.is_inexact(d):
        return g
    out = _at_least_f32(g) * inv
    return lax.convert_element_type(out, d)


@register_pytree_node_class
class DynamicLossScale:
    """Dynamic loss scaling as a pytree: carry it through the training loop.

    Args:
        loss_scale: the current scale (default 2^16).
        counter: consecutive finite steps since the last change.
        period: finite steps before the scale grows (default 2000).
        factor: growth and backoff factor (default 2).
        min_loss_scale: the scale never drops below this (default 1.0).

    Example:
        >>> import fflow, fflow.numpy as jnp
        >>> ls = fflow.amp.DynamicLossScale()
        >>> float(ls.loss_scale)
        65536.0
        >>> grads = ls.unscale(fflow.grad(lambda w: ls.scale(jnp.sum(w * w)))(jnp.ones(2)))
        >>> grads.tolist()
        [2.0, 2.0]
        >>> ls = ls.adjust(fflow.amp.all_finite(grads))
        >>> int(ls.counter), float(ls.loss_scale)
        (1, 65536.0)
    """

    def __init__(self, loss_scale=2.0**16, counter=0, period=2000, factor=2, min_loss_scale=1.0):
        self.loss_scale = _scalar(loss_scale, np.float32)
        self.counter = _scalar(counter, np.int32)
        self.period = int(period)
        self.factor = factor
        self.min_loss_scale = float(min_loss_scale)

    def scale(self, tree):
        """Multiply the loss (every leaf) by the scale, in at least fp32.

        2^16 does not fit in fp16 (its max is 65504), so an fp16 loss is widened first.
        """
        return tree_map(lambda x: _at_least_f32(x) * self.loss_scale, tree)

    def unscale(self, tree):
        """Divide gradients by the scale (in fp32), returning each in its own dtype."""
        inv = 1.0 / self.loss_scale
        return tree_map(lambda g: _unscale_leaf(g, inv), tree)

    def adjust(self, grads_finite):
        """The next state: ×factor after `period` finite steps, ÷factor on overflow.

        The floor is `min_loss_scale`; a grown scale that would overflow fp32 stays put.
        """
        one = lax.full((), 1, np.int32)
        counter = lax.add(self.counter, one)
        grow = lax.ge(counter, lax.full((), self.period, np.int32))
        grown = lax.mul(self.loss_scale, lax.full((), self.factor, np.float32))
        grown = lax.select(lax.is_finite(grown), grown, self.loss_scale)
        finite_scale = lax.select(grow, grown, self.loss_scale)
        finite_counter = lax.select(grow, lax.full((), 0, np.int32), counter)
        shrunk = lax.div(self.loss_scale, lax.full((), self.factor, np.float32))
        shrunk = lax.max(shrunk, lax.full((), self.min_loss_scale, np.float32))
        new_scale = lax.select(grads_finite, finite_scale, shrunk)
        new_counter = lax.select(grads_finite, finite_counter, lax.full((), 0, np.int32))
        return DynamicLossScale(
            new_scale, new_counter, self.period, self.factor, self.min_loss_scale
        )

    def tree_flatten(self):
        return [self.loss_scale, self.counter], (self.period, self.factor, self.min_loss_scale)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(children[0], children[1], *aux)

    def __repr__(self):
        return (
            f"DynamicLossScale(loss_scale={self.loss_scale}, counter={self.counter}, "
            f"period={self.period})"
        )
