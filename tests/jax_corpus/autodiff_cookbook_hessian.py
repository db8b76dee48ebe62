# Autodiff cookbook: grad, jacfwd/jacrev, hessian, jvp, vjp on a small model
import jax
import jax.numpy as jnp
from jax import grad, hessian, jacfwd, jacrev, jvp, vjp


def sigmoid(x):
    return 0.5 * (jnp.tanh(x / 2) + 1)


def predict(W, b, inputs):
    return sigmoid(jnp.dot(inputs, W) + b)


inputs = jnp.array(
    [[0.52, 1.12, 0.77], [0.88, -1.08, 0.15], [0.52, 0.06, -1.30], [0.74, -2.49, 1.39]]
)
targets = jnp.array([True, True, False, True])


def loss(W, b):
    preds = predict(W, b, inputs)
    label_probs = preds * targets + (1 - preds) * (1 - targets)
    return -jnp.sum(jnp.log(label_probs))


key = jax.random.PRNGKey(0)
key, W_key, b_key = jax.random.split(key, 3)
W = jax.random.normal(W_key, (3,))
b = jax.random.normal(b_key, ())
W_grad, b_grad = grad(loss, (0, 1))(W, b)
f = lambda W: predict(W, b, inputs)
J_fwd = jacfwd(f)(W)
J_rev = jacrev(f)(W)
H = hessian(f)(W)
v = jnp.ones(3)
y, u = jvp(f, (W,), (v,))
y2, vjp_fun = vjp(f, W)
(w_ct,) = vjp_fun(jnp.ones(4))
result = (W_grad, b_grad, J_fwd, J_rev, H.shape, H[0], y, u, w_ct, loss(W, b))
