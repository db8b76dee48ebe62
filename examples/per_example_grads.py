"""Per-example gradients with `vmap(grad(loss), in_axes=(None, 0, 0))`, checked
against a Python loop, then used for differentially private SGD (clip each
example's gradient, add noise) on scikit-learn's bundled digits data.

The model is a `fflow.nn.MLP` (a pytree module: `vmap(grad(...))` of it is a model
whose every leaf has a leading batch axis), and the noisy mean gradient goes through
`fflow.optim.sgd`.

    python examples/per_example_grads.py          # full run (a few seconds)
    python examples/per_example_grads.py --tiny   # quick run (used by the tests)
"""

import argparse
import time

import numpy as np
from _common import load_digits_split

import fflow
import fflow.numpy as jnp
from fflow import nn, optim
from fflow.tree_util import tree_leaves, tree_map


def example_loss(model, x, y):
    """Cross-entropy of ONE example (x: [64], y: scalar label)."""
    logits = model(x)
    logits = logits - jnp.max(logits)
    return jnp.log(jnp.sum(jnp.exp(logits))) - logits[y]


per_example_grads = fflow.jit(fflow.vmap(fflow.grad(example_loss), in_axes=(None, 0, 0)))


def loop_grads(params, xs, ys):
    """The reference: one `grad` call per example, stacked."""
    grads = [fflow.grad(example_loss)(params, x, y) for x, y in zip(xs, ys)]
    return tree_map(lambda *g: np.stack([np.asarray(v) for v in g]), *grads)


TX = optim.sgd(0.5)  # plain SGD: no state to carry between steps


@fflow.jit
def dp_sgd_step(model, xs, ys, noise, clip):
    """One DP-SGD step: clip every example's gradient to norm `clip`, average, add noise."""
    grads = fflow.vmap(fflow.grad(example_loss), in_axes=(None, 0, 0))(model, xs, ys)
    sq = sum(jnp.sum(g.reshape(g.shape[0], -1) ** 2, axis=1) for g in tree_leaves(grads))
    scale = jnp.minimum(1.0, clip / (jnp.sqrt(sq) + 1e-12))
    clipped = tree_map(lambda g: jnp.mean(g * scale.reshape((-1,) + (1,) * (g.ndim - 1)), 0), grads)
    noisy = tree_map(lambda g, n: g + n * clip / xs.shape[0], clipped, noise)
    updates, _ = TX.update(noisy, TX.init(model), model)
    return optim.apply_updates(model, updates)


def accuracy(model, x, y):
    return float(np.mean(np.argmax(np.asarray(model(x)), axis=-1) == y))


def main(steps=300, batch_size=64, hidden=64, check_examples=32, log_every=50, seed=0):
    (xtr, ytr), (xte, yte) = load_digits_split(seed)
    params = nn.MLP(64, 10, width_size=hidden, depth=1, activation=nn.tanh,
                    key=fflow.random.PRNGKey(seed))  # fmt: skip

    # 1. per-example gradients: vmap vs a Python loop
    xs, ys = xtr[:check_examples], ytr[:check_examples]
    t0 = time.perf_counter()
    reference = loop_grads(params, xs, ys)
    t_loop = time.perf_counter() - t0
    per_example_grads(params, xs, ys)  # compile
    t0 = time.perf_counter()
    batched = per_example_grads(params, xs, ys)
    t_vmap = time.perf_counter() - t0
    diff = max(
        float(np.max(np.abs(np.asarray(a) - b)))
        for a, b in zip(tree_leaves(batched), tree_leaves(reference))
    )
    shapes = [tuple(np.shape(g)) for g in tree_leaves(batched)]
    print(f"per-example gradient shapes {shapes}")
    print(
        f"vmap vs Python loop over {check_examples} examples: max |diff| = {diff:.2e}; "
        f"loop {t_loop * 1e3:.1f} ms, jit(vmap(grad)) {t_vmap * 1e3:.2f} ms"
    )

    # 2. differentially private SGD with per-example clipping
    rng = np.random.default_rng(seed)
    clip, sigma = 1.0, 0.5
    for step in range(1, steps + 1):
        idx = rng.integers(0, len(xtr), batch_size)
        noise = tree_map(
            lambda p: jnp.asarray(rng.normal(0, sigma, np.shape(p)).astype(np.float32)), params
        )
        params = dp_sgd_step(params, xtr[idx], ytr[idx], noise, clip)
        if step % log_every == 0 or step == steps:
            print(f"step {step:4d}  test accuracy {accuracy(params, xte, yte):.3f}")
    return diff, accuracy(params, xte, yte)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--tiny", action="store_true", help="a few steps, for the tests")
    args = parser.parse_args()
    if args.tiny:
        main(steps=5, check_examples=8, log_every=5)
    else:
        main(steps=args.steps)
