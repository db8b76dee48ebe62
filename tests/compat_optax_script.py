"""optax's "getting started" (adam, then chain(clip, adamw(warmup-cosine schedule))),
written against JAX unchanged. Run as `python -m fflow.compat tests/compat_optax_script.py`
(fflow) or `python tests/compat_optax_script.py` (JAX); prints the results as JSON.
The adamw peak rate is 0.05 (the tutorial uses 1.0, where float32 rounding differences grow
chaotically); everything else is the tutorial's code."""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

BATCH_SIZE = 5
NUM_TRAIN_STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 200
RAW_TRAINING_DATA = np.random.RandomState(0).randint(255, size=(NUM_TRAIN_STEPS, BATCH_SIZE, 1))
TRAINING_DATA = np.unpackbits(RAW_TRAINING_DATA.astype(np.uint8), axis=-1)
LABELS = (
    jax.nn.one_hot(RAW_TRAINING_DATA % 2, 2)
    .astype(jnp.float32)
    .reshape(NUM_TRAIN_STEPS, BATCH_SIZE, 2)
)

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


def fit(params, optimizer):
    opt_state = optimizer.init(params)

    @jax.jit
    def step(params, opt_state, batch, labels):
        loss_value, grads = jax.value_and_grad(loss)(params, batch, labels)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, loss_value

    losses = []
    for i, (batch, labels) in enumerate(zip(TRAINING_DATA, LABELS)):
        params, opt_state, loss_value = step(params, opt_state, batch, labels)
        if i % 50 == 0:
            losses.append(float(loss_value))
    return params, losses


out = {}
params, out["adam_losses"] = fit(initial_params, optax.adam(learning_rate=1e-2))
out["adam_hidden_sum"] = float(jnp.sum(params["hidden"]))
schedule = optax.warmup_cosine_decay_schedule(
    init_value=0.0, peak_value=0.05, warmup_steps=50, decay_steps=NUM_TRAIN_STEPS, end_value=0.0
)
optimizer = optax.chain(optax.clip(1.0), optax.adamw(learning_rate=schedule))
params, out["adamw_losses"] = fit(initial_params, optimizer)
out["adamw_output"] = np.asarray(params["output"][:3]).tolist()
out["dtype"] = str(params["hidden"].dtype)
out["jax_is"] = jax.__name__
print(json.dumps(out))
