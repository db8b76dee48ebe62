# A flax/equinox-style module written by hand: dataclass pytrees, init with split keys,
# a filtered (arrays vs static) training loop with value_and_grad and tree_map updates
import dataclasses
from functools import partial

import jax
import jax.numpy as jnp


@partial(jax.tree_util.register_dataclass, data_fields=["w", "b"], meta_fields=["activation"])
@dataclasses.dataclass
class Linear:
    w: jax.Array
    b: jax.Array
    activation: str = "relu"

    @classmethod
    def init(cls, key, din, dout, activation="relu"):
        wkey, bkey = jax.random.split(key)
        lim = 1.0 / jnp.sqrt(din)
        w = jax.random.uniform(wkey, (din, dout), minval=-lim, maxval=lim)
        b = jax.random.uniform(bkey, (dout,), minval=-lim, maxval=lim)
        return cls(w, b, activation)

    def __call__(self, x):
        y = x @ self.w + self.b
        return jax.nn.relu(y) if self.activation == "relu" else y


@jax.tree_util.register_pytree_node_class
class MLP:
    def __init__(self, layers):
        self.layers = layers

    def tree_flatten(self):
        return (self.layers,), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)

    @classmethod
    def init(cls, key, sizes):
        keys = jax.random.split(key, len(sizes) - 1)
        acts = ["relu"] * (len(sizes) - 2) + ["none"]
        return cls(
            [Linear.init(k, a, b, act) for k, a, b, act in zip(keys, sizes[:-1], sizes[1:], acts)]
        )

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


key = jax.random.PRNGKey(42)
k_model, k_data = jax.random.split(key)
model = MLP.init(k_model, [2, 16, 16, 1])
xs = jax.random.normal(k_data, (64, 2))
ys = jnp.sin(xs[:, :1]) + 0.5 * xs[:, 1:] ** 2


def loss(model, x, y):
    pred = jax.vmap(model)(x)
    return jnp.mean((pred - y) ** 2)


@jax.jit
def sgd_step(model, x, y, lr=0.05):
    l, grads = jax.value_and_grad(loss)(model, x, y)
    model = jax.tree_util.tree_map(lambda p, g: p - lr * g, model, grads)
    return model, l


losses = []
for _ in range(30):
    model, l = sgd_step(model, xs, ys)
    losses.append(l)

leaves, treedef = jax.tree_util.tree_flatten(model)
n_params = sum(leaf.size for leaf in leaves)
param_shapes = jax.tree_util.tree_map(lambda a: a.shape, model)
is_arr = jax.tree_util.tree_map(lambda a: isinstance(a, jax.Array), model)
result = (
    jnp.stack(losses)[::6],
    n_params,
    [leaf.shape for leaf in leaves],
    treedef.num_leaves,
    model(jnp.array([0.5, -0.5])),
    [layer.activation for layer in model.layers],
    param_shapes.layers[1].w,
    all(jax.tree_util.tree_leaves(is_arr)),
)
