"""Pytrees: nested tuples, lists, dicts (sorted keys), None, namedtuples, dataclasses
and registered classes. Every transform works on flat lists of leaves.

Example:
    >>> from fflow.tree_util import tree_flatten, tree_unflatten
    >>> leaves, treedef = tree_flatten({"b": (1, 2), "a": [3]})
    >>> leaves
    [3, 1, 2]
    >>> tree_unflatten(treedef, [x * 10 for x in leaves])
    {'a': [30], 'b': (10, 20)}
"""

import collections
import dataclasses
import functools

from fflow.errors import user_error

_registry = {}  # type -> (flatten(x) -> (children, aux), unflatten(aux, children))


def register_pytree_node(cls, flatten_func, unflatten_func):
    """Register `cls` as a pytree node type (JAX's signature)."""
    _registry[cls] = (flatten_func, unflatten_func)
    return cls


_key_registry = {}  # type -> flatten_with_keys(x) -> ([(key, child), ...], aux)


def register_pytree_with_keys(cls, flatten_with_keys, unflatten_func, flatten_func=None):
    """Register `cls` with key paths: `flatten_with_keys(x) -> ([(key, child)...], aux)`."""

    def flatten(x):
        pairs, aux = flatten_with_keys(x)
        return [c for _, c in pairs], aux

    register_pytree_node(cls, flatten_func or flatten, unflatten_func)
    _key_registry[cls] = flatten_with_keys
    return cls


def register_pytree_with_keys_class(cls):
    """Class decorator: `tree_flatten_with_keys()` and `tree_unflatten(aux, children)`."""
    flatten = getattr(cls, "tree_flatten", None)
    return register_pytree_with_keys(
        cls,
        lambda x: x.tree_flatten_with_keys(),
        cls.tree_unflatten,
        None if flatten is None else (lambda x: x.tree_flatten()),
    )


def register_static(cls):
    """Register `cls` as a node with no children: its instances are static structure."""
    register_pytree_node(cls, lambda x: ((), x), lambda aux, _: aux)
    return cls


def register_pytree_node_class(cls):
    """Class decorator: uses `tree_flatten()` and `tree_unflatten(aux, children)`."""
    register_pytree_node(cls, lambda x: x.tree_flatten(), cls.tree_unflatten)
    return cls


def register_dataclass(cls, data_fields=None, meta_fields=()):
    """Register a dataclass; by default every field is a child."""
    if data_fields is None:
        data_fields = [f.name for f in dataclasses.fields(cls) if f.name not in meta_fields]

    def flatten(x):
        return [getattr(x, n) for n in data_fields], tuple(getattr(x, n) for n in meta_fields)

    def unflatten(aux, children):
        kwargs = dict(zip(data_fields, children))
        kwargs.update(zip(meta_fields, aux))
        return cls(**kwargs)

    def flatten_with_keys(x):  # key paths name the fields (`.x`), as JAX's
        children, aux = flatten(x)
        return [(GetAttrKey(n), c) for n, c in zip(data_fields, children)], aux

    return register_pytree_with_keys(cls, flatten_with_keys, unflatten, flatten)


def _is_namedtuple(x):
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


class PyTreeDef:
    """The structure of a pytree: node kind, auxiliary data and children."""

    __slots__ = ("kind", "aux", "children", "num_leaves", "_hash")

    def __init__(self, kind, aux, children):
        self.kind = kind
        self.aux = aux
        self.children = children
        self.num_leaves = 1 if kind == "leaf" else sum(c.num_leaves for c in children)
        self._hash = None

    def __eq__(self, other):
        return (
            isinstance(other, PyTreeDef)
            and self.kind == other.kind
            and self.aux == other.aux
            and self.children == other.children
        )

    def __hash__(self):
        if self._hash is None:
            self._hash = hash((self.kind, _hashable(self.aux), tuple(self.children)))
        return self._hash

    def __repr__(self):
        if self.kind == "leaf":
            return "*"
        if self.kind == "none":
            return "None"
        inner = ", ".join(map(repr, self.children))
        if self.kind == "dict":
            inner = ", ".join(f"{k!r}: {c!r}" for k, c in zip(self.aux, self.children))
            return "{" + inner + "}"
        if self.kind == "tuple":
            return f"({inner}{',' if len(self.children) == 1 else ''})"
        if self.kind == "list":
            return f"[{inner}]"
        name = getattr(self.kind, "__name__", str(self.kind))
        return f"{name}({inner})"

    def unflatten(self, leaves):
        return tree_unflatten(self, leaves)


def _hashable(aux):
    try:
        hash(aux)
        return aux
    except TypeError:
        return repr(aux)


LEAF = PyTreeDef("leaf", None, ())
NONE = PyTreeDef("none", None, ())


def _flatten(x, leaves, is_leaf):
    if is_leaf is not None and is_leaf(x):
        leaves.append(x)
        return LEAF
    t = type(x)
    if x is None:
        return NONE
    if t is tuple:
        return PyTreeDef("tuple", None, tuple(_flatten(c, leaves, is_leaf) for c in x))
    if t is list:
        return PyTreeDef("list", None, tuple(_flatten(c, leaves, is_leaf) for c in x))
    if t is dict:
        keys = sorted(x)
        return PyTreeDef("dict", tuple(keys), tuple(_flatten(x[k], leaves, is_leaf) for k in keys))
    entry = _registry.get(t)
    if entry is not None:
        children, aux = entry[0](x)
        return PyTreeDef(t, aux, tuple(_flatten(c, leaves, is_leaf) for c in children))
    if _is_namedtuple(x):
        return PyTreeDef(t, None, tuple(_flatten(c, leaves, is_leaf) for c in x))
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        names = tuple(f.name for f in dataclasses.fields(x))
        return PyTreeDef(
            ("dataclass", t), names, tuple(_flatten(getattr(x, n), leaves, is_leaf) for n in names)
        )
    if isinstance(x, dict):  # OrderedDict (insertion order, as in JAX), defaultdict...
        keys = _dictlike_keys(x)
        factory = getattr(x, "default_factory", None)
        return PyTreeDef(
            ("dictlike", t, factory),
            tuple(keys),
            tuple(_flatten(x[k], leaves, is_leaf) for k in keys),
        )
    leaves.append(x)
    return LEAF


def _dictlike_keys(x):
    return list(x) if isinstance(x, collections.OrderedDict) else sorted(x)


def tree_flatten(tree, is_leaf=None):
    """(leaves, treedef) of a pytree."""
    leaves = []
    treedef = _flatten(tree, leaves, is_leaf)
    return leaves, treedef


def _unflatten(treedef, it):
    kind = treedef.kind
    if kind == "leaf":
        return next(it)
    if kind == "none":
        return None
    children = [_unflatten(c, it) for c in treedef.children]
    if kind == "tuple":
        return tuple(children)
    if kind == "list":
        return children
    if kind == "dict":
        return dict(zip(treedef.aux, children))
    if isinstance(kind, tuple) and kind[0] == "dataclass":
        return kind[1](**dict(zip(treedef.aux, children)))
    if isinstance(kind, tuple) and kind[0] == "dictlike":
        out = kind[1](kind[2]) if kind[2] is not None else kind[1]()
        out.update(zip(treedef.aux, children))
        return out
    entry = _registry.get(kind)
    if entry is not None:
        return entry[1](treedef.aux, children)
    return kind(*children)  # namedtuple


def tree_unflatten(treedef, leaves):
    """Rebuild a pytree of structure `treedef` from `leaves`."""
    leaves = list(leaves)
    if len(leaves) != treedef.num_leaves:
        raise ValueError(
            f"tree_unflatten: structure {treedef} needs {treedef.num_leaves} leaves, "
            f"got {len(leaves)}"
        )
    return _unflatten(treedef, iter(leaves))


def tree_node(x):
    """`(token, children)` of `x` when it is a registered class or a namedtuple node, as
    `tree_flatten` takes it apart, else None. Equal tokens mean equal node kinds, aux
    data and child counts (jit's flat cache key; None too when the aux is unhashable).
    """
    t = type(x)
    entry = _registry.get(t)
    if entry is not None:
        children, aux = entry[0](x)
        try:
            hash(aux)
        except TypeError:
            return None
        if type(children) not in (list, tuple):
            children = list(children)
        return (t, aux, len(children)), children
    if _is_namedtuple(x):
        return (t, len(x)), x
    return None


def tree_rebuilder(treedef):
    """`leaves -> tree_unflatten(treedef, leaves)` compiled to one expression (no walk
    over the treedef per call; new containers each call), or None when `treedef` has
    dataclass or dict-like (OrderedDict...) nodes. jit rebuilds outputs with it.

    Example:
        >>> from fflow.tree_util import tree_rebuilder, tree_structure
        >>> tree_rebuilder(tree_structure([(1, 2), {"a": 3}, None]))([10, 20, 30])
        [(10, 20), {'a': 30}, None]
    """
    consts = {}
    count = [0]

    def expr(td):
        kind = td.kind
        if kind == "leaf":
            count[0] += 1
            return f"o[{count[0] - 1}]"
        if kind == "none":
            return "None"
        inner = [expr(c) for c in td.children]
        if None in inner:
            return None
        if kind == "tuple":
            return "(" + ", ".join(inner) + ("," if len(inner) == 1 else "") + ")"
        if kind == "list":
            return "[" + ", ".join(inner) + "]"
        if kind == "dict":
            keys = [f"k{len(consts) + j}" for j in range(len(inner))]
            consts.update(zip(keys, td.aux))
            return "{" + ", ".join(f"{k}: {e}" for k, e in zip(keys, inner)) + "}"
        if type(kind) is not type:  # dataclasses, dictlike: the generic rebuild
            return None
        n = len(consts)
        if kind in _registry:  # unflatten(aux, children), as _unflatten calls it
            consts[f"u{n}"], consts[f"a{n}"] = _registry[kind][1], td.aux
            return f"u{n}(a{n}, [{', '.join(inner)}])"
        consts[f"t{n}"] = kind  # a namedtuple
        return f"t{n}({', '.join(inner)})"

    body = expr(treedef)
    return None if body is None else eval(f"lambda o: {body}", consts)  # noqa: S307


def tree_leaves(tree, is_leaf=None):
    return tree_flatten(tree, is_leaf)[0]


def tree_structure(tree, is_leaf=None):
    return tree_flatten(tree, is_leaf)[1]


def tree_map(f, tree, *rest, is_leaf=None):
    """Apply `f` to corresponding leaves of `tree` and of each tree in `rest`.

    As in JAX, `tree` need only be a prefix of each tree in `rest`: where `tree` has
    a leaf, `f` gets the whole corresponding subtree of the others.
    """
    leaves, treedef = tree_flatten(tree, is_leaf)
    others = []
    for r in rest:
        r_leaves, r_def = tree_flatten(r, is_leaf)
        if r_def != treedef:
            r_leaves = flatten_up_to(treedef, r)
        others.append(r_leaves)
    return tree_unflatten(treedef, [f(*xs) for xs in zip(leaves, *others)])


def flatten_up_to(treedef, tree):
    """The subtrees of `tree` at the leaves of `treedef` (`treedef` must be a prefix)."""
    out = []
    _up_to(treedef, tree, out, treedef)
    return out


def _up_to(node, x, out, whole):
    if node.kind == "leaf":
        out.append(x)
        return
    if node.kind == "none":
        if x is not None:
            raise user_error(
                ValueError, f"Tree structure mismatch: expected None, got {x!r}; tree: {whole}"
            )
        return
    here = _flatten(x, [], lambda y: y is not x)  # one level: children stay leaves
    if here.kind != node.kind or here.aux != node.aux or len(here.children) != len(node.children):
        raise user_error(
            ValueError,
            f"Tree structure mismatch: {whole} is not a prefix of the other tree "
            f"(at a {type(x).__name__} node). Fix: pass trees whose structures match.",
        )
    for child_def, child in zip(node.children, _node_children(x, here)):
        _up_to(child_def, child, out, whole)


def _node_children(x, here):
    leaves = []
    _flatten(x, leaves, lambda y: y is not x)
    return leaves


def tree_reduce(f, tree, initializer=None, is_leaf=None):
    leaves = tree_leaves(tree, is_leaf)
    if initializer is None:
        return functools.reduce(f, leaves)
    return functools.reduce(f, leaves, initializer)


def tree_all(tree):
    return all(tree_leaves(tree))


def treedef_children(treedef):
    return list(treedef.children)


def tree_transpose(outer_treedef, inner_treedef, pytree_to_transpose):
    flat = tree_leaves(pytree_to_transpose)
    n_inner = inner_treedef.num_leaves
    n_outer = outer_treedef.num_leaves
    groups = [flat[i * n_inner : (i + 1) * n_inner] for i in range(n_outer)]
    transposed = [[g[j] for g in groups] for j in range(n_inner)]
    return tree_unflatten(inner_treedef, [tree_unflatten(outer_treedef, t) for t in transposed])


def prefix_broadcast(prefix, tree, what="in_axes"):
    """Expand a pytree prefix (e.g. `in_axes`) to one entry per leaf of `tree`."""
    leaves_out = []

    def walk(p, t):
        if (
            p is None
            or isinstance(p, (int, str))
            or type(p) not in (tuple, list, dict)
            and not _is_namedtuple(p)
            and type(p) not in _registry
            and not (dataclasses.is_dataclass(p) and not isinstance(p, type))
            and not isinstance(p, dict)
        ):
            leaves_out.extend([p] * len(tree_leaves(t)))
            return
        p_children, p_def = _children(p)
        t_children, t_def = _children(t)
        if p_def != t_def or len(p_children) != len(t_children):
            raise ValueError(
                f"{what} structure {tree_structure(p)} is not a prefix of the argument "
                f"structure {tree_structure(t)}"
            )
        for pc, tc in zip(p_children, t_children):
            walk(pc, tc)

    walk(prefix, tree)
    return leaves_out


def _children(x):
    t = type(x)
    if t in (tuple, list):
        return list(x), (t, len(x))
    if t is dict:
        keys = sorted(x)
        return [x[k] for k in keys], (dict, tuple(keys))
    if t in _registry:
        children, aux = _registry[t][0](x)
        return list(children), (t, _hashable(aux))
    if _is_namedtuple(x):
        return list(x), (t, len(x))
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        names = tuple(f.name for f in dataclasses.fields(x))
        return [getattr(x, n) for n in names], (t, names)
    if isinstance(x, dict):
        keys = _dictlike_keys(x)
        return [x[k] for k in keys], (t, tuple(keys))
    return [x], ("leaf",)


# Key paths (JAX's tree_flatten_with_path / keystr).


@dataclasses.dataclass(frozen=True)
class SequenceKey:
    idx: int

    def __str__(self):
        return f"[{self.idx!r}]"


@dataclasses.dataclass(frozen=True)
class DictKey:
    key: object

    def __str__(self):
        return f"[{self.key!r}]"


@dataclasses.dataclass(frozen=True)
class GetAttrKey:
    name: str

    def __str__(self):
        return f".{self.name}"


@dataclasses.dataclass(frozen=True)
class FlattenedIndexKey:
    key: int

    def __str__(self):
        return f"[<flat index {self.key}>]"


def _child_keys(x, n):
    t = type(x)
    if t in (tuple, list):
        return [SequenceKey(i) for i in range(n)]
    if isinstance(x, dict) and t not in _registry:
        return [DictKey(k) for k in (sorted(x) if t is dict else _dictlike_keys(x))]
    if t in _key_registry:
        return [k for k, _ in _key_registry[t](x)[0]]
    if t in _registry:
        return [FlattenedIndexKey(i) for i in range(n)]
    if _is_namedtuple(x):
        return [GetAttrKey(f) for f in t._fields]
    if dataclasses.is_dataclass(x):
        return [GetAttrKey(f.name) for f in dataclasses.fields(x)]
    return [FlattenedIndexKey(i) for i in range(n)]


def _paths(x, path, out, is_leaf):
    if x is None or (is_leaf is not None and is_leaf(x)):
        if x is not None or is_leaf is not None:
            out.append((path, x))
        return
    children, meta = _children(x)
    if meta == ("leaf",):
        out.append((path, x))
        return
    for key, child in zip(_child_keys(x, len(children)), children):
        _paths(child, path + (key,), out, is_leaf)


def tree_flatten_with_path(tree, is_leaf=None):
    """([(key_path, leaf), ...], treedef), as JAX's function of that name."""
    out = []
    _paths(tree, (), out, is_leaf)
    return out, tree_structure(tree, is_leaf)


def tree_leaves_with_path(tree, is_leaf=None):
    return tree_flatten_with_path(tree, is_leaf)[0]


def tree_map_with_path(f, tree, *rest, is_leaf=None):
    """`f(key_path, leaf, *other_leaves)` over the leaves of `tree`."""
    pairs, treedef = tree_flatten_with_path(tree, is_leaf)
    others = [tree_leaves(r, is_leaf) for r in rest]
    return tree_unflatten(treedef, [f(p, x, *xs) for (p, x), *xs in zip(pairs, *others)])


def keystr(keys, *, simple=False, separator=""):
    """'['a'][0]'-style text of a key path."""
    if simple:
        parts = [str(getattr(k, n)) for k in keys for n in ("idx", "key", "name") if hasattr(k, n)]
        return separator.join(parts)
    return separator.join(str(k) for k in keys)


class Partial(functools.partial):
    """A `functools.partial` that is a pytree: the bound arguments are leaves and the
    function is static, so it can be passed through jit/vmap/grad (JAX's Partial).

    Example:
        >>> from fflow.tree_util import Partial, tree_leaves
        >>> tree_leaves(Partial(lambda a, b: a + b, 1.0))
        [1.0]
    """

    def __new__(cls, func, *args, **kw):
        if isinstance(func, functools.partial):  # flatten nested partials (as JAX)
            original = func
            func = _HashableCallableShim(original)
            out = super().__new__(cls, func, *args, **kw)
            func.func = original
            return out
        return super().__new__(cls, func, *args, **kw)


class _HashableCallableShim:
    def __init__(self, func):
        self.func = func

    def __call__(self, *args, **kw):
        return self.func(*args, **kw)

    def __hash__(self):
        return hash(self.func)

    def __eq__(self, other):
        return isinstance(other, _HashableCallableShim) and self.func == other.func


register_pytree_node(
    Partial,
    lambda p: ((p.args, p.keywords), p.func),
    lambda func, xs: Partial(func, *xs[0], **xs[1]),
)


# the public names: jax's (jax.tree_util) that fflow has
__all__ = [
    "DictKey",
    "FlattenedIndexKey",
    "GetAttrKey",
    "Partial",
    "PyTreeDef",
    "SequenceKey",
    "keystr",
    "register_dataclass",
    "register_pytree_node",
    "register_pytree_node_class",
    "register_pytree_with_keys",
    "register_pytree_with_keys_class",
    "register_static",
    "tree_all",
    "tree_flatten",
    "tree_flatten_with_path",
    "tree_leaves",
    "tree_leaves_with_path",
    "tree_map",
    "tree_map_with_path",
    "tree_reduce",
    "tree_structure",
    "tree_transpose",
    "tree_unflatten",
    "treedef_children",
]


def __dir__():
    return list(__all__)
