# The "training a simple neural network" tutorial on random data: init, predict, accuracy, SGD
import jax
import jax.numpy as jnp
from jax.scipy.special import logsumexp


def random_layer_params(m, n, key, scale=1e-1):
    w_key, b_key = jax.random.split(key)
    return scale * jax.random.normal(w_key, (n, m)), scale * jax.random.normal(b_key, (n,))


def init_network_params(sizes, key):
    keys = jax.random.split(key, len(sizes))
    return [random_layer_params(m, n, k) for m, n, k in zip(sizes[:-1], sizes[1:], keys)]


def predict(params, image):
    activations = image
    for w, b in params[:-1]:
        activations = jax.nn.relu(jnp.dot(w, activations) + b)
    final_w, final_b = params[-1]
    logits = jnp.dot(final_w, activations) + final_b
    return logits - logsumexp(logits)


batched_predict = jax.vmap(predict, in_axes=(None, 0))


def one_hot(x, k, dtype=jnp.float32):
    return jnp.array(x[:, None] == jnp.arange(k), dtype)


def accuracy(params, images, targets):
    return jnp.mean(
        jnp.argmax(targets, axis=1) == jnp.argmax(batched_predict(params, images), axis=1)
    )


def loss(params, images, targets):
    return -jnp.mean(batched_predict(params, images) * targets)


@jax.jit
def update(params, x, y):
    grads = jax.grad(loss)(params, x, y)
    return [(w - 0.5 * dw, b - 0.5 * db) for (w, b), (dw, db) in zip(params, grads)]


key = jax.random.PRNGKey(0)
params = init_network_params([16, 12, 4], key)
images = jax.random.normal(jax.random.fold_in(key, 9), (32, 16))
labels = one_hot(jnp.argmax(images[:, :4], axis=1), 4)
for _ in range(10):
    params = update(params, images, labels)
result = (loss(params, images, labels), accuracy(params, images, labels), params[1][1])
