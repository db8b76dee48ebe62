"""Modules as pytrees (Equinox's model): a module is a dataclass whose dynamic fields
(arrays, sub-modules, lists of them) are pytree children and whose `static` fields
(sizes, activation functions, flags) are part of the tree structure. Every transform
therefore applies to a model directly: `grad(loss)(model, x)` returns a model of
gradients, `jit` caches on the static fields, `shard` takes `sbp_of(model)`.

Modules are immutable after `__init__`; use `replace` or `tree_at` for a changed copy.

Example:
    >>> import fflow, fflow.numpy as jnp
    >>> from fflow import nn
    >>> class Scale(nn.Module):
    ...     w: object
    ...     name: str = nn.field(static=True)
    ...     def __init__(self, n):
    ...         self.w = jnp.ones(n)
    ...         self.name = "scale"
    ...     def __call__(self, x):
    ...         return self.w * x
    >>> m = Scale(3)
    >>> g = fflow.grad(lambda m, x: jnp.sum(m(x)))(m, jnp.arange(3.0))
    >>> type(g).__name__, g.w.tolist()
    ('Scale', [0.0, 1.0, 2.0])
"""

import dataclasses
import math
import threading

import numpy as np

from fflow.core import Tracer
from fflow.errors import user_error
from fflow.tree_util import (
    keystr,
    prefix_broadcast,
    register_pytree_node,
    tree_flatten,
    tree_flatten_with_path,
    tree_leaves,
    tree_unflatten,
)

_init_state = threading.local()


def field(*, static=False, sbp=None, **kwargs):
    """A module field; `static=True` makes it part of the tree structure (not a leaf).

    `sbp` annotates an array field with the SBP its parameter takes under `shard`.
    """
    metadata = dict(kwargs.pop("metadata", None) or {})
    metadata["static"] = static
    if sbp is not None:
        metadata["sbp"] = sbp
    return dataclasses.field(metadata=metadata, **kwargs)


def static_field(**kwargs):
    return field(static=True, **kwargs)


def _fields(cls):
    dyn = tuple(f.name for f in dataclasses.fields(cls) if not f.metadata.get("static"))
    sta = tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("static"))
    return dyn, sta


def _new(cls, values):
    obj = object.__new__(cls)
    for name, value in values.items():
        object.__setattr__(obj, name, value)
    return obj


class Module:
    """Base class of layers: subclasses become dataclasses registered as pytrees."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # a hand-written __init__ here or in a parent module wins over a generated one
        custom_init = any("__init__" in c.__dict__ for c in cls.__mro__[:-1] if c is not Module)
        dataclasses.dataclass(eq=False, repr=False, init=not custom_init)(cls)
        init = cls.__init__

        def __init__(self, *args, _init=init, **kw):
            depth = getattr(_init_state, "depth", 0)
            _init_state.depth = depth + 1
            try:
                _init(self, *args, **kw)
            finally:
                _init_state.depth = depth
            if depth == 0:
                missing = [n for n in _fields(type(self))[0] + _fields(type(self))[1]
                           if n not in self.__dict__]  # fmt: skip
                if missing:
                    raise user_error(
                        TypeError,
                        f"{type(self).__name__}.__init__ did not set field(s) {missing}. "
                        "Fix: assign every declared field in __init__ (None is allowed).",
                    )

        cls.__init__ = __init__
        dyn, sta = _fields(cls)

        def flatten(m):
            return [m.__dict__[n] for n in dyn], tuple(m.__dict__[n] for n in sta)

        def unflatten(aux, children):
            return _new(cls, {**dict(zip(dyn, children)), **dict(zip(sta, aux))})

        register_pytree_node(cls, flatten, unflatten)

    def __setattr__(self, name, value):
        if getattr(_init_state, "depth", 0) == 0:
            raise user_error(
                dataclasses.FrozenInstanceError,
                f"cannot set {type(self).__name__}.{name}: modules are immutable. "
                f"Fix: m = m.replace({name}=...) returns a changed copy.",
            )
        object.__setattr__(self, name, value)

    def replace(self, **changes):
        """A copy with some fields replaced (dataclasses.replace without re-running
        __init__)."""
        names = set(_fields(type(self))[0] + _fields(type(self))[1])
        unknown = set(changes) - names
        if unknown:
            raise user_error(TypeError, f"{type(self).__name__} has no field(s) {sorted(unknown)}")
        return _new(type(self), {**self.__dict__, **changes})

    def __repr__(self):
        return summary(self, table=False)

    # parameters this module annotates with an SBP: {field name: sbp}; layers fill it
    def param_sbp(self):
        out = {}
        for f in dataclasses.fields(self):
            if "sbp" in f.metadata:
                out[f.name] = f.metadata["sbp"]
        return out


# ----------------------------------------------------------------------------
# Filters, partition/combine, counting


def is_array(x):
    return hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, type)


def is_inexact_array(x):
    return (
        is_array(x)
        and np.dtype(x.dtype).kind in "fc"
        or (is_array(x) and str(x.dtype) == "bfloat16")
    )


def _filter_leaves(filter_spec, tree):
    leaves, treedef = tree_flatten(tree)
    if callable(filter_spec):
        return [bool(filter_spec(x)) for x in leaves], leaves, treedef
    return [bool(m) for m in prefix_broadcast(filter_spec, tree, "filter")], leaves, treedef


def partition(tree, filter_spec=is_inexact_array):
    """Split `tree` in two trees of its structure: the leaves `filter_spec` selects, and
    the others (None marks the holes). `combine` undoes it.

    Args:
        tree: a model (any pytree).
        filter_spec: a function leaf -> bool, or a pytree (prefix) of bools.

    Example:
        >>> import fflow.numpy as jnp
        >>> from fflow import nn
        >>> train, frozen = nn.partition({"a": jnp.ones(1), "b": 3}, nn.is_array)
        >>> train["b"] is None, frozen["a"] is None
        (True, True)
    """
    mask, leaves, treedef = _filter_leaves(filter_spec, tree)
    left = tree_unflatten(treedef, [x if m else None for x, m in zip(leaves, mask)])
    right = tree_unflatten(treedef, [None if m else x for x, m in zip(leaves, mask)])
    return left, right


def combine(*trees):
    """Merge trees of one structure, taking each leaf from the first tree where it is
    not None (the inverse of `partition`)."""
    flat = [tree_flatten(t, is_leaf=lambda x: x is None) for t in trees]
    treedef = flat[0][1]
    out = []
    for values in zip(*[f[0] for f in flat]):
        out.append(next((v for v in values if v is not None), None))
    return tree_unflatten(treedef, out)


def count_params(tree, filter_spec=is_array):
    """The number of scalar parameters in the (array) leaves of `tree`."""
    return int(sum(math.prod(np.shape(x)) for x in tree_leaves(tree) if filter_spec(x)))


# ----------------------------------------------------------------------------
# SBP annotations


def _annotate(node, default):
    """`node` with each array leaf replaced by its SBP annotation (or `default`)."""
    if isinstance(node, Module):
        notes = node.param_sbp()
        values = {}
        for name in _fields(type(node))[0]:
            child = node.__dict__[name]
            if child is None:
                values[name] = None
            elif is_array(child):
                note = notes.get(name)
                values[name] = default if note is None else note
            else:
                values[name] = _annotate(child, default)
        values.update({n: node.__dict__[n] for n in _fields(type(node))[1]})
        return _new(type(node), values)
    if type(node) in (list, tuple):
        return type(node)(_annotate(c, default) for c in node)
    if type(node) is dict:
        return {k: _annotate(v, default) for k, v in node.items()}
    if is_array(node) or isinstance(node, Tracer):
        return default
    leaves, treedef = tree_flatten(node)
    return tree_unflatten(treedef, [_annotate(x, default) for x in leaves])


def sbp_of(model, default=None):
    """The SBP annotations of `model`'s parameters, as a pytree of its structure to pass
    as (part of) `in_sbp`/`out_sbp` of `fflow.shard`. Unannotated parameters get
    `default`: None (in `in_sbp`: broadcast, or the SBP a global array already has; in
    `out_sbp`: the planner's choice), or e.g. `fflow.sbp.broadcast` to pin them.

    Example:
        >>> import fflow
        >>> from fflow import nn
        >>> S = fflow.sbp.split
        >>> lin = nn.Linear(4, 8, key=fflow.random.PRNGKey(0), sbp=S(1))
        >>> spec = nn.sbp_of(lin)
        >>> spec.weight, spec.bias
        (S(1), None)
    """
    return _annotate(model, default)


# ----------------------------------------------------------------------------
# Printed summary


def _sbp_str(s):
    if s is None:
        return ""
    if isinstance(s, (tuple, list)):
        return "(" + ", ".join(str(x) for x in s) + ")"
    return str(s)


def _walk(node, path, out):
    """(path, array, sbp note) of every array leaf, in tree order."""
    if isinstance(node, Module):
        notes = node.param_sbp()
        for name in _fields(type(node))[0]:
            child = node.__dict__[name]
            if is_array(child):
                out.append((f"{path}.{name}", child, notes.get(name)))
            elif child is not None:
                _walk(child, f"{path}.{name}", out)
        return out
    for p, x in tree_flatten_with_path(node, is_leaf=lambda x: isinstance(x, Module))[0]:
        if isinstance(x, Module):
            _walk(x, path + keystr(p), out)
        elif is_array(x):
            out.append((path + keystr(p), x, None))
    return out


def summary(model, table=True):
    """A table of the parameters of `model`: path, shape, dtype, count and SBP.

    Example:
        >>> import fflow
        >>> from fflow import nn
        >>> print(nn.summary(nn.Linear(2, 3, key=fflow.random.PRNGKey(0))))
        parameter  shape   dtype    count  sbp
        ---------  ------  -------  -----  ---
        .weight    (2, 3)  float32      6
        .bias      (3,)    float32      3
        total: 9 parameters (36 B)
    """
    if not table:
        dyn, sta = _fields(type(model))
        d = model.__dict__
        parts = [f"{n}={d[n]!r}" for n in sta if not callable(d[n])]
        parts += [f"{n}={_short(d[n])}" for n in dyn if is_array(d[n])]
        parts += [f"{n}=..." for n in dyn if not is_array(d[n]) and d[n] is not None]
        return f"{type(model).__name__}({', '.join(parts)})"
    rows, nbytes, total = [], 0, 0
    for path, x, note in _walk(model, "", []):
        n = math.prod(np.shape(x))
        total += n
        nbytes += n * np.dtype(x.dtype).itemsize
        rows.append((path, str(tuple(np.shape(x))), str(x.dtype), str(n), _sbp_str(note)))
    head = ("parameter", "shape", "dtype", "count", "sbp")
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(5)]

    def line(r):
        cells = [r[i].rjust(widths[i]) if i == 3 else r[i].ljust(widths[i]) for i in range(5)]
        return "  ".join(cells).rstrip()

    out = [line(head), line(tuple("-" * w for w in widths))] + [line(r) for r in rows]
    out.append(f"total: {total:,} parameters ({_bytes(nbytes)})")
    return "\n".join(out)


def _short(x):
    return f"{x.dtype}{list(np.shape(x))}"


def _bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
