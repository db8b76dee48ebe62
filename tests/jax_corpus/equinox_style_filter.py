# equinox-style filtering written by hand: a module pytree mixing arrays with a Python
# callable, partition/combine by `is_array`, filter_jit / filter_grad wrappers
import functools

import jax
import jax.numpy as jnp


def is_array(x):
    return isinstance(x, jax.Array)


def partition(tree, pred):
    a = jax.tree_util.tree_map(lambda x: x if pred(x) else None, tree)
    b = jax.tree_util.tree_map(lambda x: None if pred(x) else x, tree)
    return a, b


def combine(a, b):
    return jax.tree_util.tree_map(
        lambda x, y: x if y is None else y, a, b, is_leaf=lambda x: x is None
    )


def filter_jit(fun):
    @functools.partial(jax.jit, static_argnums=1)
    def inner(dynamic, static_treedef_and_leaves):
        treedef, static_leaves = static_treedef_and_leaves
        return fun(*combine(dynamic, jax.tree_util.tree_unflatten(treedef, static_leaves)))

    def wrapper(*args):
        dynamic, static = partition(args, is_array)
        leaves, treedef = jax.tree_util.tree_flatten(static, is_leaf=lambda x: x is None)
        return inner(dynamic, (treedef, tuple(leaves)))

    return wrapper


def filter_grad(fun):
    def wrapper(model, *args):
        dyn, static = partition(model, is_array)
        return jax.grad(lambda d: fun(combine(d, static), *args))(dyn)

    return wrapper


class MLP:
    def __init__(self, key, act):
        k1, k2 = jax.random.split(key)
        self.w1 = jax.random.normal(k1, (2, 4))
        self.w2 = jax.random.normal(k2, (4, 1))
        self.act = act

    def __call__(self, x):
        return self.act(x @ self.w1) @ self.w2


jax.tree_util.register_pytree_node(
    MLP,
    lambda m: ((m.w1, m.w2, m.act), None),
    lambda _, c: MLP.__new__(MLP)._set(*c),
)
MLP._set = lambda self, w1, w2, act: (
    setattr(self, "w1", w1),
    setattr(self, "w2", w2),
    setattr(self, "act", act),
    self,
)[-1]

model = MLP(jax.random.PRNGKey(3), jnp.tanh)
x = jnp.array([[0.5, -1.0], [1.5, 0.2], [0.0, 0.3]])


def loss(model, x):
    return jnp.mean(model(x) ** 2)


grads = filter_grad(loss)(model, x)
out = filter_jit(lambda m, x: m(x))(model, x)
for _ in range(5):
    g = filter_grad(loss)(model, x)
    model = combine(
        jax.tree_util.tree_map(lambda p, d: p - 0.1 * d, partition(model, is_array)[0], g),
        partition(model, is_array)[1],
    )
result = (
    grads.w1,
    grads.act is None,
    out,
    loss(model, x),
    filter_jit(lambda m, x: m(x).sum())(model, x),
)
