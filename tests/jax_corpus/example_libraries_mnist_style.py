# JAX's examples/mnist_classifier.py with synthetic data: stax.serial of Dense/Relu/
# LogSoftmax, optimizers.momentum and adam, a jitted update on OptimizerState
import itertools

import jax
import jax.numpy as jnp
from jax import grad, jit, random
from jax.example_libraries import optimizers, stax
from jax.example_libraries.stax import Dense, LogSoftmax, Relu


def loss(params, batch):
    inputs, targets = batch
    preds = predict(params, inputs)
    return -jnp.mean(jnp.sum(preds * targets, axis=1))


def accuracy(params, batch):
    inputs, targets = batch
    target_class = jnp.argmax(targets, axis=1)
    predicted_class = jnp.argmax(predict(params, inputs), axis=1)
    return jnp.mean(predicted_class == target_class)


init_random_params, predict = stax.serial(Dense(32), Relu, Dense(16), Relu, Dense(3), LogSoftmax)

rng = random.PRNGKey(0)
kx, ky = random.split(random.PRNGKey(1))
images = random.normal(kx, (60, 8))
labels = jax.nn.one_hot(jnp.argmax(images[:, :3], axis=1), 3)
batches = [(images[i : i + 20], labels[i : i + 20]) for i in range(0, 60, 20)]


def train(opt_init, opt_update, get_params):
    @jit
    def update(i, opt_state, batch):
        params = get_params(opt_state)
        return opt_update(i, grad(loss)(params, batch), opt_state)

    opt_state = opt_init(init_params)
    itercount = itertools.count()
    for _epoch in range(3):
        for batch in batches:
            opt_state = update(next(itercount), opt_state, batch)
    params = get_params(opt_state)
    return accuracy(params, (images, labels)), loss(params, (images, labels)), params[0][1][:3]


_, init_params = init_random_params(rng, (-1, 8))
results = [train(*optimizers.momentum(0.05, mass=0.9)), train(*optimizers.adam(1e-2))]
sched = optimizers.exponential_decay(0.1, 10, 0.5)
result = (
    results,
    init_params[0][0][:2, :3],
    [jnp.shape(p[0]) if p else None for p in init_params],
    sched(20),
    optimizers.l2_norm(init_params[4]),
    optimizers.clip_grads({"g": jnp.array([3.0, 4.0])}, 1.0),
)
