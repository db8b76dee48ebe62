"""Run by tests/test_shard_plan_keep.py on simulated devices (imported) and under
`python -m fflow.launch -n 2` and `-n 4` (as a script): a 2-layer pre-LN transformer Adam step
(benchmarks/planner_models.py) with Megatron-annotated weights held to their SBPs by
`shard(..., keep_in_sbp=)`, on a 1-D mesh of every device and (with 4 devices) a 2x2
(data x model) mesh. Prints
(rank 0) per mesh the planned conversions of (b, t, d) activations, whether any kept
input is converted, the largest matmul work share, and the step's values next to the
same step unsharded, as JSON; and ("remat") the gradient of the same model with each
layer under `checkpoint`, its SBPs and values next to the unsharded gradient."""

import json
import os
import sys

import numpy as np
from fflow.transforms.shard_cost import work_share

import fflow
from fflow.sharding import runtime

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
import planner_models as pm  # noqa: E402

LAYERS, HEADS = 2, 4
SIZE = (8, 64, 32)  # small enough to run; the free plan is Megatron here too
# where the free plan is not (it reduce-scatters and all-gathers block outputs on the
# 1-D mesh, all-gathers weights at 8,512,512): planned only
BIG = {"1d": (8, 256, 64), "2x2": (8, 512, 512)}


def run(pl, size=SIZE, layers=LAYERS, values=True):
    b, t, d = size
    f, args = pm.megatron_sharded(
        pl, layers, b, t, d, HEADS, keep=True, profile=fflow.sharding.H200
    )
    sp = f.plan(*args)
    h = pl.hierarchy
    kept_vars = {sp.exec_program.invars[i] for i in sp.plan.problem.kept}
    loss = sp.exec_program.outvars[0]  # the forward pass ends where the loss is made
    fwd_end = next(k for k, e in enumerate(sp.exec_program.eqns) if loss in e.outputs)
    acts = [
        (str(have), str(want), bp.collectives(), "forward" if k <= fwd_end else "backward")
        for k, v, have, want, bp in sp.boxings()
        if bp.bytes and v.aval.shape == (b, t, d)
    ]
    shares = [
        work_share(e, sig, h)
        for e, sig in zip(sp.exec_program.eqns, sp.plan.eqn_sigs)
        if e.primitive.name == "dot_general"
    ]
    got = fflow.tree_util.tree_flatten(f(*args))[0] if values else []
    ref = fflow.tree_util.tree_flatten(pm.train_step(*args, heads=HEADS))[0] if values else []
    return {
        "layers": layers,
        "devices": int(np.prod(h)),
        "kept": len(kept_vars),
        "kept_converted": sum(1 for _, v, _, _, _ in sp.boxings() if v in kept_vars),
        "activations": acts,
        "max_share": max(shares),
        "got": [np.asarray(g).tolist() for g in got],
        "ref": [np.asarray(r).tolist() for r in ref],
    }


def remat_loss(params, x, y):
    """pm.loss with every layer under `checkpoint` (recomputed in the backward pass)."""
    lay = fflow.checkpoint(pm.layer, static_argnums=(2,))
    for p in params:
        x = lay(p, x, HEADS)
    return fflow.numpy.mean(fflow.numpy.square(x - y))


def sharded_loss(pl, d=32, layers=LAYERS, remat=True):
    """(`remat_loss` or pm.loss sharded with Megatron-annotated weights kept, args)."""
    params = pm.init(layers, d)
    sbp = pm.megatron_sbp(params, pl.ndim == 2)
    f = fflow.shard(
        remat_loss if remat else pm.loss, pl, in_sbp=(sbp[0], sbp[2], sbp[3]),
        keep_in_sbp=(True, False, False), profile=fflow.sharding.H200,
    )  # fmt: skip
    return f, sbp


def run_remat(pl, size=SIZE):
    """`value_and_grad` of the sharded checkpointed loss: each gradient's SBP and the
    annotated one, values next to the unsharded `value_and_grad` of pm.loss."""
    b, t, d = size
    f, sbp = sharded_loss(pl, d)
    params, (x, y) = pm.init(LAYERS, d), pm.data(b, t, d)
    value, grads = fflow.value_and_grad(f)(params, x, y)
    rv, rg = fflow.value_and_grad(pm.loss)(params, x, y)
    leaves = fflow.tree_util.tree_flatten(grads)[0]
    annotated = fflow.tree_util.tree_flatten(sbp[0], is_leaf=lambda s: isinstance(s, tuple))[0]
    return {
        "sbps": [str(g.sbp) for g in leaves],
        "annotated": [str(fflow.sharding.as_nd_sbp(s, pl.ndim, "")) for s in annotated],
        "got": [np.asarray(g).tolist() for g in [value, *leaves]],
        "ref": [np.asarray(r).tolist() for r in [rv, *fflow.tree_util.tree_flatten(rg)[0]]],
    }


def check_remat(out):
    """`run_remat`'s gradients are in the annotated SBPs and equal the unsharded ones."""
    assert out["sbps"] == out["annotated"]  # S(1) / S(0) weights, B layernorm parameters
    for g, r in zip(out["got"], out["ref"]):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=2e-4, atol=2e-5)


def placements(n=4):
    out = {"1d": fflow.placement("cpu", list(range(n)))}
    if n == 4:
        out["2x2"] = fflow.placement("cpu", [[0, 1], [2, 3]])
    return out


if __name__ == "__main__":
    out = {name: run(pl) for name, pl in placements(runtime().device_count()).items()}
    # (the 2x2 remat run is simulated only: it adds ~10 s to a loaded 4-rank launch)
    out["remat"] = {"1d": run_remat(placements(runtime().device_count())["1d"])}
    if runtime().rank == 0:
        print("RESULT " + json.dumps(out), flush=True)
