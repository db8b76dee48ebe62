"""SBP of optimizer state: each state leaf takes its parameter's SBP; with `zero=True`
a broadcast parameter's state is split over the mesh instead (ZeRO stage 1), so each
device keeps 1/n of it and the planner turns the gradient all-reduce into a
reduce-scatter plus an all-gather of the new parameters.

Example:
    >>> import fflow, fflow.numpy as jnp
    >>> from fflow import optim
    >>> pl = fflow.placement("cpu", [0, 1])
    >>> B = fflow.sbp.broadcast
    >>> params = {"w": jnp.zeros((4, 3))}
    >>> sbp = optim.state_sbp(optim.adam(1e-3), params, {"w": B}, pl, zero=True)
    >>> sbp[0].mu, sbp[0].count
    ({'w': (S(0),)}, (B,))
"""

import numpy as np

from fflow.optim.base import GradientTransformation
from fflow.primitives.sbp_constraint import tracing
from fflow.sharding import Broadcast, SbpParallel, Split, as_nd_sbp, is_global, to_global
from fflow.transforms.ad_api import ShapeDtypeStruct, eval_shape
from fflow.transforms.shard import with_sbp
from fflow.tree_util import prefix_broadcast, tree_flatten, tree_unflatten

# distinct fake sizes identify which parameter a state leaf belongs to
_TAG = 1_000_003


def _zero_split(shape, nd, hierarchy):
    """Replace broadcast mesh axes by a split on the first dimension that divides."""
    nd = list(nd)
    local = list(shape)
    for axis, s in enumerate(nd):
        if isinstance(s, Split):
            local[s.axis] //= hierarchy[axis]
    for axis, s in enumerate(nd):
        if not isinstance(s, Broadcast) or hierarchy[axis] == 1:
            continue
        for dim, size in enumerate(local):
            if size % hierarchy[axis] == 0 and size >= hierarchy[axis]:
                nd[axis] = Split(dim)
                local[dim] //= hierarchy[axis]
                break
    return tuple(nd)


def state_sbp(tx, params, param_sbp, placement, zero=False):
    """The SBP pytree of `tx.init(params)` for the parameters' SBPs, to pass to `shard`.

    Args:
        tx: a GradientTransformation.
        params: the parameters (arrays or ShapeDtypeStructs).
        param_sbp: a pytree like `params` of SBPs (one per leaf; a tuple per mesh axis
            on an N-D placement); None leaves mean broadcast.
        placement: the placement the step runs on.
        zero: split the state of broadcast parameters over the mesh (ZeRO-1).

    Returns:
        A pytree shaped like the optimizer state, of N-D SBP tuples.
    """
    leaves, treedef = tree_flatten(params)
    sbp_leaves = _sbp_leaves(param_sbp, params, placement)
    fakes = [ShapeDtypeStruct((_TAG + i,), np.dtype(leaf.dtype)) for i, leaf in enumerate(leaves)]
    shapes, state_def = tree_flatten(eval_shape(tx.init, tree_unflatten(treedef, fakes)))
    out = []
    broadcast = (Broadcast(),) * placement.ndim
    for s in shapes:
        i = s.shape[0] - _TAG if len(s.shape) == 1 else -1
        if 0 <= i < len(leaves):
            nd = sbp_leaves[i]
            if zero:
                nd = _zero_split(np.shape(leaves[i]), nd, placement.hierarchy)
            out.append(nd)
        else:
            out.append(broadcast)
    return tree_unflatten(state_def, out)


def _sbp_leaves(param_sbp, params, placement):
    def is_leaf(s):
        return (
            s is None
            or isinstance(s, SbpParallel)
            or isinstance(s, tuple)
            and len(s) == placement.ndim
            and all(isinstance(x, SbpParallel) for x in s)
        )

    spec_leaves, spec_def = tree_flatten(param_sbp, is_leaf=is_leaf)
    marked = tree_unflatten(spec_def, [_Leaf(s) for s in spec_leaves])
    out = []
    for s in prefix_broadcast(marked, params, "param_sbp"):
        s = s.sbp if isinstance(s, _Leaf) else s
        out.append((Broadcast(),) * placement.ndim if s is None else as_nd_sbp(s, placement.ndim))
    return out


class _Leaf:
    __slots__ = ("sbp",)

    def __init__(self, sbp):
        self.sbp = sbp


def zero(inner):
    """ZeRO-1 for any optimizer: its state is split over the mesh (as
    `state_sbp(inner, ..., zero=True)`), without passing state SBPs to `shard`.

    `init` on global parameters gives state already split (the SBP of a state leaf is
    its parameter's, with broadcast mesh axes split: `_zero_split`); inside `shard`,
    `init` and `update` constrain each state leaf to that split with `with_sbp`, so
    `shard(step, pl, in_sbp=(param_sbp, None, ...))` keeps the split state from step
    to step. Inside `shard` a parameter's own SBP is not known while tracing, so the
    split there assumes broadcast (data-parallel) parameters; for tensor-parallel
    parameters pass `state_sbp(..., zero=True)` to `shard` as the state's SBP. Outside
    `shard` on local arrays it is `inner` unchanged: same numbers.

    Example:
        >>> import fflow, fflow.numpy as jnp
        >>> from fflow import optim
        >>> pl = fflow.placement("cpu", [0, 1])
        >>> p = {"w": fflow.to_global(jnp.ones((4, 3)), pl, fflow.sbp.broadcast)}
        >>> tx = optim.adam(1e-3, zero=True)
        >>> tx.init(p)[0].mu["w"].sbp
        (S(0),)
    """

    def constrain(state, params):
        leaves = tree_flatten(params)[0]
        glob = [x for x in leaves if is_global(x)]
        if tracing.stack:
            pl, sbps = tracing.stack[-1], None
        elif glob:
            pl = glob[0].placement
            sbps = tree_unflatten(
                tree_flatten(params)[1],
                [x.sbp if is_global(x) and x.placement == pl else None for x in leaves],
            )
        else:
            return state  # local arrays, not sharded: nothing to split
        spec = state_sbp(inner, params, sbps, pl, zero=True)
        spec_leaves = tree_flatten(spec, is_leaf=_is_nd)[0]
        state_leaves, state_def = tree_flatten(state)
        out = []
        for x, s in zip(state_leaves, spec_leaves):
            if tracing.stack or is_global(x):
                x = with_sbp(x, s)
            else:
                x = with_sbp(to_global(x, pl, (Broadcast(),) * pl.ndim), s)
            out.append(x)
        return tree_unflatten(state_def, out)

    def init(params):
        return constrain(inner.init(params), params)

    def update(grads, state, params=None):
        updates, state = inner.update(grads, state, params)
        return updates, constrain(state, grads if params is None else params)

    return GradientTransformation(init, update)


def _is_nd(s):
    return isinstance(s, tuple) and s and all(isinstance(x, SbpParallel) for x in s)
