# JAX "Working with pytrees": jax.tree.* API, custom nodes with keys, paths, transposes,
# None and namedtuples, a custom flatten with aux data
import collections

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

example_trees = [
    [1, "a", object()],
    (1, (2, 3), ()),
    [1, {"k1": 2, "k2": (3, 4)}, 5],
    {"a": 2, "b": (2, 3)},
    jnp.array([1, 2, 3]),
]
n_leaves = [len(jax.tree.leaves(t)) for t in example_trees]
list_of_lists = [[1, 2, 3], [1, 2], [1, 2, 3, 4]]
mapped = jax.tree.map(lambda x: x * 2, list_of_lists)
another = list_of_lists
summed = jax.tree.map(lambda x, y: x + y, list_of_lists, another)


class MyContainer:
    def __init__(self, name: str, a: int, b: int, c: int):
        self.name = name
        self.a = a
        self.b = b
        self.c = c


def flatten_with_keys(obj):
    children = [(jax.tree_util.GetAttrKey(n), getattr(obj, n)) for n in ("a", "b", "c")]
    return children, obj.name


def flatten(obj):
    return [obj.a, obj.b, obj.c], obj.name


def unflatten(aux, children):
    return MyContainer(aux, *children)


jax.tree_util.register_pytree_with_keys(MyContainer, flatten_with_keys, unflatten, flatten)
containers = [MyContainer("Alice", 1, 2, 3), MyContainer("Bob", 4, 5, 6)]
c_leaves = jax.tree.leaves(containers)
c_mapped = jax.tree.map(lambda x: x + 1, containers)
paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(containers)[0]]

MyNamedTuple = collections.namedtuple("MyNamedTuple", ["a", "b"])
nt = MyNamedTuple(a=jnp.ones(2), b=None)
nt_leaves = jax.tree.leaves(nt)
none_tree = jax.tree.map(lambda x: x, [None, 1, (None, 2)])


def tree_transpose(list_of_trees):
    return jax.tree.map(lambda *xs: list(xs), *list_of_trees)


episode_steps = [dict(t=1, obs=3), dict(t=2, obs=4)]
transposed = tree_transpose(episode_steps)
transposed2 = jax.tree.transpose(
    outer_treedef=jax.tree.structure([0 for e in episode_steps]),
    inner_treedef=jax.tree.structure(episode_steps[0]),
    pytree_to_transpose=episode_steps,
)
tree = {"x": jnp.arange(3.0), "y": [jnp.ones(2), 2.0]}
flat, unravel = ravel_pytree(tree)
reduced = jax.tree.reduce(lambda a, b: a + b, [1, 2, (3, 4)])
paths2 = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(tree)]
result = (
    n_leaves,
    mapped,
    summed,
    c_leaves,
    [c.name for c in c_mapped],
    jax.tree.leaves(c_mapped),
    paths,
    len(nt_leaves),
    none_tree,
    transposed,
    transposed2,
    reduced,
    paths2,
    jax.tree.structure(tree).num_leaves,
    flat,
    unravel(flat * 2),
)
