# Pytree odds JAX programs rely on: jax.tree_util.Partial through jit, register_static,
# dataclass pytrees with static fields, None/empty containers, tree_map with is_leaf,
# flatten_with_path + keystr, and tree_util.tree_all / tree_reduce
import dataclasses
import functools

import jax
import jax.numpy as jnp


@jax.tree_util.register_static
class Config:
    def __init__(self, n):
        self.n = n

    def __hash__(self):
        return hash(self.n)

    def __eq__(self, other):
        return isinstance(other, Config) and other.n == self.n


@functools.partial(jax.tree_util.register_dataclass, data_fields=["x"], meta_fields=["name"])
@dataclasses.dataclass
class Box:
    x: jax.Array
    name: str


def apply(fn, v):
    return fn(v)


part = jax.tree_util.Partial(jnp.add, jnp.float32(2.0))
cfg = Config(3)
tree = {"a": Box(jnp.ones(2), "one"), "b": [None, (), (jnp.zeros(1),)], "c": cfg}
leaves = jax.tree_util.tree_leaves(tree)
paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
result = (
    jax.jit(apply)(part, jnp.arange(3.0)),
    len(leaves),
    paths,
    jax.jit(lambda t: t["a"].x * t["c"].n)(tree),
    jax.tree_util.tree_map(
        lambda b: b.name if isinstance(b, Box) else None, tree, is_leaf=lambda n: isinstance(n, Box)
    )["a"],
    jax.tree_util.tree_all(jax.tree_util.tree_map(lambda v: bool((v >= 0).all()), tree)),
    jax.tree_util.tree_reduce(lambda a, b: a + b.sum(), tree, 0.0),
    jax.tree_util.tree_structure(tree).num_leaves,
)
