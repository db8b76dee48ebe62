# Working with pytrees: leaves, tree_map over several trees, flatten/unflatten
import jax
import jax.numpy as jnp

example_trees = [
    [1, "a", object()],
    (1, (2, 3), ()),
    [1, {"k1": 2, "k2": (3, 4)}, 5],
    {"a": 2, "b": (2, 3)},
    jnp.array([1, 2, 3]),
]
counts = [len(jax.tree_util.tree_leaves(t)) for t in example_trees]
list_of_lists = [[1, 2, 3], [1, 2], [1, 2, 3, 4]]
doubled = jax.tree.map(lambda x: x * 2, list_of_lists)
summed = jax.tree.map(lambda x, y: x + y, list_of_lists, doubled)
leaves, treedef = jax.tree_util.tree_flatten({"b": [1.0, None, 2.0], "a": (3.0,)})
rebuilt = jax.tree_util.tree_unflatten(treedef, [x * 10 for x in leaves])
structure_leaves = treedef.num_leaves
reduced = jax.tree_util.tree_reduce(lambda a, b: a + b, {"x": 1, "y": [2, 3]})
result = (
    counts,
    doubled,
    summed,
    leaves,
    rebuilt,
    structure_leaves,
    reduced,
    jax.tree.leaves([None, (None,)]),
)
