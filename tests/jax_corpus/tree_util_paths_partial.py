# tree_util with key paths, Partial as a pytree, tree_transpose, tree.flatten_with_path
import jax
import jax.numpy as jnp
from jax.tree_util import Partial, keystr, tree_flatten_with_path, tree_map_with_path

tree = {"layer1": {"w": jnp.ones(2), "b": jnp.zeros(1)}, "layer2": [jnp.arange(2.0)]}
flat, _ = tree_flatten_with_path(tree)
paths = [keystr(p) for p, _ in flat]
scaled = tree_map_with_path(lambda p, x: x * 2 if "w" in keystr(p) else x, tree)
add = Partial(jnp.add, jnp.array(1.0))
outer = jax.tree_util.tree_structure([0, 0])
inner = jax.tree_util.tree_structure((0, 0))
transposed = jax.tree_util.tree_transpose(outer, inner, [(1, 2), (3, 4)])
result = (
    paths,
    scaled,
    jax.jit(lambda f, x: f(x))(add, jnp.arange(3.0)),
    transposed,
    jax.tree.all(jax.tree.map(lambda x: x.size > 0, tree)),
    jax.tree_util.tree_all([True, True]),
)
