"""Pieces several examples share: the digits data, an MLP initialiser and Adam.

Imported as `import _common` (an example's own folder is on `sys.path` when it
runs as a script); not an example itself.
"""

import numpy as np

import fflow.numpy as jnp
from fflow.tree_util import tree_map


def load_digits_split(seed=0, test_fraction=0.2):
    """Digits 8x8 images scaled to [0, 1], shuffled, split into train and test sets."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return (x[train], y[train]), (x[test], y[test])


def init_mlp(sizes, seed=0):
    """He-initialised weights and zero biases, a {"w", "b"} dict for each layer of `sizes`."""
    rng = np.random.default_rng(seed)
    params = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        w = rng.normal(0.0, np.sqrt(2.0 / n_in), (n_in, n_out)).astype(np.float32)
        params.append({"w": jnp.asarray(w), "b": jnp.zeros(n_out)})
    return params


def adam_init(params):
    zeros = tree_map(jnp.zeros_like, params)
    return {"m": zeros, "v": zeros, "t": jnp.zeros((), jnp.float32)}


def adam_update(params, grads, state, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
    """One Adam step over any pytree of parameters, written with `tree_map`."""
    t = state["t"] + 1.0
    m = tree_map(lambda m, g: b1 * m + (1 - b1) * g, state["m"], grads)
    v = tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, state["v"], grads)
    scale = lr * jnp.sqrt(1 - b2**t) / (1 - b1**t)
    params = tree_map(lambda p, m, v: p - scale * m / (jnp.sqrt(v) + eps), params, m, v)
    return params, {"m": m, "v": v, "t": t}
