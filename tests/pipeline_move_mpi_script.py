"""Run by tests/test_pipeline_mpi.py under `python -m fflow.launch -n 2` / `-n 4` and
on as many simulated devices: a global input living on one placement, used by a
sharded function on another (it moves), value and gradients for every source SBP;
prints the numbers both runtimes must agree on as JSON (rank 0 only)."""

import json
import sys

import numpy as np

import fflow
import fflow.numpy as jnp
from fflow.sharding import B, P, S, runtime

SRCS = {"S0": S(0), "S1": S(1), "B": B, "P": P}


def inputs():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(4, 4)).astype(np.float32)
    w = rng.normal(size=(4, 2)).astype(np.float32)
    return x, w


def loss(x, w):
    return jnp.sum(jnp.tanh(x @ w) ** 2)


def placements(n):
    half = n // 2
    return fflow.placement("cpu", list(range(half))), fflow.placement("cpu", list(range(half, n)))


def main():
    rt = runtime()
    n = rt.device_count()
    a, b = placements(n)
    x, wn = inputs()
    out = {}
    for name, src in SRCS.items():
        w = fflow.to_global(wn, b, src)  # lives on b; the function runs on a
        f = fflow.shard(loss, a, in_sbp=(S(0), None))
        out[f"plan_bytes_{name}"] = f.lower(x, w).bytes
        value, (gx, gw) = fflow.value_and_grad(f, argnums=(0, 1))(x, w)
        out[f"value_{name}"] = value
        out[f"gx_{name}"] = gx
        out[f"gw_{name}"] = gw
        out[f"gw_on_b_{name}"] = gw.placement == b
    result = {k: np.asarray(v).tolist() for k, v in out.items()}
    sent = rt.bytes_moved
    if hasattr(rt, "comm"):
        sent = rt.comm.allreduce(sent)
    result["bytes"] = int(sent)
    result["runtime"] = rt.describe()
    if rt.rank == 0:
        print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
    sys.stdout.flush()
