"""Run by tests/test_shard_fsdp.py on simulated devices (imported) and under
`python -m fflow.launch -n 2` / `-n 4` (as a script; FSDP_MESH=2x2 in the environment
makes the 4 ranks a 2x2 mesh): an MLP Adam step with only the batch annotated (S(0),
on a 2-D mesh (S(0), S(0)): split over every device) and a memory budget below every plan that keeps the
parameters whole or gathers each once (data parallelism, ZeRO-1/2, parameters split
with one shared gather), so only FSDP fits: parameters and Adam state stored split,
each weight all-gathered for its forward use and again for its backward use.
Prints (rank 0) the plan's rung, peak and budget, its conversions, the loss and new
parameters, the bytes of live arrays measured before every stage of the device
programs, and the same step in float64 NumPy (backward written out), as JSON."""

import json
import os

import numpy as np
from fflow.transforms import shard_exec

import fflow
import fflow.numpy as jnp
from fflow.sharding import H200, B, S, runtime

DIMS = (16, 96, 96, 96, 8)
BATCH = 128
LR, B1, B2, EPS = 1e-2, 0.9, 0.999, 1e-8


def init(dims=DIMS, batch=None, seed=0):
    batch = batch or BATCH
    rng = np.random.default_rng(seed)
    params = [
        ((rng.normal(size=(a, b)) / np.sqrt(a)).astype(np.float32), np.zeros(b, np.float32))
        for a, b in zip(dims[:-1], dims[1:])
    ]
    opt = [
        tuple(
            (rng.normal(size=a.shape) * 0.01).astype(np.float32) ** k for a in wb
        )  # m (k=1), v (k=2 > 0)
        for wb in params
        for k in (1, 2)
    ]
    x = rng.normal(size=(batch, dims[0])).astype(np.float32)
    y = rng.normal(size=(batch, dims[-1])).astype(np.float32)
    return params, opt, x, y


def loss_fn(params, x, y):
    h = x
    for i, (w, b) in enumerate(params):
        h = h @ w + b
        if i < len(params) - 1:
            h = jnp.tanh(h)
    return jnp.mean((h - y) ** 2)


def step(params, opt, x, y):
    loss, grads = fflow.value_and_grad(loss_fn)(params, x, y)
    new_p, new_o = [], []
    for j, (wb, gwb) in enumerate(zip(params, grads)):
        ms, vs = opt[2 * j], opt[2 * j + 1]
        nm = tuple(B1 * m + (1 - B1) * g for m, g in zip(ms, gwb))
        nv = tuple(B2 * v + (1 - B2) * g * g for v, g in zip(vs, gwb))
        new_p.append(tuple(p - LR * m / (jnp.sqrt(v) + EPS) for p, m, v in zip(wb, nm, nv)))
        new_o += [nm, nv]
    return loss, new_p, new_o


def numpy_step(params, opt, x, y):
    """The same step in float64 NumPy, the backward pass written out."""
    hs, pre = [x.astype(np.float64)], []
    for i, (w, b) in enumerate(params):
        z = hs[-1] @ w + b
        pre.append(z)
        hs.append(np.tanh(z) if i < len(params) - 1 else z)
    diff = hs[-1] - y
    loss = np.mean(diff**2)
    g = 2.0 * diff / diff.size
    grads = [None] * len(params)
    for i in reversed(range(len(params))):
        w, _ = params[i]
        if i < len(params) - 1:
            g = g * (1 - np.tanh(pre[i]) ** 2)
        grads[i] = (hs[i].T @ g, g.sum(0))
        g = g @ np.asarray(w, np.float64).T
    new_p, new_o = [], []
    for j, (wb, gwb) in enumerate(zip(params, grads)):
        ms, vs = opt[2 * j], opt[2 * j + 1]
        nm = [B1 * m + (1 - B1) * gg for m, gg in zip(ms, gwb)]
        nv = [B2 * v + (1 - B2) * gg * gg for v, gg in zip(vs, gwb)]
        new_p.append([p - LR * m / (np.sqrt(v) + EPS) for p, m, v in zip(wb, nm, nv)])
        new_o += [nm, nv]
    return loss, new_p, new_o


def mesh_placement(n, mesh=None):
    """The placement of `n` devices: 1-D, or the 2-D mesh "2x2" names."""
    if not mesh:
        return fflow.placement("cpu", list(range(n)))
    shape = tuple(int(k) for k in mesh.split("x"))
    assert np.prod(shape) == n, (mesh, n)
    return fflow.placement("cpu", np.arange(n).reshape(shape).tolist())


def batch_sbp(pl):
    """The batch split over every device (on a 2-D mesh a nested split of dim 0)."""
    return (S(0),) * pl.ndim


def peaks_without_fsdp(pl, args):
    """The liveness peaks of the plans that do not gather per use: parameters and state
    as given (B), the Adam state split, and parameters split too (one gather each),
    split over every device (every dim here has an even share); each returns its state
    as it came in, as memory_limit's storage rungs do, with the search they get (so a
    better search that fits a rung under this budget cannot pass for needing FSDP)."""
    from fflow.transforms.shard_memory import LADDER_SEARCH, peak_memory

    split, whole, data = batch_sbp(pl), (B,) * pl.ndim, batch_sbp(pl)
    out = []
    for p_sbp, o_sbp in ((whole, whole), (whole, split), (split, split)):
        sbp = (p_sbp, o_sbp, data, data)
        f = fflow.shard(step, pl, sbp, (None, p_sbp, o_sbp), profile=H200)
        if o_sbp is split:  # (planned with the search those rungs get)
            f.plan_options.update(LADDER_SEARCH)
        sp = f.plan(*args)
        out.append(peak_memory(sp.plan.problem, sp.plan.sig_index)[0])
    return out


def run(pl):
    params, opt, x, y = init()
    args = (params, opt, x, y)
    budget = min(peaks_without_fsdp(pl, args)) - 1
    data = batch_sbp(pl)
    fn = fflow.shard(step, pl, in_sbp=(None, None, data, data), profile=H200, memory_limit=budget)
    sp = fn.plan(*args)
    conversions = [
        (list(v.aval.shape), str(have), str(want), bp.collectives(), bp.bytes)
        for _, v, have, want, bp in sp.boxings()
        if bp.bytes
    ]
    seen = [0]

    def probe(env):  # bytes of live arrays before every stage (device_steps), any device
        bufs = {}  # (a device's piece of an input may be a view of the caller's array)
        for a in env.values():
            a = np.asarray(a)
            bufs[(a.__array_interface__["data"][0], a.nbytes)] = a.nbytes
        seen[0] = max(seen[0], sum(bufs.values()))

    shard_exec.live_probe = probe
    try:
        loss, new_p, new_o = fn(*args)
    finally:
        shard_exec.live_probe = None
    ref_loss, ref_p, ref_o = numpy_step(params, opt, x, y)
    return {
        "devices": pl.size,
        "mesh": list(pl.hierarchy),
        "stored": [str(s) for s in sp.in_sbps],
        "budget": budget,
        "peak": sp.peak_memory,
        "measured": seen[0],
        "rung": sp.storage_rung,
        "per_use": sp.gathered_per_use,
        "bytes": sp.bytes,
        "conversions": conversions,
        "loss": float(loss),
        "ref_loss": float(ref_loss),
        "got": [np.asarray(a).tolist() for t in new_p + new_o for a in t],
        "ref": [np.asarray(a).tolist() for t in ref_p + ref_o for a in t],
    }


if __name__ == "__main__":
    n = runtime().device_count()
    result = run(mesh_placement(n, os.environ.get("FSDP_MESH")))
    if runtime().rank == 0:
        print("RESULT " + json.dumps(result))
