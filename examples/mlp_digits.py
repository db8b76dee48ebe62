"""Train an MLP on scikit-learn's bundled digits data (no download).

    python examples/mlp_digits.py            # full run (a few seconds)
    python examples/mlp_digits.py --steps 50 # quick run

The model is a `fflow.nn.MLP` (a pytree module: `grad` returns a model of
gradients), the optimizer `fflow.optim.adam`, and the training step
`fflow.jit(fflow.value_and_grad(loss))`. Batches come from `fflow.data.DataLoader`
(shuffled with `fflow.random` keys); the digits loading lives in examples/_common.py.
"""

import argparse
import time

from _common import load_digits_split

import fflow
import fflow.numpy as jnp
from fflow import nn, optim
from fflow.data import DataLoader


def loss_fn(model, x, y):
    logp = nn.log_softmax(model(x))
    return -jnp.mean(jnp.sum(nn.one_hot(y, 10) * logp, axis=-1))


@fflow.jit
def accuracy(model, x, y):
    return jnp.mean((jnp.argmax(model(x), axis=-1) == y).astype(jnp.float32))


def main(steps=1500, batch_size=128, hidden=256, seed=0, log_every=250, lr=1e-3):
    (x_train, y_train), (x_test, y_test) = load_digits_split(seed)
    key = fflow.random.PRNGKey(seed)
    model = nn.MLP(64, 10, width_size=hidden, depth=2, activation=nn.relu, key=key)
    print(nn.summary(model))
    tx = optim.adam(lr)
    opt_state = tx.init(model)

    @fflow.jit
    def train_step(model, opt_state, x, y):
        loss, grads = fflow.value_and_grad(loss_fn)(model, x, y)
        updates, opt_state = tx.update(grads, opt_state, model)
        return optim.apply_updates(model, updates), opt_state, loss

    loader = DataLoader((x_train, y_train), batch_size, key=fflow.random.fold_in(key, 1))
    start = time.perf_counter()
    for step, (x, y) in enumerate(loader.steps(steps), 1):
        model, opt_state, loss = train_step(model, opt_state, x, y)
        if step % log_every == 0 or step == steps:
            acc = float(accuracy(model, x_test, y_test))
            print(
                f"step {step:5d}  loss {float(loss):.4f}  test accuracy {acc:.3f}  "
                f"({time.perf_counter() - start:.1f} s)"
            )
    acc = float(accuracy(model, x_test, y_test))
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
