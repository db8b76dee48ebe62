"""Run by tests/test_shard_plan_dp.py on simulated devices (imported) and under
`python -m fflow.launch -n 2` / `-n 4` (as a script): a data-parallel MLP SGD step
(params B, batch S(0), outputs B) planned with the default CPU profile. Prints
(rank 0) the plan's conversions and bytes, the loss and the new parameters, and the
same step in NumPy (forward, backward by hand), as JSON."""

import json

import numpy as np
from numpy_mlp import relu_mlp_sgd_step

import fflow
import fflow.numpy as jnp
from fflow.sharding import B, S, runtime

DIMS = (16, 256, 256, 256, 10)
BATCH = 512
LR = 0.1


def init(dims=DIMS, batch=BATCH, seed=0):
    rng = np.random.default_rng(seed)
    params = [
        ((rng.normal(size=(a, b)) / np.sqrt(a)).astype(np.float32), np.zeros(b, np.float32))
        for a, b in zip(dims[:-1], dims[1:])
    ]
    x = rng.normal(size=(batch, dims[0])).astype(np.float32)
    y = rng.normal(size=(batch, dims[-1])).astype(np.float32)
    return params, x, y


def loss_fn(params, x, y):
    h = x
    for i, (w, b) in enumerate(params):
        h = h @ w + b
        if i < len(params) - 1:
            h = jnp.maximum(h, 0.0)
    return jnp.mean((h - y) ** 2)


def step(params, x, y):
    loss, grads = fflow.value_and_grad(loss_fn)(params, x, y)
    return loss, [(w - LR * gw, b - LR * gb) for (w, b), (gw, gb) in zip(params, grads)]


def numpy_step(params, x, y):
    """The same step in float64 NumPy, the backward pass written out."""

    def mean_squared_error(out):
        diff = out - y
        return np.mean(diff**2), 2.0 * diff / diff.size

    return relu_mlp_sgd_step(params, x, LR, mean_squared_error)


def run(pl, dims=DIMS, batch=BATCH):
    params, x, y = init(dims, batch)
    fn = fflow.shard(step, pl, in_sbp=(B, S(0), S(0)), out_sbp=B)
    sp = fn.plan(params, x, y)
    conversions = [
        (v.aval.shape, str(have), str(want), bp.collectives(), bp.bytes)
        for _, v, have, want, bp in sp.boxings()
        if bp.bytes
    ]
    loss, new = fn(params, x, y)
    ref_loss, ref_new = numpy_step(params, x, y)
    got = [np.asarray(a).tolist() for wb in new for a in wb]
    ref = [a.tolist() for wb in ref_new for a in wb]
    return {
        "conversions": conversions,
        "bytes": sp.bytes,
        "loss": float(loss),
        "ref_loss": float(ref_loss),
        "params": got,
        "ref_params": ref,
        "devices": pl.size,
    }


if __name__ == "__main__":
    n = runtime().device_count()
    result = run(fflow.placement("cpu", list(range(n))))
    if runtime().rank == 0:
        print("RESULT " + json.dumps(result))
