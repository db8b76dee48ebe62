"""Run by tests/test_optim_shard.py on simulated devices (imported) and under
`python -m fflow.launch -n 4` (as a script): an AdamW step with tensor-parallel
parameters, their optimizer state sharded like them, or ZeRO-split, on a 2x2 mesh
(data x model) and on a 1-D data-parallel line; the same AdamW inside
`optim.mixed_precision` with a loss scale and an inf in one batch (that step must be
skipped on every device). Prints the losses and final parameters as JSON (rank 0), and
the optimizer-state bytes one device holds."""

import json

import numpy as np

import fflow
import fflow.numpy as jnp
from fflow import optim
from fflow.sharding import B, S, runtime

STEPS = 4


def init(seed=0):
    rng = np.random.default_rng(seed)
    params = {
        "w1": rng.normal(size=(8, 16)).astype(np.float32) / 3,
        "b1": np.zeros(16, np.float32),
        "w2": rng.normal(size=(16, 4)).astype(np.float32) / 4,
        "b2": np.zeros(4, np.float32),
    }
    x = rng.normal(size=(STEPS, 8, 8)).astype(np.float32)
    y = rng.normal(size=(STEPS, 8, 4)).astype(np.float32)
    return {k: jnp.asarray(v) for k, v in params.items()}, x, y


def loss_fn(p, x, y):
    h = jnp.tanh(x @ p["w1"] + p["b1"])
    return jnp.mean((h @ p["w2"] + p["b2"] - y) ** 2)


TX = optim.chain(optim.clip_by_global_norm(1.0), optim.adamw(1e-2, weight_decay=0.1))


def step(p, s, x, y):
    loss, g = fflow.value_and_grad(loss_fn)(p, x, y)
    u, s = TX.update(g, s, p)
    return optim.apply_updates(p, u), s, loss


def run(step_fn, params, x, y):
    state = TX.init(params)
    losses = []
    for i in range(STEPS):
        params, state, loss = step_fn(params, state, x[i], y[i])
        losses.append(float(loss))
    return losses, {k: np.asarray(v).tolist() for k, v in params.items()}, state


def sharded(pl, param_sbp, data_sbp, zero):
    params, x, y = init()
    state_sbp = optim.state_sbp(TX, params, param_sbp, pl, zero=zero)
    fn = fflow.shard(
        step,
        pl,
        in_sbp=(param_sbp, state_sbp, data_sbp, data_sbp),
        out_sbp=(param_sbp, state_sbp, B if pl.ndim == 1 else (B, B)),
    )
    return fn, params, x, y, state_sbp


TXZ = optim.chain(optim.clip_by_global_norm(1.0), optim.adamw(1e-2, weight_decay=0.1, zero=True))


def step_zero(p, s, x, y):
    loss, g = fflow.value_and_grad(loss_fn)(p, x, y)
    u, s = TXZ.update(g, s, p)
    return optim.apply_updates(p, u), s, loss


def zero_on_optimizer(pl):
    """`adamw(..., zero=True)`: no state SBPs given to shard (None: the state's own SBP in,
    the planner's choice out); init on global parameters splits the state, and update
    keeps it split."""
    params, x, y = init()
    params = {k: fflow.to_global(v, pl, B) for k, v in params.items()}
    fn = fflow.shard(step_zero, pl, in_sbp=(B, None, S(0), S(0)), out_sbp=(B, None, B))
    state = TXZ.init(params)
    losses = []
    for i in range(STEPS):
        params, state, loss = fn(params, state, x[i], y[i])
        losses.append(float(loss))
    final = {k: np.asarray(v).tolist() for k, v in params.items()}
    return (losses, final), state


def state_bytes_on_one_device(state):
    """Bytes of optimizer state one device holds (its first local shard of each leaf)."""
    leaves = fflow.tree_util.tree_leaves(state)
    return int(sum(np.asarray(x.to_local_shards()[0]).nbytes for x in leaves))


BAD = 2  # the step whose batch holds an inf: its gradients overflow
TXM = optim.mixed_precision(TX, init_scale=2.0**10, period=2, factor=2.0)


def step_mixed(p, s, x, y):
    scale = s.loss_scale
    loss, g = fflow.value_and_grad(lambda p: loss_fn(p, x, y) * scale)(p)
    u, s = TXM.update(g, s, p)
    return optim.apply_updates(p, u), s, loss / scale


def run_mixed(pl=None, param_sbp=None, data_sbp=None):
    """mixed_precision(AdamW): (losses of the finite steps, final params, loss scale after
    each step, skipped steps); sharded on `pl` when given."""
    params, x, y = init()
    x = x.copy()
    x[BAD, 0, 0] = np.inf
    fn = fflow.jit(step_mixed)
    if pl is not None:
        state_sbp = optim.state_sbp(TXM, params, param_sbp, pl)
        loss_sbp = B if pl.ndim == 1 else (B, B)
        fn = fflow.shard(step_mixed, pl, in_sbp=(param_sbp, state_sbp, data_sbp, data_sbp),
                         out_sbp=(param_sbp, state_sbp, loss_sbp))  # fmt: skip
    state, losses, scales = TXM.init(params), [], []
    for i in range(STEPS):
        with np.errstate(invalid="ignore", over="ignore"):  # step BAD: inf on purpose
            params, state, loss = fn(params, state, x[i], y[i])
        scales.append(float(state.loss_scale))
        if i != BAD:
            losses.append(float(loss))
    final = {k: np.asarray(v).tolist() for k, v in params.items()}
    return losses, final, scales, int(state.skipped)


def main():
    n = runtime().device_count()
    params, x, y = init()
    out = {"reference": run(step, params, x, y)[:2]}
    mixed = {"unsharded": run_mixed()}
    line = fflow.placement("cpu", list(range(min(n, 4))))
    for zero in (False, True):
        fn, params, x, y, _ = sharded(line, {k: B for k in params}, S(0), zero)
        losses, final, state = run(fn, params, x, y)
        out[f"dp_zero={zero}"] = losses, final
        out[f"state_bytes_zero={zero}"] = state_bytes_on_one_device(state), line.size
    (losses, final), state = zero_on_optimizer(line)
    out["adamw(zero=True)"] = losses, final
    out["state_bytes_adamw(zero=True)"] = state_bytes_on_one_device(state), line.size
    if n >= 4:
        mesh = fflow.placement("cpu", [[0, 1], [2, 3]])
        tp = {"w1": (B, S(1)), "b1": (B, S(0)), "w2": (B, S(0)), "b2": (B, B)}
        fn, params, x, y, _ = sharded(mesh, tp, (S(0), B), False)
        out["dp_x_tp"] = run(fn, params, x, y)[:2]
        mixed["dp_x_tp"] = run_mixed(mesh, tp, (S(0), B))
    mixed["dp"] = run_mixed(line, {k: B for k in params}, S(0))
    out["mixed"] = mixed
    return out


if __name__ == "__main__":
    result = main()
    if runtime().rank == 0:
        print("RESULT " + json.dumps(result))
