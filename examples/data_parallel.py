"""Data-parallel training of the digits MLP with SBP, on 4 devices.

    python examples/data_parallel.py                      # 4 simulated devices
    python -m fflow.launch -n 2 examples/data_parallel.py # 2 MPI ranks
    python examples/data_parallel.py --tiny               # a few steps (tests)

The model is `fflow.nn.MLP`, the update `fflow.optim.sgd`; the training step is
written for ONE device. `fflow.shard` runs it with the
parameters broadcast (B) and the batch split along its first axis (S(0)); the
planner finds that every gradient is a partial sum (P) and inserts exactly one
all-reduce per gradient to make it broadcast again. The loss curve equals the
single-device run up to float rounding (the sums are ordered differently).

Per-rank data: each device builds only its own part of every batch
(`fflow.make_global_array` with a function of the device index), so no rank
holds the global batch; the same code runs on simulated devices and MPI ranks.
"""

import argparse
import sys
from collections import Counter

from _common import load_digits_split

import fflow
import fflow.numpy as jnp
from fflow import nn, optim
from fflow.sharding import device_count, runtime

S, B = fflow.sbp.split, fflow.sbp.broadcast


def loss_fn(model, x, y):
    logp = nn.log_softmax(model(x))
    return -jnp.mean(jnp.sum(nn.one_hot(y, 10) * logp, axis=-1))


TX = optim.sgd(0.1)  # plain SGD: no optimizer state to shard


def train_step(model, x, y):
    loss, grads = fflow.value_and_grad(loss_fn)(model, x, y)
    updates, _ = TX.update(grads, TX.init(model), model)
    return optim.apply_updates(model, updates), loss


def batches(x, y, steps, batch, placement=None):
    """The training batches; with a placement, each as a global array built from
    every device's own rows (device i reads rows [lo + i*per, lo + (i+1)*per))."""
    n = len(x)
    for i in range(steps):
        lo = (i * batch) % (n - batch)
        if placement is None:
            yield x[lo : lo + batch], y[lo : lo + batch]
            continue
        per = batch // placement.size

        def rows(a, lo=lo, per=per):
            return lambda d: a[lo + d * per : lo + (d + 1) * per]

        yield (
            fflow.make_global_array(rows(x), placement, S(0)),
            fflow.make_global_array(rows(y), placement, S(0)),
        )


def train(step, params, data):
    losses = []
    for xb, yb in data:
        params, loss = step(params, xb, yb)
        losses.append(float(loss))  # every rank reads the (broadcast) loss: no traffic
    return params, losses


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=None)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args(argv)
    if args.tiny:
        args.steps, args.batch, args.hidden = 5, 32, 16
    rank0 = fflow.process_index() == 0
    n = args.devices or min(4, device_count())
    placement = fflow.placement("cpu", list(range(n)))
    args.batch -= args.batch % n  # equal rows per device

    (x, y), _ = load_digits_split(test_fraction=0.0)  # all of it, shuffled
    params = nn.MLP(64, 10, width_size=args.hidden, depth=1, key=fflow.random.PRNGKey(0))
    step = fflow.shard(train_step, placement, in_sbp=(B, S(0), S(0)), out_sbp=B)
    plan = step.plan(params, x[: args.batch], y[: args.batch])
    if rank0:
        print(f"data parallel on {runtime().describe()}, placement {placement}")
        counts = Counter(plan.collectives())
        print("collectives per step: " + ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())))
        print(f"bytes per step: {plan.bytes}")

    before = runtime().bytes_moved
    _, losses = train(step, params, batches(x, y, args.steps, args.batch, placement))
    moved = runtime().bytes_moved - before
    # the check: one device on the same (global) batches
    _, reference = train(fflow.jit(train_step), params, batches(x, y, args.steps, args.batch))
    gap = max(abs(a - b) for a, b in zip(losses, reference))
    if rank0:
        for i in range(0, args.steps, max(1, args.steps // 6)):
            print(f"step {i:4d}  loss {losses[i]:.5f}  (single device {reference[i]:.5f})")
        print(f"largest loss difference vs single device: {gap:.2e}")
        if fflow.process_count() == 1:
            print(f"bytes moved: {moved} (plan: {plan.bytes * args.steps})")
    assert gap < 1e-4 * max(1.0, max(reference)), "data-parallel loss curve diverged"
    return losses, reference


if __name__ == "__main__":
    main(sys.argv[1:])
