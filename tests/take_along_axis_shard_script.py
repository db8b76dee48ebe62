"""Run by tests/test_take_along_axis.py on simulated devices (imported) and under
`python -m fflow.launch -n 2` / `-n 4` (as a script): `value_and_grad` of a token
cross-entropy, `take_along_axis(log_softmax(logits), targets[..., None], -1)`, sharded
with the batch split on a 1-D mesh of every device (logits and targets S(0)) and, with 4
devices, vocabulary-parallel on a 2x2 mesh (logits (S(0), S(2)), targets (S(0), B)).
Prints (rank 0) per mesh every planned conversion that moves bytes, the signature of
each take_along_axis / scatter_add_along_axis, and the values next to the same
function unsharded, as JSON."""

import json

import numpy as np

import fflow
import fflow.numpy as jnp
from fflow import nn
from fflow.sharding import B, S, runtime

SHAPE = (8, 6, 10)  # batch, tokens, vocabulary


def cross_entropy(logits, targets):
    logp = nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


def data():
    rng = np.random.default_rng(0)
    b, t, v = SHAPE
    return rng.normal(size=SHAPE).astype(np.float32), rng.integers(0, v, (b, t)).astype(np.int32)


def layouts(n):
    out = {"1d": (fflow.placement("cpu", list(range(n))), (S(0),), (S(0),))}
    if n == 4:
        out["2x2"] = (fflow.placement("cpu", [[0, 1], [2, 3]]), (S(0), S(2)), (S(0), B))
    return out


def run(pl, logits_sbp, targets_sbp):
    logits, targets = data()
    f = fflow.shard(
        fflow.value_and_grad(cross_entropy),
        pl,
        in_sbp=(logits_sbp, targets_sbp),
        out_sbp=((B,) * pl.ndim, logits_sbp),
    )
    sp = f.plan(logits, targets)
    moves = [
        [list(v.aval.shape), str(have), str(want), list(bp.collectives())]
        for _, v, have, want, bp in sp.boxings()
        if bp.bytes
    ]
    sigs = [
        [e.primitive.name, str(sig.ins), str(sig.outs)]
        for e, sig in zip(sp.exec_program.eqns, sp.plan.eqn_sigs)
        if "along_axis" in e.primitive.name
    ]
    value, grad = f(logits, targets)
    ref_value, ref_grad = fflow.value_and_grad(cross_entropy)(logits, targets)
    return {
        "devices": pl.size,
        "moves": moves,
        "sigs": sigs,
        "got": [float(value), np.asarray(grad).tolist()],
        "ref": [float(ref_value), np.asarray(ref_grad).tolist()],
        "grad_sbp": str(grad.sbp),
    }


if __name__ == "__main__":
    out = {name: run(*lay) for name, lay in layouts(runtime().device_count()).items()}
    if runtime().rank == 0:
        print("RESULT " + json.dumps(out), flush=True)
