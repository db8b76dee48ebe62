# A flax.nnx-style stateful module written by hand: modules hold Params in attributes,
# `split` gives (graphdef, state), `merge` rebuilds, and optax trains the state
import jax
import jax.numpy as jnp
import optax


class Param:
    def __init__(self, value):
        self.value = value


class Linear:
    def __init__(self, din, dout, key):
        self.kernel = Param(jax.random.normal(key, (din, dout)) / jnp.sqrt(din))
        self.bias = Param(jnp.zeros(dout))

    def __call__(self, x):
        return x @ self.kernel.value + self.bias.value


class MLP:
    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.l1 = Linear(3, 8, k1)
        self.l2 = Linear(8, 1, k2)
        self.count = 0  # not a Param: static state

    def __call__(self, x):
        return self.l2(jax.nn.gelu(self.l1(x)))


def split(module):
    state = {}

    def walk(obj, prefix):
        for name, v in vars(obj).items():
            if isinstance(v, Param):
                state[prefix + name] = v.value
            elif hasattr(v, "__dict__") and not isinstance(v, (int, float)):
                walk(v, prefix + name + ".")

    walk(module, "")
    return module, state


def merge(graphdef, state):
    for path, value in state.items():
        obj = graphdef
        *parents, leaf = path.split(".")
        for p in parents:
            obj = getattr(obj, p)
        getattr(obj, leaf).value = value
    return graphdef


model = MLP(jax.random.PRNGKey(0))
graphdef, state = split(model)
x = jax.random.normal(jax.random.PRNGKey(1), (16, 3))
y = jnp.sum(x**2, axis=1, keepdims=True)
tx = optax.adamw(1e-2, weight_decay=1e-3)
opt_state = tx.init(state)


@jax.jit
def train_step(state, opt_state):
    def loss_fn(state):
        m = merge(graphdef, state)
        return jnp.mean((m(x) - y) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(state)
    updates, opt_state = tx.update(grads, opt_state, state)
    return optax.apply_updates(state, updates), opt_state, loss


losses = []
for _ in range(25):
    state, opt_state, loss = train_step(state, opt_state)
    losses.append(loss)
model = merge(graphdef, state)
result = (
    sorted(state),
    jnp.stack(losses)[::5],
    model(x[:2]),
    jax.tree_util.tree_map(jnp.shape, state),
    sum(v.size for v in jax.tree_util.tree_leaves(state)),
)
