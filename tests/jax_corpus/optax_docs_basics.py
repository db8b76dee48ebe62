# optax's getting-started: fit a linear model with adam, a custom chain, an integer-label
# classifier with softmax_cross_entropy, a schedule read back with inject_hyperparams
import jax
import jax.numpy as jnp
import optax

BATCH_SIZE = 5
NUM_TRAIN_STEPS = 1_000
key = jax.random.PRNGKey(0)
RAW_TRAINING_DATA = jax.random.randint(key, (NUM_TRAIN_STEPS, BATCH_SIZE, 2), 0, 10)

TRAINING_DATA = jnp.unpackbits(RAW_TRAINING_DATA[..., 0].astype(jnp.uint8)[..., None], axis=-1)
LABELS = jax.nn.one_hot(RAW_TRAINING_DATA[..., 1] % 2, 2).astype(jnp.float32)

initial_params = {
    "hidden": jax.random.normal(shape=[8, 32], key=jax.random.PRNGKey(0)),
    "output": jax.random.normal(shape=[32, 2], key=jax.random.PRNGKey(1)),
}


def net(x, params):
    x = jnp.dot(x, params["hidden"])
    x = jax.nn.relu(x)
    x = jnp.dot(x, params["output"])
    return x


def loss(params, batch, labels):
    y_hat = net(batch, params)
    loss_value = optax.sigmoid_binary_cross_entropy(y_hat, labels).sum(axis=-1)
    return loss_value.mean()


def fit(params, optimizer, steps=60):
    opt_state = optimizer.init(params)

    @jax.jit
    def step(params, opt_state, batch, labels):
        loss_value, grads = jax.value_and_grad(loss)(params, batch, labels)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, loss_value

    trace = []
    for i in range(steps):
        params, opt_state, loss_value = step(params, opt_state, TRAINING_DATA[i], LABELS[i])
        trace.append(loss_value)
    return params, jnp.stack(trace), opt_state


p_adam, t_adam, _ = fit(initial_params, optax.adam(learning_rate=1e-2))
schedule = optax.warmup_cosine_decay_schedule(
    init_value=0.0, peak_value=1e-2, warmup_steps=10, decay_steps=50, end_value=1e-4
)
custom = optax.chain(
    optax.clip_by_global_norm(1.0),
    optax.scale_by_adam(),
    optax.add_decayed_weights(1e-4),
    optax.scale_by_schedule(schedule),
    optax.scale(-1.0),
)
p_custom, t_custom, _ = fit(initial_params, custom)
injected = optax.inject_hyperparams(optax.rmsprop)(learning_rate=3e-3)
p_inj, t_inj, s_inj = fit(initial_params, injected, steps=20)

logits = jnp.array([[2.0, 1.0, 0.1], [0.5, 2.5, 0.3]])
labels = jnp.array([0, 1])
result = (
    t_adam[::12],
    p_adam["output"][:2, :2],
    t_custom[::12],
    t_inj[-1],
    s_inj.hyperparams["learning_rate"],
    optax.softmax_cross_entropy_with_integer_labels(logits, labels),
    optax.l2_loss(jnp.array([1.0, 2.0]), jnp.array([0.5, 2.5])),
    schedule(jnp.array([0, 5, 10, 30, 60])),
    optax.global_norm(initial_params),
)
