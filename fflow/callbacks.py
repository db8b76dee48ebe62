"""Host callbacks with results: `fflow.pure_callback` and `fflow.experimental.io_callback`
(JAX's `jax.pure_callback` / `jax.experimental.io_callback`).

The callback runs on the host with NumPy arrays, also under jit (the compiled program
calls it in place) and vmap (`vmap_method`: "sequential" calls it once per lane,
"expand_dims" / "broadcast_all" once with the batch dimension in front).
`result_shape_dtypes` (a pytree of `ShapeDtypeStruct`s) says what it returns; a
result of another shape or dtype raises. A pure callback may be dropped when its
result is unused; an io_callback is an effect and always runs, in program order.
Neither can be differentiated (as in JAX: wrap it in `custom_jvp` / `custom_vjp`).

Example:
    >>> import numpy as np, fflow, fflow.numpy as jnp
    >>> f = lambda x: fflow.pure_callback(np.sinc, fflow.ShapeDtypeStruct(x.shape, x.dtype), x)
    >>> fflow.jit(f)(jnp.array([0.0, 0.5])).tolist()
    [1.0, 0.6366197466850281]
"""

import numpy as np

from fflow import core, dtypes
from fflow import lax_ops as lax
from fflow.core import Primitive, ShapedArray
from fflow.errors import user_error
from fflow.transforms.autodiff import jvp_rules
from fflow.transforms.shard_rules import def_broadcast_only
from fflow.transforms.vmap import batch_rules, bdim_to_front, moveaxis, not_mapped
from fflow.tree_util import tree_flatten, tree_unflatten

VMAP_METHODS = (None, "sequential", "expand_dims", "broadcast_all", "legacy_vectorized")


class _Call:
    """The user's callback and its argument / result structure, compared by identity
    (a jit cache key holds it)."""

    def __init__(self, fn, in_tree, out_tree, name):
        self.fn, self.in_tree, self.out_tree, self.name = fn, in_tree, out_tree, name


def _impl(*args, call, result_avals, vmap_method):
    args = tree_unflatten(call.in_tree, [np.asarray(a) for a in args])
    out = call.fn(*args[0], **args[1])
    leaves, tree = tree_flatten(out)
    if tree != call.out_tree:
        raise user_error(
            TypeError,
            f"{call.name}: the callback returned {tree}, but result_shape_dtypes says "
            f"{call.out_tree}. Fix: return what result_shape_dtypes describes.",
        )
    outs = []
    for leaf, aval in zip(leaves, result_avals):
        leaf = np.asarray(leaf)
        if leaf.shape != aval.shape or leaf.dtype != aval.dtype:
            raise user_error(
                TypeError,
                f"{call.name}: the callback returned {leaf.dtype.name}{list(leaf.shape)} where "
                f"result_shape_dtypes says {aval.str_short()}. Fix: cast / reshape the "
                f"callback's result (e.g. .astype(np.{aval.dtype.name})).",
            )
        outs.append(leaf)
    return outs


def _abstract_eval(*avals, call, result_avals, vmap_method):
    return list(result_avals)


def _jvp(primals, tangents, *, call, **params):
    raise user_error(
        ValueError,
        f"{call.name} cannot be differentiated: fflow (as JAX) does not know the callback's "
        f"derivative. Fix: wrap the function calling it in fflow.custom_jvp or custom_vjp.",
    )


def _batch(vals, dims, *, call, result_avals, vmap_method):
    prim = io_callback_p if call.name == "io_callback" else pure_callback_p
    size = next(core.aval_of_value(v).shape[d] for v, d in zip(vals, dims) if d is not not_mapped)
    front = [v if d is not_mapped else moveaxis(v, d, 0) for v, d in zip(vals, dims)]
    if vmap_method in ("expand_dims", "broadcast_all", "legacy_vectorized"):
        args = []
        for v, d in zip(front, dims):
            if d is not not_mapped:
                args.append(v)
            elif vmap_method == "expand_dims":
                args.append(lax.expand_dims(v, (0,)))
            else:
                args.append(bdim_to_front(v, d, size))
        avals = tuple(ShapedArray((size,) + a.shape, a.dtype) for a in result_avals)
        outs = prim.bind(*args, call=call, result_avals=avals, vmap_method=vmap_method)
        return outs, [0] * len(outs)
    lanes = []
    for i in range(size):  # "sequential": one call per lane, in lane order
        lane = [
            v if d is not_mapped else lax.index_in_dim(v, i, 0, False) for v, d in zip(front, dims)
        ]
        lanes.append(
            prim.bind(*lane, call=call, result_avals=result_avals, vmap_method=vmap_method)
        )
    outs = [lax.concatenate([lax.expand_dims(lane[k], (0,)) for lane in lanes], 0)
            for k in range(len(result_avals))]  # fmt: skip
    return outs, [0] * len(outs)


def _primitive(name, effect):
    p = Primitive(name, multiple_results=True)
    if effect:
        p.traits.add("effect")  # DCE and CSE keep it; jit runs it in program order
    p.amp_class = "keep"  # the callback sees the dtypes it was written for
    p.def_impl(_impl)
    p.def_abstract_eval(_abstract_eval)
    jvp_rules[p] = _jvp
    batch_rules[p] = _batch
    def_broadcast_only(p, "a host callback: under shard it sees the whole (replicated) value")
    return p


pure_callback_p = _primitive("pure_callback", effect=False)
io_callback_p = _primitive("io_callback", effect=True)


def _bind(prim, name, callback, result_shape_dtypes, args, kwargs, vmap_method):
    if vmap_method not in VMAP_METHODS:
        raise user_error(
            ValueError, f"{name}: vmap_method={vmap_method!r}; use one of {VMAP_METHODS[1:]}"
        )
    leaves, in_tree = tree_flatten((args, kwargs))
    shapes, out_tree = tree_flatten(result_shape_dtypes)
    avals = tuple(ShapedArray(tuple(s.shape), dtypes.canonicalize(s.dtype)) for s in shapes)
    call = _Call(callback, in_tree, out_tree, name)
    outs = prim.bind(*leaves, call=call, result_avals=avals, vmap_method=vmap_method)
    return tree_unflatten(out_tree, outs)


def pure_callback(callback, result_shape_dtypes, *args, vmap_method=None, **kwargs):
    """Call the host function `callback(*args, **kwargs)` (NumPy arrays in and out) from
    traced code; `result_shape_dtypes` is the pytree of `ShapeDtypeStruct`s it returns."""
    return _bind(pure_callback_p, "pure_callback", callback, result_shape_dtypes, args, kwargs,
                 vmap_method or "sequential")  # fmt: skip


def io_callback(callback, result_shape_dtypes, *args, sharding=None, ordered=False, **kwargs):
    """Like `pure_callback`, for a callback with side effects: it always runs, in order."""
    return _bind(io_callback_p, "io_callback", callback, result_shape_dtypes, args, kwargs,
                 "sequential")  # fmt: skip


__all__ = ["io_callback", "io_callback_p", "pure_callback", "pure_callback_p"]
