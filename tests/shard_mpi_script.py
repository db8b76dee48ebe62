"""Run by tests/test_shard_mpi.py under `python -m fflow.launch -n N` and on simulated
devices; prints the numbers both runtimes must agree on as JSON (rank 0 only)."""

import json
import sys

import numpy as np

import fflow
import fflow.numpy as jnp
from fflow.sharding import B, P, S, partial_max, runtime


def main(n, fail_rank=None):
    rt = runtime()
    if fail_rank is not None and rt.rank == fail_rank:
        raise RuntimeError(f"rank {fail_rank} failed on purpose")
    pl = fflow.placement("cpu", list(range(n)))
    rng = np.random.default_rng(0)
    x, w1, w2 = (rng.normal(size=s).astype(np.float32) for s in [(10, 16), (16, 24), (24, 16)])
    out = {}

    def mlp(x, w1, w2):
        return jnp.tanh(x @ w1) @ w2

    out["megatron"] = fflow.shard(mlp, pl, in_sbp=(B, S(1), S(0)))(x, w1, w2)

    def loss(w1, w2, x):
        return jnp.mean(mlp(x, w1, w2) ** 2)

    g = fflow.grad(fflow.shard(loss, pl, in_sbp=(B, B, S(0))), argnums=(0, 1))(w1, w2, x)
    out["dp_grad_w1"], out["dp_grad_w2"] = g
    gx = fflow.to_global(x, pl, S(0))
    out["eager"] = jnp.sum(jnp.exp(gx) * 2.0, axis=0).to_global(sbp=B)
    for src, dst in [(S(0), S(1)), (P, S(0)), (partial_max, B), (S(1), P)]:
        v = fflow.to_global(x, pl, src).to_global(sbp=dst)
        out[f"box_{src}_{dst}"] = v.to_global(sbp=B)
    if n == 4:
        mesh = fflow.placement("cpu", [[0, 1], [2, 3]])
        f2 = fflow.shard(mlp, mesh, in_sbp=((S(0), B), (B, S(1)), (B, S(0))))
        out["mesh"] = f2(x, w1, w2)
        out["mesh_box"] = fflow.to_global(x, mesh, (S(0), S(1))).to_global(sbp=(S(1), S(0)))
    result = {k: np.asarray(v).tolist() for k, v in out.items()}
    sent = rt.bytes_moved
    if hasattr(rt, "comm"):
        sent = rt.comm.allreduce(sent)
    result["bytes"] = int(sent)
    if rt.rank == 0:
        print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else None)
