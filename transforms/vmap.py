"""vmap: the batching transform.

A `BatchTrace` boxes values that carry an extra (batch) dimension: a
`BatchTracer` holds the batched value `val` and the position `bdim` of its batch
dimension; `bdim=None` (`not_mapped`) marks an unbatched value, which is never
boxed. Values of other traces are foreign constants (unbatched). A primitive
applied to at least one batched input runs its rule

    batch_rules[prim](args, dims, **params) -> (out, out_dim)

(lists of outs and dims for multiple-result primitives) with the parent as the
current trace; a primitive whose inputs are all unbatched is bound on the parent
unchanged. Families share rules through traits ("elementwise", "reduction",
"cumulative"); everything else registers its rule next to its definition in
primitives/<family>.py.
"""

import functools
import threading

import numpy as np
from fflow.transforms.staging import eval_program, trace_to_program

from fflow import core
from fflow import lax_ops as lax
from fflow.api_util import as_value
from fflow.core import aval_of_value, set_current_trace
from fflow.errors import api_boundary, check_keywords, user_error
from fflow.tree_util import prefix_broadcast, tree_flatten, tree_unflatten

batch_rules = {}
not_mapped = None

# Collectives over a named axis (psum, all_gather, axis_index...): the BatchTrace
# whose axis_name they name evaluates them with
# `named_axis_rules[prim](trace, vals, dims, **params) -> (out, out_dim)`.
named_axis_rules = {}

# Primitives that need no batching rule (Primitive -> the reason; walked by the coverage test).
no_batch_rule = {}


# ----------------------------------------------------------------------------
# Tracer and trace


class BatchTracer(core.Tracer):
    __slots__ = ("val", "bdim")

    def __init__(self, trace, val, bdim):
        self._trace = trace
        self.val = val
        self.bdim = bdim

    @property
    def aval(self):
        aval = aval_of_value(self.val)
        shape = aval.shape[: self.bdim] + aval.shape[self.bdim + 1 :]
        return aval.update(shape=shape)


class BatchTrace(core.Trace):
    """Runs primitives on values with one extra batch dimension of size `axis_size`."""

    def __init__(self, axis_size, axis_name=None, parent=None):
        super().__init__(parent)
        self.axis_size = axis_size
        self.axis_name = axis_name

    def lift(self, x):
        if isinstance(x, BatchTracer) and x._trace is self:
            return x.val, x.bdim
        if isinstance(x, core.Tracer):
            core.check_not_leaked(x, self)
        return x, not_mapped

    def process_primitive(self, prim, args, params):
        vals, dims = [], []
        for a in args:
            v, d = self.lift(a)
            vals.append(v)
            dims.append(d)
        if (
            self.axis_name is not None
            and prim in named_axis_rules
            and self.axis_name in params["axis_name"]
        ):
            with set_current_trace(self.parent):
                out, out_dim = named_axis_rules[prim](self, vals, dims, **params)
            return self.box(out, out_dim)
        if all(d is not_mapped for d in dims):
            with set_current_trace(self.parent):
                return prim.bind(*vals, **params)
        rule = get_batch_rule(prim)
        if rule is None:
            raise user_error(
                NotImplementedError,
                f"fflow has no batching rule (vmap) for the primitive {prim.name!r}.",
            )
        prev = _rule_axis.name
        _rule_axis.name = self.axis_name
        try:
            with set_current_trace(self.parent):
                out, out_dim = rule(vals, dims, **params)
        finally:
            _rule_axis.name = prev
        if prim.multiple_results:
            return [self.box(o, d) for o, d in zip(out, out_dim)]
        return self.box(out, out_dim)

    def box(self, val, bdim):
        if bdim is not_mapped:
            return val
        return BatchTracer(self, val, bdim)


class _RuleAxis(threading.local):
    name = None  # the axis name of the BatchTrace whose rule is running


_rule_axis = _RuleAxis()


def find_axis(name):
    """The enclosing BatchTrace named `name` (searching from the current trace), or None."""
    trace = core.current_trace()
    while trace is not None:
        if isinstance(trace, BatchTrace) and trace.axis_name == name:
            return trace
        trace = trace.parent
    return None


def get_batch_rule(prim):
    """The batching rule of `prim`: its own, or its family's (by trait)."""
    rule = batch_rules.get(prim)
    if rule is not None:
        return rule
    for trait, family_rule in _family_rules.items():
        if trait in prim.traits:
            return functools.partial(family_rule, prim)
    return None


# ----------------------------------------------------------------------------
# Helpers for rules (they run on the parent trace)


def batch_size(vals, dims):
    for v, d in zip(vals, dims):
        if d is not not_mapped:
            return aval_of_value(v).shape[d]
    raise ValueError("batch_size: no batched operand")


def moveaxis(x, src, dst):
    """Move axis `src` of `x` to position `dst` (both non-negative)."""
    if src == dst:
        return x
    ndim = aval_of_value(x).ndim
    perm = [i for i in range(ndim) if i != src]
    perm.insert(dst, src)
    return lax.transpose(x, perm)


def bdim_to_front(x, bdim, size):
    """`x` with its batch dimension first; an unbatched `x` is broadcast to `size`."""
    if bdim is not_mapped:
        return lax.broadcast(x, (size,))
    return moveaxis(x, bdim, 0)


def move_bdim(x, bdim, dst, size):
    """Put the batch dimension at `dst`, broadcasting an unbatched value."""
    if bdim is not_mapped:
        x = bdim_to_front(x, bdim, size)
        bdim = 0
    return moveaxis(x, bdim, dst)


def all_to_front(vals, dims):
    size = batch_size(vals, dims)
    return [bdim_to_front(v, d, size) for v, d in zip(vals, dims)], size


# ----------------------------------------------------------------------------
# Family rules (by trait)


def _elementwise_batch(prim, vals, dims, **params):
    """Equal-shape operands: align every batched operand's bdim, broadcast the rest.

    Operands of lower rank than the others (e.g. a scalar select predicate) are
    broadcast to the full batched shape.
    """
    batched = [(v, d) for v, d in zip(vals, dims) if d is not not_mapped]
    d0 = batched[0][1]
    if (
        len(batched) == len(vals)
        and all(d == d0 for _, d in batched)
        and len({aval_of_value(v).ndim for v, _ in batched}) == 1
    ):
        return prim.bind(*vals, **params), d0
    size = batch_size(vals, dims)
    moved = [bdim_to_front(v, d, size) if d is not not_mapped else v for v, d in zip(vals, dims)]
    # the per-example shape of the widest operand (the others are scalar predicates)
    example_shapes = [
        aval_of_value(m).shape[1:] if d is not not_mapped else aval_of_value(m).shape
        for m, d in zip(moved, dims)
    ]
    example = max(example_shapes, key=len)
    full_shape = (size,) + tuple(example)
    n = len(full_shape)
    out = []
    for m, d, shape in zip(moved, dims, example_shapes):
        rank = len(shape)
        if d is not_mapped:
            m = lax.broadcast_in_dim(m, full_shape, tuple(range(n - rank, n)))
        elif rank != n - 1:
            m = lax.broadcast_in_dim(m, full_shape, (0,) + tuple(range(n - rank, n)))
        out.append(m)
    return prim.bind(*out, **params), 0


def _reduction_batch(prim, vals, dims, *, axes, **params):
    (x,), (d,) = vals, dims
    x = moveaxis(x, d, 0)
    return prim.bind(x, axes=tuple(a + 1 for a in axes), **params), 0


def _cumulative_batch(prim, vals, dims, *, axis, **params):
    (x,), (d,) = vals, dims
    x = moveaxis(x, d, 0)
    return prim.bind(x, axis=axis + 1, **params), 0


_family_rules = {
    "elementwise": _elementwise_batch,
    "reduction": _reduction_batch,
    "cumulative": _cumulative_batch,
}


# ----------------------------------------------------------------------------
# Batching a whole program (used by the control-flow primitives)


def batch_program(program, axis_size, in_batched, instantiate):
    """Batch a closed program whose batched inputs have their batch dim first.

    Returns (new_program, out_batched); every output listed in `instantiate`
    (a bool or a list of bools) comes out batched at dim 0.
    """

    n_out = len(program.outvars)
    if isinstance(instantiate, bool):
        instantiate = [instantiate] * n_out
    out_batched = []
    in_avals = [
        a.update(shape=(axis_size,) + a.shape) if b else a
        for a, b in zip(program.in_avals, in_batched)
    ]

    axis_name = _rule_axis.name

    def f(*args):
        trace = BatchTrace(axis_size, axis_name)
        try:
            with set_current_trace(trace):
                ins = [trace.box(a, 0 if b else not_mapped) for a, b in zip(args, in_batched)]
                outs = eval_program(program, program.consts, ins)
            pairs = [trace.lift(o) for o in outs]
        finally:
            trace.finish()
        res = []
        out_batched.clear()
        for (v, d), inst in zip(pairs, instantiate):
            if d is not_mapped and not inst:
                res.append(v)
                out_batched.append(False)
            else:
                res.append(move_bdim(v, d, 0, axis_size))
                out_batched.append(True)
        return res

    new = trace_to_program(f, in_avals)
    return new, list(out_batched)


# ----------------------------------------------------------------------------
# The public API


def _arg_labels(args, kwargs, fun):
    """A readable name per leaf of (args, kwargs): 'x', 'params['w']', 'args[2][0]'."""
    try:
        import inspect

        names = list(inspect.signature(fun).parameters)
    except (TypeError, ValueError):
        names = []
    labels = []

    def walk(x, label):
        if isinstance(x, (tuple, list)) and not hasattr(x, "_fields"):
            for i, c in enumerate(x):
                walk(c, f"{label}[{i}]")
        elif isinstance(x, dict):
            for k in sorted(x):
                walk(x[k], f"{label}[{k!r}]")
        else:
            n = len(tree_flatten(x)[0])
            labels.extend([label] * n)

    for i, a in enumerate(args):
        name = names[i] if i < len(names) and names[i] not in ("args", "kwargs") else None
        walk(a, name if name else f"args[{i}]")
    for k in sorted(kwargs):
        walk(kwargs[k], k)
    return labels


def _canonical_axis(ax, ndim, label, what):
    if ax is None:
        return None
    if not isinstance(ax, (int, np.integer)) or isinstance(ax, bool):
        raise user_error(
            TypeError, f"vmap {what} entries must be ints or None, got {ax!r} for {label}"
        )
    if not -ndim <= ax < ndim:
        raise user_error(
            ValueError,
            f"vmap {what}={ax} is out of range for {label} (valid: [{-ndim}, {ndim})). "
            f"Fix: use an axis in range, or None.",
        )
    return int(ax) % ndim


@check_keywords
def vmap(fun, in_axes=0, out_axes=0, axis_name=None, axis_size=None, spmd_axis_name=None):
    """Vectorize `fun` over a batch axis of its arguments.

    Args:
        fun: function of arrays (pytrees allowed).
        in_axes: int, None or a pytree prefix of the positional arguments (a tuple
            with one entry per argument); negative ints count from the end; None
            means "not batched". Keyword arguments are batched along axis 0.
        out_axes: int, None or a pytree prefix of the output: where the batch
            axis goes in each output.
        axis_name: a name for the batch axis (for collectives).
        axis_size: the batch size; needed only when no argument is batched.
        spmd_axis_name: accepted for JAX compatibility; unused (sharding is `fflow.shard`).

    Returns:
        A function with the signature of `fun` whose outputs carry the batch axis at
        `out_axes`. Arguments mapped with different sizes raise a ValueError naming
        each argument and its size.

    Example:
        >>> import fflow, fflow.numpy as jnp
        >>> f = fflow.vmap(lambda x, y: jnp.dot(x, y), in_axes=(0, None))
        >>> f(jnp.ones((3, 2)), jnp.arange(2.0)).tolist()
        [1.0, 1.0, 1.0]
    """
    if isinstance(in_axes, list):
        in_axes = tuple(in_axes)
    if not (
        in_axes is None or isinstance(in_axes, (int, tuple, dict)) or hasattr(in_axes, "_fields")
    ):
        raise TypeError(
            f"vmap in_axes must be an int, None, or a tuple of entries corresponding to the "
            f"positional arguments passed to the function, got {in_axes!r}"
        )

    @functools.wraps(fun)
    @api_boundary
    def batched_fun(*args, **kwargs):
        if (
            isinstance(in_axes, tuple)
            and len(in_axes) != len(args)
            and not hasattr(in_axes, "_fields")
        ):
            raise user_error(
                ValueError,
                f"vmap in_axes has {len(in_axes)} entries but the function was called with "
                f"{len(args)} positional arguments. Fix: give one in_axes entry per argument.",
            )
        leaves, in_tree = tree_flatten((args, kwargs))
        leaves = [as_value(x) for x in leaves]
        axes = prefix_broadcast(in_axes, args, "vmap in_axes") + [0] * (
            len(leaves) - len(tree_flatten(args)[0])
        )
        labels = _arg_labels(args, kwargs, fun)
        dims = []
        sizes = {}
        for x, ax, label in zip(leaves, axes, labels):
            aval = aval_of_value(x)
            if ax is not None and aval.ndim == 0:
                raise user_error(
                    ValueError,
                    f"vmap was asked to map {label} over axis {ax}, but it is a scalar "
                    f"(rank 0). Fix: set its in_axes entry to None.",
                )
            d = _canonical_axis(ax, aval.ndim, label, "in_axes")
            dims.append(d)
            if d is not None:
                sizes.setdefault(aval.shape[d], []).append((label, aval.shape, d))
        if len(sizes) > 1 or (axis_size is not None and sizes and axis_size not in sizes):
            lines = [
                f"  {label} of shape {shape} has size {n} along axis {d}"
                for n, entries in sizes.items()
                for label, shape, d in entries
            ]
            if axis_size is not None:
                lines.append(f"  axis_size={axis_size}")
            raise user_error(
                ValueError,
                "vmap got inconsistent sizes for the mapped axis:\n"
                + "\n".join(lines)
                + "\nFix: make every mapped argument the same size along its in_axes "
                "entry, or set in_axes=None for arguments that are not batched.",
            )
        if sizes:
            size = next(iter(sizes))
        elif axis_size is not None:
            size = int(axis_size)
        else:
            raise user_error(
                ValueError,
                "vmap must have at least one non-None value in in_axes (or be given "
                "axis_size). Fix: map at least one argument.",
            )
        trace = BatchTrace(size, axis_name)
        out_store = []
        try:
            with set_current_trace(trace):
                ins = [trace.box(x, d) for x, d in zip(leaves, dims)]
                a, kw = tree_unflatten(in_tree, ins)
                out = fun(*a, **kw)
            out_leaves, out_tree = tree_flatten(out)
            out_store.append(out_tree)
            o_axes = prefix_broadcast(out_axes, out, "vmap out_axes")
            results = []
            for o, ax in zip(out_leaves, o_axes):
                o = as_value(o)
                v, d = trace.lift(o)
                results.append(_to_out_axis(v, d, ax, size))
        finally:
            trace.finish()
        return tree_unflatten(out_tree, results)

    return batched_fun


def _to_out_axis(v, d, ax, size):
    ndim = aval_of_value(v).ndim + (1 if d is not_mapped else 0)
    if ax is None:
        if d is not_mapped:
            return v
        raise user_error(
            ValueError,
            "vmap has out_axes=None for an output that depends on the mapped arguments "
            f"(shape {aval_of_value(v).shape} with the batch at axis {d}). Fix: give it an "
            "integer out_axes, or make the output independent of the mapped inputs.",
        )
    ax = _canonical_axis(ax, ndim, "an output", "out_axes")
    if d is not_mapped:
        v = lax.broadcast(v, (size,))
        d = 0
    return moveaxis(v, d, ax)


__all__ = [
    "vmap",
    "batch_rules",
    "BatchTrace",
    "BatchTracer",
    "not_mapped",
    "batch_program",
    "moveaxis",
    "bdim_to_front",
    "move_bdim",
    "all_to_front",
    "batch_size",
]
