"""Run by tests/test_planner_control.py on simulated devices (imported) and under
`python -m fflow.launch -n 2` / `-n 4` (as a script): gradient accumulation over more
micro-batches than shard unrolls (80 > 64), each micro-batch's rows split over the
devices, a while_loop and a cond on split rows (under "while" and "cond": their
collectives and values next to NumPy's). Prints (rank 0) the plan's communicating collectives, its bytes, and the
result next to a float64 NumPy reference with the gradient written out, as JSON."""

import json

import numpy as np

import fflow
import fflow.numpy as jnp
from fflow.sharding import B, S, runtime

STEPS, ROWS, D_IN, D_OUT = 80, 16, 8, 4
LOCAL = {"shard_slice", "shard_pad", "keep_one"}  # conversions that move no data


def data(seed=0):
    rng = np.random.default_rng(seed)
    w = (rng.normal(size=(D_IN, D_OUT)) / 3).astype(np.float32)
    xs = rng.normal(size=(STEPS, ROWS, D_IN)).astype(np.float32)
    ys = rng.normal(size=(STEPS, ROWS, D_OUT)).astype(np.float32)
    return w, xs, ys


def loss(w, x, y):
    return jnp.mean((jnp.tanh(x @ w) - y) ** 2)


def accumulate(w, xs, ys):
    """SGD on the mean of the micro-batch gradients (summed in a scan)."""

    def body(acc, xy):
        return acc + fflow.grad(loss)(w, *xy), None

    g, _ = fflow.lax.scan(body, jnp.zeros_like(w), (xs, ys))
    return w - 0.1 * g / STEPS


def numpy_accumulate(w, xs, ys):
    w64 = w.astype(np.float64)
    g = np.zeros_like(w64)
    for x, y in zip(xs.astype(np.float64), ys.astype(np.float64)):
        t = np.tanh(x @ w64)
        g += x.T @ (2.0 * (t - y) * (1.0 - t * t) / t.size)
    return w64 - 0.1 * g / STEPS


def run(pl):
    w, xs, ys = data()
    split = (S(1),) * pl.ndim
    bcast = (B,) * pl.ndim
    f = fflow.shard(accumulate, pl, in_sbp=(bcast, split, split), out_sbp=bcast)
    sp = f.plan(w, xs, ys)
    return {
        "collectives": [c for c in sp.collectives() if c not in LOCAL],
        "bytes": sp.bytes,
        "got": np.asarray(f(w, xs, ys)).tolist(),
        "ref": numpy_accumulate(w, xs, ys).tolist(),
        "devices": pl.size,
    }


def iterate(x, a):
    def body(c):
        i, x = c
        return i + 1, jnp.tanh(x * a + 0.1)

    return fflow.lax.while_loop(lambda c: c[0] < 50, body, (0, x))[1]


def run_while(pl):
    x = np.random.default_rng(5).normal(size=(16, 3)).astype(np.float32)
    a = np.float32(0.9)
    rows = (S(0),) * pl.ndim
    f = fflow.shard(iterate, pl, in_sbp=(rows, (B,) * pl.ndim), out_sbp=rows)
    ref = x.astype(np.float64)
    for _ in range(50):
        ref = np.tanh(ref * 0.9 + 0.1)
    return {
        "collectives": f.plan(x, a).collectives(),
        "got": np.asarray(f(x, a)).tolist(),
        "ref": ref.tolist(),
    }


def branchy(k, x, w):
    return fflow.lax.cond(k > 0, lambda x: jnp.tanh(x @ w), lambda x: x @ w * 2.0, x)


def run_cond(pl):
    rng = np.random.default_rng(7)
    x = rng.normal(size=(64, 8)).astype(np.float32)
    w = rng.normal(size=(8, 5)).astype(np.float32)
    rows, bcast = (S(0),) * pl.ndim, (B,) * pl.ndim
    f = fflow.shard(branchy, pl, in_sbp=(bcast, rows, bcast), out_sbp=rows)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    return {
        "collectives": f.plan(np.int32(1), x, w).collectives(),
        "got": [np.asarray(f(np.int32(k), x, w)).tolist() for k in (1, -1)],
        "ref": [np.tanh(x64 @ w64).tolist(), (x64 @ w64 * 2.0).tolist()],
    }


if __name__ == "__main__":
    n = runtime().device_count()
    pl = fflow.placement("cpu", list(range(n)))
    result = run(pl)
    result["while"] = run_while(pl)
    result["cond"] = run_cond(pl)
    if runtime().rank == 0:
        print("RESULT " + json.dumps(result))
