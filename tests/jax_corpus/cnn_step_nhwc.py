# A small CNN training step in NHWC: conv_general_dilated with dimension numbers,
# reduce_window max pooling, a dense head, softmax cross-entropy and SGD
import jax
import jax.numpy as jnp
from jax import lax

key = jax.random.PRNGKey(2)
k1, k2, k3 = jax.random.split(key, 3)
params = {
    "conv": jax.random.normal(k1, (3, 3, 1, 4)) * 0.3,  # HWIO
    "dense": jax.random.normal(k2, (4 * 4 * 4, 3)) * 0.1,
}
images = jax.random.normal(k3, (2, 8, 8, 1))
labels = jnp.array([0, 2])


def forward(params, x):
    y = lax.conv_general_dilated(
        x, params["conv"], (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )
    y = jax.nn.relu(y)
    y = lax.reduce_window(y, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    return y.reshape(y.shape[0], -1) @ params["dense"]


def loss(params, x, labels):
    logits = forward(params, x)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1))


@jax.jit
def sgd(params, x, labels):
    l, g = jax.value_and_grad(loss)(params, x, labels)
    return jax.tree_util.tree_map(lambda p, g: p - 0.5 * g, params, g), l


ls = []
for _ in range(5):
    params, l = sgd(params, images, labels)
    ls.append(l)
avg = lax.reduce_window(images, 0.0, lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") / 4
result = (jnp.stack(ls), forward(params, images), avg[0, :2, :2, 0], params["conv"][0, 0])
