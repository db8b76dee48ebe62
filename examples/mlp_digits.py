"""Train a functional MLP on scikit-learn's bundled digits data (no download).

    python examples/mlp_digits.py            # full run (a few seconds)
    python examples/mlp_digits.py --steps 50 # quick run

The model is plain functions over a pytree of parameters; the training step is
`fflow.jit(fflow.value_and_grad(loss))` with Adam written with `tree_map`. The
digits loading, the He initialiser and Adam live in examples/_common.py (shared
with the other examples).
"""

import argparse
import time

import numpy as np
from _common import adam_init, adam_update, init_mlp, load_digits_split

import fflow
import fflow.numpy as jnp


def predict(params, x):
    for layer in params[:-1]:
        x = jnp.maximum(x @ layer["w"] + layer["b"], 0.0)
    last = params[-1]
    return x @ last["w"] + last["b"]


def log_softmax(logits):
    shifted = logits - jnp.max(logits, axis=-1, keepdims=True)
    return shifted - jnp.log(jnp.sum(jnp.exp(shifted), axis=-1, keepdims=True))


def loss_fn(params, x, y):
    logp = log_softmax(predict(params, x))
    one_hot = (y[:, None] == jnp.arange(10)[None, :]).astype(jnp.float32)
    return -jnp.mean(jnp.sum(one_hot * logp, axis=-1))


@fflow.jit
def train_step(params, opt_state, x, y):
    loss, grads = fflow.value_and_grad(loss_fn)(params, x, y)
    params, opt_state = adam_update(params, grads, opt_state)
    return params, opt_state, loss


@fflow.jit
def accuracy(params, x, y):
    return jnp.mean((jnp.argmax(predict(params, x), axis=-1) == y).astype(jnp.float32))


def main(steps=1500, batch_size=128, hidden=256, seed=0, log_every=250):
    (x_train, y_train), (x_test, y_test) = load_digits_split(seed)
    params = init_mlp([64, hidden, hidden, 10], seed)
    opt_state = adam_init(params)
    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    for step in range(1, steps + 1):
        idx = rng.integers(0, len(x_train), batch_size)
        params, opt_state, loss = train_step(params, opt_state, x_train[idx], y_train[idx])
        if step % log_every == 0 or step == steps:
            acc = float(accuracy(params, x_test, y_test))
            print(
                f"step {step:5d}  loss {float(loss):.4f}  test accuracy {acc:.3f}  "
                f"({time.perf_counter() - start:.1f} s)"
            )
    acc = float(accuracy(params, x_test, y_test))
    print(f"final test accuracy: {acc:.3f}")
    return acc


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--tiny", action="store_true", help="a few steps, for the tests")
    args = parser.parse_args()
    if args.tiny:
        main(steps=20, batch_size=32, hidden=32, log_every=10)
    else:
        main(args.steps, args.batch_size, args.hidden)
