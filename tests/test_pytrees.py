"""Pytrees: round trips of every node kind, and transforms on pytree arguments and
outputs (argnums tuples, has_aux, jit/vmap/jvp/vjp over nested structures)."""

import collections
import dataclasses

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp
from fflow.tree_util import (
    register_dataclass,
    register_pytree_node,
    register_pytree_node_class,
    tree_flatten,
    tree_leaves,
    tree_map,
    tree_structure,
    tree_unflatten,
)

pytestmark = pytest.mark.usefixtures("x64")  # float64 references on purpose

Point = collections.namedtuple("Point", ["x", "y"])


@dataclasses.dataclass
class Params:
    w: object
    b: object


@register_pytree_node_class
class Box:
    def __init__(self, value, label):
        self.value = value
        self.label = label

    def tree_flatten(self):
        return (self.value,), self.label

    @classmethod
    def tree_unflatten(cls, label, children):
        return cls(children[0], label)

    def __eq__(self, other):
        return type(other) is Box and self.label == other.label and self.value == other.value


class Pair:
    def __init__(self, a, b):
        self.a, self.b = a, b

    def __eq__(self, other):
        return type(other) is Pair and (self.a, self.b) == (other.a, other.b)


register_pytree_node(Pair, lambda p: ((p.a, p.b), None), lambda aux, ch: Pair(*ch))


@register_dataclass
@dataclasses.dataclass
class Registered:
    u: object
    v: object


TREES = {
    "leaf": 1,
    "tuple": (1, 2, (3,)),
    "list": [1, [2, 3], []],
    "dict_sorted": {"b": 1, "a": 2, "c": {"z": 3, "y": 4}},
    "none": (None, 1, [None]),
    "namedtuple": Point(1, (2, 3)),
    "dataclass": Params(w=1, b=[2, 3]),
    "registered_class": Box(1, "label"),
    "registered_fn": Pair(1, (2, 3)),
    "registered_dataclass": Registered(u=1, v={"k": 2}),
    "ordered_dict": collections.OrderedDict([("b", 1), ("a", 2)]),
    "mixed": {"p": Point(Params(1, None), [Box(2, "q")]), "n": None, "t": (3,)},
}


@pytest.mark.parametrize("name", sorted(TREES))
def test_round_trip(name):
    tree = TREES[name]
    leaves, treedef = tree_flatten(tree)
    assert all(isinstance(x, int) for x in leaves)
    rebuilt = tree_unflatten(treedef, leaves)
    assert type(rebuilt) is type(tree)
    assert rebuilt == tree
    assert tree_structure(rebuilt) == treedef
    assert hash(treedef) == hash(tree_structure(tree))
    assert tree_map(lambda v: v * 10, tree) == tree_unflatten(treedef, [v * 10 for v in leaves])


def test_dict_leaves_in_sorted_key_order():
    assert tree_leaves({"b": 1, "a": 2, "c": 3}) == [2, 1, 3]
    # an OrderedDict keeps its own order (as in JAX)
    assert tree_leaves(collections.OrderedDict([("b", 1), ("a", 2)])) == [1, 2]
    dd = collections.defaultdict(list, {"b": 1, "a": 2})
    rebuilt = tree_map(lambda v: v, dd)
    assert tree_leaves(dd) == [2, 1] and rebuilt.default_factory is list


def test_none_is_an_empty_subtree():
    assert tree_leaves((None, 1, [None, 2])) == [1, 2]
    assert tree_structure(None) != tree_structure((None,))


def test_structures_differ():
    assert tree_structure((1, 2)) != tree_structure([1, 2])
    assert tree_structure({"a": 1}) != tree_structure({"b": 1})
    assert tree_structure(Point(1, 2)) != tree_structure((1, 2))
    assert tree_structure(Box(1, "x")) != tree_structure(Box(1, "y"))
    with pytest.raises(ValueError):
        tree_unflatten(tree_structure((1, 2)), [1])
    with pytest.raises(ValueError):
        tree_map(lambda a, b: a + b, (1, 2), [1, 2])


def _loss(params, batch):
    w, b = params["w"], params["b"]
    pred = jnp.tanh(batch.x @ w + b)
    return jnp.sum((pred - batch.y) ** 2)


P = {"w": np.random.RandomState(0).randn(3, 2), "b": np.array([0.1, -0.2])}
B = Point(np.random.RandomState(1).randn(4, 3), np.random.RandomState(2).randn(4, 2))


def _fd(f, tree, eps=1e-6):
    leaves, treedef = tree_flatten(tree)
    grads = []
    for i, leaf in enumerate(leaves):
        g = np.zeros_like(leaf)
        for j in range(leaf.size):
            plus = [np.array(x, copy=True) for x in leaves]
            minus = [np.array(x, copy=True) for x in leaves]
            plus[i].flat[j] += eps
            minus[i].flat[j] -= eps
            g.flat[j] = (
                float(f(tree_unflatten(treedef, plus))) - float(f(tree_unflatten(treedef, minus)))
            ) / (2 * eps)
        grads.append(g)
    return tree_unflatten(treedef, grads)


def _assert_tree_close(a, b, tol=1e-6):
    assert tree_structure(a) == tree_structure(b)
    for x, y in zip(tree_leaves(a), tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=tol, atol=tol)


@pytest.mark.parametrize("jit", [False, True])
def test_grad_of_dict_params_and_namedtuple_batch(jit):
    g_fn = fflow.grad(_loss)
    g = (fflow.jit(g_fn) if jit else g_fn)(P, B)
    assert isinstance(g, dict) and sorted(g) == ["b", "w"]
    _assert_tree_close(g, _fd(lambda p: _loss(p, B), P))


def test_argnums_tuple_and_has_aux():
    def f(params, batch, scale):
        loss = _loss(params, batch) * scale
        return loss, {"loss": loss, "n": batch.x.shape[0]}

    (gp, gb), aux = fflow.grad(f, argnums=(0, 1), has_aux=True)(P, B, 2.0)
    assert isinstance(gb, Point)
    assert aux["n"] == 4
    np.testing.assert_allclose(float(aux["loss"]), float(_loss(P, B)) * 2.0, rtol=1e-12)
    _assert_tree_close(gp, tree_map(lambda v: 2.0 * v, _fd(lambda p: _loss(p, B), P)))
    _assert_tree_close(gb, tree_map(lambda v: 2.0 * v, _fd(lambda b: _loss(P, b), B)))
    (value, aux2), (gp2, gb2) = fflow.value_and_grad(f, argnums=(0, 1), has_aux=True)(P, B, 2.0)
    _assert_tree_close((gp2, gb2), (gp, gb), 1e-12)
    np.testing.assert_allclose(float(value), float(aux["loss"]))


def test_jit_pytree_in_and_out():
    @fflow.jit
    def f(tree):
        return {"sum": tree["a"] + tree["b"][0], "pair": Pair(tree["b"][1], None)}

    out = f({"a": np.ones(2), "b": (np.full(2, 2.0), np.zeros(3))})
    assert sorted(out) == ["pair", "sum"]
    assert isinstance(out["pair"], Pair) and out["pair"].b is None
    np.testing.assert_array_equal(np.asarray(out["sum"]), [3.0, 3.0])


def test_jvp_and_vjp_on_pytrees():
    def f(d):
        return Params(w=jnp.sin(d["x"]) * d["y"], b=(d["x"] ** 2,))

    primals = {"x": np.array([0.5, 1.0]), "y": np.array([2.0, 3.0])}
    tangents = {"x": np.array([1.0, 0.0]), "y": np.array([0.0, 1.0])}
    out, t_out = fflow.jvp(f, (primals,), (tangents,))
    assert isinstance(out, Params) and isinstance(t_out, Params)
    np.testing.assert_allclose(np.asarray(t_out.w), [np.cos(0.5) * 2.0, np.sin(1.0)])
    np.testing.assert_allclose(np.asarray(t_out.b[0]), [1.0, 0.0])
    out, f_vjp = fflow.vjp(f, primals)
    (ct,) = f_vjp(Params(w=np.ones(2), b=(np.ones(2),)))
    np.testing.assert_allclose(np.asarray(ct["x"]), np.cos([0.5, 1.0]) * [2.0, 3.0] + [1.0, 2.0])
    np.testing.assert_allclose(np.asarray(ct["y"]), np.sin([0.5, 1.0]))


def test_vmap_over_dataclass_and_namedtuple():
    def f(p, pt):
        return p.w * pt.x + p.b * pt.y

    p = Params(w=np.arange(3.0), b=np.ones(3))
    pt = Point(np.full(3, 2.0), np.full(3, 5.0))
    out = fflow.vmap(f)(p, pt)
    np.testing.assert_allclose(np.asarray(out), np.arange(3.0) * 2 + 5)
    out = fflow.vmap(f, in_axes=(Params(0, None), 0))(Params(np.arange(3.0), 1.0), pt)
    np.testing.assert_allclose(np.asarray(out), np.arange(3.0) * 2 + 5)


def test_grad_requires_matching_structures():
    with pytest.raises(TypeError):
        fflow.jvp(lambda d: d["a"], ({"a": 1.0},), ({"b": 1.0},))
    _, f_vjp = fflow.vjp(lambda d: (d["a"], d["a"]), {"a": 1.0})
    with pytest.raises(TypeError):
        f_vjp([1.0, 1.0])
