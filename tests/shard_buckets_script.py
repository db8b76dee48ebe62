"""Run by tests/test_shard_buckets.py on simulated devices (imported) and under
`python -m fflow.launch -n 2` / `-n 4` (as a script): one data-parallel MLP SGD step
(params B, batch S(0)), planned once, then run under several gradient-bucket
settings. Prints (rank 0) per setting the bucket sizes of the device program and a
digest of the loss and new parameters' bytes, and the default setting's arrays, as
JSON.

The plan is fixed (its signatures replayed) because the planner's cost model reads
`grad_bucket_mb` too (transforms/shard_cost.py) and may pick another plan, with other
last bits, for another bucket size; what is tested here is that executing one plan
with buckets started early, waited late, or not at all changes no number."""

import hashlib
import json

import numpy as np
from fflow.transforms.shard_buckets import plan_buckets
from fflow.transforms.shard_exec import ShardedProgram
from shard_plan_dp_script import init, numpy_step, step

import fflow
from fflow.config import config
from fflow.sharding import B, S, runtime
from fflow.tree_util import tree_leaves

DIMS = (16, 64, 64, 10)
BATCH = 64  # 16 / 32 / 64 rows per device on 4 / 2 / 1 devices

# (name, grad_bucket_mb, grad_overlap): off, one bucket per gradient, a few, DDP's default
# 25 MB (one), and that one waited right after it starts
SETTINGS = [
    ("off", 0.0, True),
    ("per_gradient", 1e-6, True),
    ("few", 0.01, True),
    ("default", 25.0, True),
    ("waited_at_start", 25.0, False),
]


def digest(values):
    h = hashlib.sha256()
    for v in values:
        h.update(np.ascontiguousarray(np.asarray(v)).tobytes())
    return h.hexdigest()


def run(pl):
    params, x, y = init(DIMS, BATCH)
    args = tree_leaves((params, x, y))
    planned = fflow.shard(step, pl, in_sbp=(B, S(0), S(0)), out_sbp=B).plan(params, x, y)
    out = {"devices": pl.size, "digest": {}, "buckets": {}}
    try:
        for name, mb, overlap in SETTINGS:
            config.update("grad_bucket_mb", mb)
            config.update("grad_overlap", overlap)
            sp = ShardedProgram(
                planned.program, pl, planned.in_sbps, planned.out_sbps,
                sigs=planned.plan.eqn_sigs,
            )  # fmt: skip
            out["buckets"][name] = [b.nbytes for b in plan_buckets(sp.local_program(0))]
            got = sp.run_values(args)
            out["digest"][name] = digest(got)
            assert digest(sp.run_values(args)) == out["digest"][name]  # the same, run again
            if name == "default":
                out["loss"] = float(got[0])
                out["params"] = [np.asarray(a).tolist() for a in got[1:]]
    finally:
        config.update("grad_bucket_mb", 25.0)
        config.update("grad_overlap", True)
    ref_loss, ref_new = numpy_step(params, x, y)
    out["ref_loss"] = float(ref_loss)
    out["ref_params"] = [a.tolist() for wb in ref_new for a in wb]
    return out


if __name__ == "__main__":
    n = runtime().device_count()
    result = run(fflow.placement("cpu", list(range(n))))
    if runtime().rank == 0:
        print("RESULT " + json.dumps(result))
