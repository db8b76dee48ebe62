# A training loop as in optax's docs "gradient clipping + learning-rate schedule +
# MultiSteps (gradient accumulation)", with optax.tree helpers and a jitted update
import jax
import jax.numpy as jnp
import optax

key = jax.random.PRNGKey(3)
X = jax.random.normal(key, (40, 4))
w_true = jnp.array([2.0, -1.0, 0.0, 0.5])
y = X @ w_true
params = {"w": jnp.zeros(4), "b": jnp.array(0.0)}


def loss_fn(p, xb, yb):
    return jnp.mean((xb @ p["w"] + p["b"] - yb) ** 2)


schedule = optax.piecewise_constant_schedule(0.1, {10: 0.5, 20: 0.5})
opt = optax.MultiSteps(
    optax.chain(optax.clip(0.5), optax.sgd(schedule, momentum=0.9, nesterov=True)),
    every_k_schedule=2,
)
state = opt.init(params)


@jax.jit
def update(params, state, xb, yb):
    loss, g = jax.value_and_grad(loss_fn)(params, xb, yb)
    updates, state = opt.update(g, state, params)
    return optax.apply_updates(params, updates), state, loss


losses = []
for i in range(30):
    sl = slice((i % 4) * 10, (i % 4) * 10 + 10)
    params, state, l = update(params, state, X[sl], y[sl])
    losses.append(l)
result = (
    jnp.stack(losses)[::6],
    params,
    schedule(jnp.array([0, 10, 20, 25])),
    optax.tree_utils.tree_l2_norm(params),
    optax.tree_utils.tree_zeros_like(params)["w"],
    state.mini_step,
)
