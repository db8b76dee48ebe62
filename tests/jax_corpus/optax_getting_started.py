# optax on a linear regression: adam, then sgd with momentum and a schedule
import jax
import jax.numpy as jnp
import optax

key = jax.random.PRNGKey(0)
xs = jax.random.normal(key, (32, 3))
true_w = jnp.array([1.5, -2.0, 0.5])
ys = xs @ true_w + 0.1
params = {"w": jnp.zeros(3), "b": jnp.zeros(())}


def loss_fn(params, x, y):
    return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


def fit(optimizer, params, steps=20):
    opt_state = optimizer.init(params)

    @jax.jit
    def step(params, opt_state):
        loss, grads = jax.value_and_grad(loss_fn)(params, xs, ys)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    losses = []
    for _ in range(steps):
        params, opt_state, loss = step(params, opt_state)
        losses.append(loss)
    return params, jnp.stack(losses)


p1, l1 = fit(optax.adam(0.1), params)
sched = optax.exponential_decay(0.05, transition_steps=5, decay_rate=0.5)
p2, l2 = fit(optax.sgd(sched, momentum=0.9), params)
p3, l3 = fit(
    optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(0.05, weight_decay=1e-2)), params
)
result = (p1, l1[::5], p2, l2[::5], p3, l3[-1])
