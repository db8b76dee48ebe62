"""Tensor parallelism with SBP: a Megatron-style MLP block, on a 1-D and a 2-D mesh.

    python examples/tensor_parallel.py                      # simulated devices
    python -m fflow.launch -n 4 examples/tensor_parallel.py # 4 MPI ranks
    python examples/tensor_parallel.py --tiny               # small sizes (tests)

Only the weights are annotated: the first weight is split on its columns (S(1)),
the second on its rows (S(0)). The planner then keeps the hidden activation
split (no communication), sees that the second matmul gives partial sums (P) and
inserts ONE all-reduce in the forward pass. On a 2x2 mesh (data x model) the
batch is also split over the first mesh axis, and the all-reduce runs within
each model group on half of the batch. The script prints each plan, the bytes
it moves, and checks the numbers against the unsharded block.

Per-rank data: every device builds only its own slice of the weights (and of the
batch on the mesh) with `fflow.make_global_array`; the full arrays exist only for
the unsharded reference check.
"""

import argparse
import sys

import numpy as np

import fflow
import fflow.numpy as jnp
from fflow.sharding import device_count, local_box, runtime

S, B = fflow.sbp.split, fflow.sbp.broadcast


def gelu(x):
    return 0.5 * x * (1.0 + jnp.tanh(0.7978845608 * (x + 0.044715 * x**3)))


def mlp_block(x, w1, w2):
    return gelu(x @ w1) @ w2


def block_loss(w1, w2, x):
    return jnp.mean(mlp_block(x, w1, w2) ** 2)


def own_slice(full, placement, sbp):
    """A global array from each device's own slice of `full` (as if each rank loaded
    or initialised only its part)."""
    nd = sbp if isinstance(sbp, tuple) else (sbp,)

    def piece(i):
        box = local_box(full.shape, nd, placement.hierarchy, placement.coords(i))
        return full[tuple(slice(a, b) for a, b in box)]

    return fflow.make_global_array(piece, placement, nd)


def measured(fn, *args):
    rt = runtime()
    before = rt.bytes_moved
    out = fn(*args)
    mine = rt.bytes_moved - before
    if fflow.process_count() > 1:  # MPI: every rank counts what it sent
        mine = rt.comm.allreduce(mine)
    return out, mine


def report(title, sharded, args, reference, rank0):
    plan = sharded.plan(*args)
    out, moved = measured(sharded, *args)
    got = [np.asarray(o) for o in (out if isinstance(out, (tuple, list)) else [out])]
    want = reference if isinstance(reference, (tuple, list)) else [reference]
    err = max(float(np.max(np.abs(g - np.asarray(w)))) for g, w in zip(got, want))
    if rank0:
        print(f"== {title}")
        print(plan)
        comm = [c for c in plan.collectives() if c not in ("shard_slice", "keep_one")]
        print(f"communicating collectives: {comm}; bytes per call: plan {plan.bytes}, "
              f"measured {moved}; max error vs unsharded {err:.2e}\n")  # fmt: skip
    assert moved == plan.bytes, (moved, plan.bytes)
    assert err < 1e-3, err
    return plan


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args(argv)
    if args.tiny:
        args.batch, args.d_model = 8, 16
    rank0 = fflow.process_index() == 0
    n = min(4, device_count())
    rng = np.random.default_rng(0)
    d, h = args.d_model, 4 * args.d_model
    x = rng.normal(size=(args.batch, d)).astype(np.float32)
    w1 = (rng.normal(size=(d, h)) / np.sqrt(d)).astype(np.float32)
    w2 = (rng.normal(size=(h, d)) / np.sqrt(h)).astype(np.float32)
    ref = np.asarray(mlp_block(x, w1, w2))

    line = fflow.placement("cpu", list(range(n)))
    fwd = fflow.shard(mlp_block, line, in_sbp=(None, S(1), S(0)))
    w1_cols, w2_rows = own_slice(w1, line, S(1)), own_slice(w2, line, S(0))
    plan = report(f"Megatron MLP block on {n} devices", fwd, (x, w1_cols, w2_rows), ref, rank0)
    assert plan.collectives().count("all_reduce") == 1

    grads = fflow.shard(fflow.grad(block_loss, argnums=(0, 1)), line, in_sbp=(S(1), S(0), B))
    ref_grads = fflow.grad(block_loss, argnums=(0, 1))(w1, w2, x)
    report("its gradient (weights stay split)", grads, (w1_cols, w2_rows, x), ref_grads, rank0)

    if n == 4:
        mesh = fflow.placement("cpu", [[0, 1], [2, 3]])
        fwd2 = fflow.shard(
            mlp_block, mesh, in_sbp=((S(0), B), (B, S(1)), (B, S(0))), out_sbp=(S(0), B)
        )
        args2 = (
            own_slice(x, mesh, (S(0), B)),
            own_slice(w1, mesh, (B, S(1))),
            own_slice(w2, mesh, (B, S(0))),
        )
        plan2 = report("2x2 mesh: data (axis 0) x model (axis 1)", fwd2, args2, ref, rank0)
        assert plan2.collectives().count("all_reduce") == 1
    return plan


if __name__ == "__main__":
    main(sys.argv[1:])
