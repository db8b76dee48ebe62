"""Run by tests/test_device_profile.py on simulated devices (imported) and under
`python -m fflow.launch -n 2` / `-n 4` (as a script): the data-parallel MLP step of
benchmarks/bench_mpi.py (784-1024-1024-10, batch 256 per device, softmax cross-entropy,
SGD) planned with the default profile, its conversions and values against a float64
NumPy step; under MPI also `profile_devices()` as every rank got it, and raw mpi4py
timings of the same collectives as an independent floor."""

import json
import os
import sys
import tempfile
import time

import numpy as np
from numpy_mlp import relu_mlp_sgd_step

import fflow
import fflow.numpy as jnp
from fflow.sharding import B, S, default_profile, profile_devices, runtime

DIMS = (784, 1024, 1024, 10)
BATCH = 256  # per device
LR = 0.01


def init(n, dims=DIMS, batch=BATCH, seed=0):
    rng = np.random.default_rng(seed)
    params = [
        ((rng.normal(size=(a, b)) * np.sqrt(2.0 / a)).astype(np.float32), np.zeros(b, np.float32))
        for a, b in zip(dims[:-1], dims[1:])
    ]
    x = rng.normal(size=(batch * n, dims[0])).astype(np.float32)
    y = np.eye(dims[-1], dtype=np.float32)[rng.integers(0, dims[-1], batch * n)]
    return params, x, y


def loss_fn(params, x, y):
    h = x
    for w, b in params[:-1]:
        h = jnp.maximum(h @ w + b, 0.0)
    w, b = params[-1]
    logits = h @ w + b
    logp = logits - jnp.log(jnp.sum(jnp.exp(logits), axis=-1, keepdims=True))
    return -jnp.mean(jnp.sum(y * logp, axis=-1))


def step(params, x, y):
    loss, grads = fflow.value_and_grad(loss_fn)(params, x, y)
    return loss, [(w - LR * gw, b - LR * gb) for (w, b), (gw, gb) in zip(params, grads)]


def numpy_step(params, x, y):
    """The same step in float64 NumPy, the backward pass written out."""

    def cross_entropy(logits):
        e = np.exp(logits - logits.max(-1, keepdims=True))
        prob = e / e.sum(-1, keepdims=True)
        return -np.mean(np.sum(y * np.log(prob), -1)), (prob - y) / len(x)

    return relu_mlp_sgd_step(params, x, LR, cross_entropy)


def plan(pl, profile=None, batch=BATCH):
    """(profile name, conversions, new params, loss) of the planned step on `pl`."""
    params, x, y = init(pl.size, batch=batch)
    fn = fflow.shard(step, pl, in_sbp=(B, S(0), S(0)), out_sbp=B, profile=profile)
    sp = fn.plan(params, x, y)
    conversions = [
        (list(v.aval.shape), str(have), str(want), bp.collectives())
        for _, v, have, want, bp in sp.boxings()
        if bp.bytes
    ]
    loss, new = fn(params, x, y)
    ref_loss, ref_new = numpy_step(params, x, y)
    err = max(
        float(np.max(np.abs(np.asarray(a) - r)))
        for wb, rwb in zip(new, ref_new)
        for a, r in zip(wb, rwb)
    )
    return {
        "profile": sp.plan.profile.name,
        "conversions": conversions,
        "loss": float(loss),
        "ref_loss": float(ref_loss),
        "max_err": err,
    }


def measured(pl):
    """profile_devices() on the ranks (written to a file by rank 0) and raw mpi4py
    timings of a 256-byte all-reduce and a 4 MB all-gather (best of 20)."""
    comm = runtime().world
    path = os.path.join(tempfile.gettempdir(), f"fflow_profile_{os.getppid()}.json")
    if comm.Get_rank() == 0 and os.path.exists(path):
        os.remove(path)
    comm.Barrier()
    p = profile_devices(pl, large=1 << 20, path=path)
    small, out = np.ones(64, np.float32), np.empty(64, np.float32)
    rows = np.ones((1 << 20) // 4 // pl.size, np.float32)
    gathered = np.empty(rows.size * pl.size, np.float32)

    def best(fn):
        comm.Barrier()
        t = float("inf")
        for _ in range(20):
            t0 = time.perf_counter()
            fn()
            t = min(t, time.perf_counter() - t0)
        return t

    raw_latency = best(lambda: comm.Allreduce(small, out))
    raw_gather = best(lambda: comm.Allgather(rows, gathered))
    comm.Barrier()
    saved = fflow.sharding.DeviceProfile.load(path).to_json() if comm.Get_rank() == 0 else None
    every = comm.allgather(p.to_json())
    if comm.Get_rank() == 0:
        os.remove(path)
    return {
        "every_rank": every,
        "saved": saved,
        "raw_latency": raw_latency,
        "raw_gather_bw": (pl.size - 1) / pl.size * gathered.nbytes / raw_gather,
        "default": default_profile(pl).name,
    }


if __name__ == "__main__":
    n = runtime().device_count()
    pl = fflow.placement("cpu", list(range(n)))
    result = {"plan": plan(pl), "measured": measured(pl)}
    if runtime().rank == 0:
        print("RESULT " + json.dumps(result), flush=True)
    sys.exit(0)
