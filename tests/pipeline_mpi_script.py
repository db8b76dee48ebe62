"""Run by tests/test_pipeline_mpi.py under `python -m fflow.launch -n 4` and on 4
simulated devices: moves between placements and pipelined training steps; prints
the numbers both runtimes must agree on as JSON (rank 0 only)."""

import json
import sys

import numpy as np

import fflow
import fflow.numpy as jnp
from fflow.pipeline_trace import StepTrace
from fflow.sharding import B, P, S, partial_max, runtime


def stage(params, xy):
    x, y = xy
    return jnp.tanh(x @ params["w"] + params["b"]), y


def last(params, xy):
    x, y = xy
    return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


def int_label_data():
    rng = np.random.default_rng(11)
    return rng.integers(0, 8, size=10).astype(np.int32), rng.normal(size=(10, 3)).astype(np.float32)


def last_ce(params, xy):
    """Cross-entropy of int labels."""
    x, y = xy
    z = x @ params["w"] + params["b"]
    z = z - jnp.max(z, axis=1, keepdims=True)
    logp = z - jnp.log(jnp.sum(jnp.exp(z), axis=1, keepdims=True))
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


def make(n_stages, seed=0, d_last=1):
    rng = np.random.default_rng(seed)
    out = []
    for s in range(n_stages):
        d_out = d_last if s == n_stages - 1 else 8
        d_in = 3 if s == 0 else 8
        w = (rng.normal(size=(d_in, d_out)) / np.sqrt(d_in)).astype(np.float32)
        out.append({"w": w, "b": np.zeros(d_out, np.float32)})
    return out


def mixed(x, w1, w2, src, dst, pl_b):
    """A program on two placements: layer 1 on `a`, moved (src -> dst SBP), layer 2 on b."""
    h = jnp.tanh(x @ w1)
    if src is not None:  # None: the SBP h leaves in is chosen by cost
        h = fflow.with_sbp(h, src)
    h = fflow.with_sbp(h, dst, placement=pl_b)
    return jnp.sum(jnp.tanh(h @ w2) ** 2)


MIXED_PAIRS = [(s, d) for s in ("S0", "S1", "B") for d in ("S0", "S1", "B", "P")]
SBPS = {"S0": S(0), "S1": S(1), "B": B, "P": P}


def mixed_inputs():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4, 3)).astype(np.float32)
    w1 = rng.normal(size=(3, 4)).astype(np.float32)
    w2 = rng.normal(size=(4, 2)).astype(np.float32)
    return x, w1, w2


def mixed_cases():
    """Value and gradients of `mixed` sharded over [0,1] -> [2,3] for every SBP pair,
    onto a 2x2 mesh, and with the source SBP left to the planner."""
    a, b = fflow.placement("cpu", [0, 1]), fflow.placement("cpu", [2, 3])
    mesh = fflow.placement("cpu", [[0, 1], [2, 3]])
    args = mixed_inputs()
    out = {}
    cases = [(f"mixed_{s}_{d}", SBPS[s], SBPS[d], b) for s, d in MIXED_PAIRS]
    cases.append(("mixed_mesh", S(0), (S(1), B), mesh))
    cases.append(("mixed_free_B", None, B, b))
    for name, src, dst, pl_b in cases:
        f = fflow.shard(
            lambda x, w1, w2, src=src, dst=dst, pl_b=pl_b: mixed(x, w1, w2, src, dst, pl_b),
            a,
            in_sbp=(S(0), B, B),
        )
        value, grads = fflow.value_and_grad(f, argnums=(0, 1, 2))(*args)
        out[name] = [value] + list(grads)
    return out


def main():
    rt = runtime()
    out = {}
    for name, vals in mixed_cases().items():
        for i, v in enumerate(vals):
            out[f"{name}_{i}"] = v
    a, b = fflow.placement("cpu", [0, 1]), fflow.placement("cpu", [2, 3])
    x = np.arange(30.0, dtype=np.float32).reshape(5, 6) / 7
    for src in [S(0), S(1), B, P, partial_max]:
        for dst in [S(0), S(1), B, P]:
            g = fflow.to_global(x, a, src)
            out[f"move_{src}_{dst}"] = fflow.to_global(g, b, dst) * 1.0
    mesh = fflow.placement("cpu", [[0, 1], [2, 3]])
    out["move_to_mesh"] = fflow.to_global(fflow.to_global(x, a, S(0)), mesh, (S(1), P))

    rng = np.random.default_rng(1)
    bx = rng.normal(size=(8, 3)).astype(np.float32)
    by = rng.normal(size=(8, 1)).astype(np.float32)
    one = [fflow.placement("cpu", [i]) for i in range(4)]
    runs = {
        "1f1b": (fflow.pipeline([stage] * 3 + [last], one, 4), 4),
        "gpipe": (fflow.pipeline([stage] * 3 + [last], one, 2, schedule="gpipe"), 4),
        # v=2 virtual stages on each of the 4 ranks: 8 stages
        "interleaved": (fflow.pipeline([stage] * 7 + [last], one, 4, "interleaved"), 8),
        "dp_pp": (
            fflow.pipeline([stage, last], [a, b], 2, in_sbp=[(B, (S(0), S(0)))] * 2),
            2,
        ),
    }
    traces = {}
    for name, (f, n) in runs.items():
        params = make(n)
        for _ in range(2):  # two SGD steps: parameters stay on their stages
            loss, grads = fflow.value_and_grad(f)(params, (bx, by))
            params = fflow.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)
        out[f"{name}_loss"] = loss
        for s, p in enumerate(params):
            out[f"{name}_w{s}"] = p["w"]
        # what each process ran (simulated: every operation; MPI: its own stages'),
        # and the executed schedule's ticks, from the traces of every process
        trace = StepTrace.gather(f)
        traces[f"{name}_ticks"] = [trace.ticks().span] + trace.ticks().idle
        traces[f"{name}_lanes"] = [
            [lane.name, sorted({f"{k}{s}" for k, s, *_ in lane.ops})] for lane in trace.lanes
        ]
        traces[f"{name}_ops_here"] = sorted({f"{o.kind}{o.stage}" for o in f.stats["trace"]})
        wall = trace.wall()  # per rank, from timestamps (None: simulated devices)
        traces[f"{name}_wall"] = wall and [
            len(wall.idle),
            all(0 <= i < 1 for i in wall.idle),
            all(0 < b <= wall.span for b in wall.busy),
            len(trace.picture().splitlines()),
        ]
    # int labels passed along, m=5 (a last group smaller than p), the input gradient too
    labels, xs = int_label_data()
    f = fflow.pipeline([stage] * 3 + [last_ce], one, 5)
    value, (grads, gx) = fflow.value_and_grad(lambda p, x: f(p, (x, labels)), argnums=(0, 1))(
        make(4, d_last=8), xs
    )
    out["int_labels_loss"], out["int_labels_gx"] = value, gx
    for s, g in enumerate(grads):
        out[f"int_labels_gw{s}"] = g["w"]
    result = {k: np.asarray(v).tolist() for k, v in out.items()}
    result["traces"] = traces
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
