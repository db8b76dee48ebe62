"""Run by tests/test_mpi_nccl.py: fflow's NCCL runtime (lowering/cuda_nccl.py) under
`FFLOW_RUNTIME=nccl python -m fflow.launch -n N`, with the stand-ins for CuPy and
`cupy.cuda.nccl` (tests/fake_cupy.py, tests/fake_nccl.py); on simulated devices
without them. Prints the numbers both must agree on, and which NCCL calls ran."""

import json
import os
import sys

import numpy as np

if os.environ.get("FFLOW_RUNTIME") == "nccl":
    import fake_nccl

    fake_nccl.install()

import fflow  # noqa: E402
import fflow.numpy as jnp  # noqa: E402
from fflow.sharding import B, P, S, partial_max, runtime  # noqa: E402


def main(n):
    rt = runtime()
    pl = fflow.placement("cpu", list(range(n)))
    rng = np.random.default_rng(1)
    x = rng.normal(size=(7, 5)).astype(np.float32)  # uneven over 2 and 4 devices
    out = {}
    for src in [S(0), S(1), B]:
        for dst in [S(0), S(1), B]:
            out[f"box_{src}_{dst}"] = fflow.to_global(x, pl, src).to_global(sbp=dst)
    parts = [x * (i + 1) for i in range(n)]
    mine = parts if not hasattr(rt, "world") else parts[fflow.process_index()]
    for op in (P, partial_max):
        for dst in [B, S(0), S(1)]:
            g = fflow.make_global_array(mine, pl, op)
            out[f"reduce_{op}_{dst}"] = g.to_global(sbp=dst)
    xb = fflow.to_global(x.astype(np.float16), pl, P)
    out["f16_sum"] = xb.to_global(sbp=B)
    if n == 4:
        mesh = fflow.placement("cpu", [[0, 1], [2, 3]])
        out["mesh"] = fflow.to_global(x, mesh, (S(0), S(1))).to_global(sbp=(S(1), S(0)))

    def loss(w, x):
        return jnp.mean(jnp.tanh(x @ w) ** 2)

    # moves between placements (point to point) and a 2-stage pipeline step
    fake = sys.modules.get("fake_nccl")
    before = len(fake.calls) if fake else 0
    half = n // 2
    a, b = fflow.placement("cpu", list(range(half))), fflow.placement("cpu", list(range(half, n)))
    for src in [S(0), B, P]:
        for dst in [S(1), B]:
            out[f"move_{src}_{dst}"] = fflow.to_global(fflow.to_global(x, a, src), b, dst) * 1.0
    stages = [lambda w, x: jnp.tanh(x @ w), lambda w, x: jnp.mean((x @ w) ** 2)]
    pipe = fflow.pipeline(stages, [a, b], 2, in_sbp=[(B, S(0))] * 2)
    ws = [rng.normal(size=(5, 4)).astype(np.float32), rng.normal(size=(4, 2)).astype(np.float32)]
    out["pipe_loss"], grads = fflow.value_and_grad(pipe)(ws, x[:4])
    out["pipe_g0"], out["pipe_g1"] = grads
    if fake:
        out_calls = fake.calls[before:]
        p2p_calls = sum(1 for c in out_calls if c[0] in ("send", "recv"))
    w = rng.normal(size=(5, 3)).astype(np.float32)
    out["dp_grad"] = fflow.grad(fflow.shard(loss, pl, in_sbp=(B, S(0))))(w, x)

    def loss2(w, v, x):
        return jnp.mean(jnp.tanh(x @ w) @ v)

    # two gradients: one bucket, started on the NCCL stream and waited where first used
    v = rng.normal(size=(3, 2)).astype(np.float32)
    dp2 = fflow.shard(loss2, pl, in_sbp=(B, B, S(0)))
    buckets = sys.modules.get("fake_nccl")
    out["dp_bucket_w"], out["dp_bucket_v"] = fflow.grad(dp2, argnums=(0, 1))(w, v, x)
    if buckets:
        bucket_calls = [c for c in buckets.calls if c[0] == "allReduce"]
    result = {k: np.asarray(v).astype(np.float32).tolist() for k, v in out.items()}
    if "fake_nccl" in sys.modules:
        result["calls"] = sorted({c[0] for c in sys.modules["fake_nccl"].calls})
        result["p2p_calls"] = p2p_calls
        result["last_all_reduce_count"] = bucket_calls[-1][1]
        result["runtime"] = rt.describe()
    if fflow.process_index() == 0:
        print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main(int(sys.argv[1]))
