# jax.nn activations, softmax and one_hot in a classifier's loss
import jax
import jax.numpy as jnp

x = jnp.linspace(-3.0, 3.0, 7)
logits = jnp.array([[2.0, 1.0, 0.1], [0.5, 2.5, -1.0]])
labels = jnp.array([0, 2])
onehot = jax.nn.one_hot(labels, 3)
result = (
    jax.nn.relu(x),
    jax.nn.gelu(x),
    jax.nn.gelu(x, approximate=False),
    jax.nn.silu(x),
    jax.nn.softplus(x),
    jax.nn.sigmoid(x),
    jax.nn.elu(x),
    jax.nn.leaky_relu(x, 0.1),
    jax.nn.celu(x),
    jax.nn.selu(x),
    jax.nn.relu6(x),
    jax.nn.hard_tanh(x),
    jax.nn.log_sigmoid(x),
    jax.nn.softmax(logits),
    jax.nn.log_softmax(logits, axis=0),
    -jnp.sum(onehot * jax.nn.log_softmax(logits), axis=-1),
    onehot,
    jax.nn.standardize(x),
    jax.nn.logsumexp(logits, axis=1),
    jax.nn.glu(jnp.arange(4.0)),
    jax.grad(lambda x: jax.nn.relu(x).sum())(x),
)
