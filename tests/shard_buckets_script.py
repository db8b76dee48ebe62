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
from fflow.transforms import shard_buckets
from fflow.transforms.shard_buckets import plan_buckets
from fflow.transforms.shard_exec import ShardedProgram
from shard_plan_dp_script import init, numpy_step, step

import fflow
import fflow.numpy as jnp
from fflow.config import config
from fflow.sharding import B, P, S, runtime
from fflow.tree_util import tree_leaves

DIMS = (16, 64, 64, 10)
BATCH = 64  # 16 / 32 / 64 rows per device on 4 / 2 / 1 devices

# (name, grad_bucket_mb, grad_overlap, SPLIT_BYTES): off, one bucket per gradient, a few,
# DDP's default 25 MB (one), that one waited right after it starts, and with every
# gradient from 1 KB reduced alone in place (shard_buckets.Bucket.parts)
SETTINGS = [
    ("off", 0.0, True, 1 << 20),
    ("per_gradient", 1e-6, True, 1 << 20),
    ("few", 0.01, True, 1 << 20),
    ("default", 25.0, True, 1 << 20),
    ("waited_at_start", 25.0, False, 1 << 20),
    ("in_place", 25.0, True, 1024),
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
    kept = [np.array(a) for a in args]
    try:
        for name, mb, overlap, split in SETTINGS:
            config.update("grad_bucket_mb", mb)
            config.update("grad_overlap", overlap)
            shard_buckets.SPLIT_BYTES[0] = split
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
        out["inputs_kept"] = all(np.array_equal(a, b) for a, b in zip(args, kept))
        out["partial_input"] = partial_input(pl)
    finally:
        config.update("grad_bucket_mb", 25.0)
        config.update("grad_overlap", True)
        shard_buckets.SPLIT_BYTES[0] = 1 << 20
    ref_loss, ref_new = numpy_step(params, x, y)
    out["ref_loss"] = float(ref_loss)
    out["ref_params"] = [a.tolist() for wb in ref_new for a in wb]
    return out


def partial_input(pl):
    """A bucket whose member is the caller's own partial value (a P input boxed to B, with
    compute behind it): its all-reduce must not write into the caller's array."""
    rng = np.random.default_rng(3)
    parts = [rng.normal(size=(64, 32)).astype(np.float32) for _ in range(pl.size)]
    copies = [p.copy() for p in parts]
    w = rng.normal(size=(32, 32)).astype(np.float32)
    g = fflow.make_global_array(lambda i: parts[i], pl, P)
    f = fflow.shard(lambda g, w: (g, jnp.tanh(w @ w)), pl, in_sbp=(P, B), out_sbp=(B, B))
    buckets = plan_buckets(f.plan(g, w).local_program(0))
    total, _ = f(g, w)
    total = np.asarray(total)
    ref = parts[0].astype(np.float64)
    for q in parts[1:]:
        ref = ref + q
    return {
        "buckets": [b.nbytes for b in buckets],
        "kept": all(np.array_equal(a, b) for a, b in zip(parts, copies)),
        "digest": digest([total]),
        "close": bool(np.allclose(total, ref, rtol=1e-6, atol=1e-6)),
    }


if __name__ == "__main__":
    n = runtime().device_count()
    result = run(fflow.placement("cpu", list(range(n))))
    if runtime().rank == 0:
        print("RESULT " + json.dumps(result))
