"""shard: (1) a sharded training step on ONE simulated device vs the unsharded jitted step
(target: at most 1.2x), and the per-call overhead of a cache hit of jit(shard(f)) vs
jit(f) for f(x) = x * 2 + 1 on 4 floats (target: at most 1.5x); (2) the communication
of every example plan: bytes from the cost model, bytes the simulated runtime
measured, and the analytic minimum for that plan (Megatron MLP block 1-D and 2-D,
data-parallel MLP step)."""

import numpy as np
from common import interleaved_times, median_time, parse_args

import fflow
import fflow.numpy as jnp
from fflow.sharding import B, S, runtime


def mlp(params, x):
    (w1, b1), (w2, b2) = params
    return jnp.tanh(x @ w1 + b1) @ w2 + b2


def loss(params, x, y):
    return jnp.mean((mlp(params, x) - y) ** 2)


def sgd_step(params, x, y):
    value, grads = fflow.value_and_grad(loss)(params, x, y)
    new = [(w - 0.01 * gw, b - 0.01 * gb) for (w, b), (gw, gb) in zip(params, grads)]
    return value, new


def make(batch, d_in, hidden, d_out, seed=0):
    rng = np.random.default_rng(seed)

    def r(*s):
        return rng.normal(size=s).astype(np.float32) * 0.1

    params = [(r(d_in, hidden), r(hidden)), (r(hidden, d_out), r(d_out))]
    return params, r(batch, d_in), r(batch, d_out)


def one_device_overhead(tiny, reps):
    batch, d_in, hidden, d_out = (32, 16, 32, 4) if tiny else (512, 256, 1024, 64)
    params, x, y = make(batch, d_in, hidden, d_out)
    jitted = fflow.jit(sgd_step)
    pl1 = fflow.placement("cpu", [0])
    sharded = fflow.shard(sgd_step, pl1, in_sbp=B)
    gparams = [tuple(fflow.to_global(a, pl1, B) for a in layer) for layer in params]
    gx, gy = fflow.to_global(x, pl1, B), fflow.to_global(y, pl1, B)
    # interleaved rounds, best of each: this machine's load varies between runs
    t_jit, t_shard = [], []
    for _ in range(5):
        t_jit.append(median_time(lambda: jitted(params, x, y), reps))
        t_shard.append(median_time(lambda: sharded(gparams, gx, gy), reps))
    t_jit, t_shard = min(t_jit), min(t_shard)
    return [("MLP SGD step, 1 device", t_jit, t_shard)]


def dispatch_overhead(tiny):
    """Cache-hit call of jit(f) vs jit(shard(f)) on one device, f(x) = x * 2 + 1 on 4
    floats: a global input (the sharded call's own kind of array) and a local one."""

    def f(x):
        return x * 2 + 1

    x = jnp.arange(4.0)
    pl1 = fflow.placement("cpu", [0])
    jf = fflow.jit(f)
    jsf = fflow.jit(fflow.shard(f, pl1, in_sbp=B, out_sbp=B))
    gx = fflow.to_global(x, pl1, B)
    fns = {"jit": lambda: jf(x), "global": lambda: jsf(gx), "local": lambda: jsf(x)}
    t = interleaved_times(fns, 3 if tiny else 15, inner=50 if tiny else 2000)
    return [
        ("jit(shard(f)) hit, global input, 1 device", t["jit"], t["global"]),
        ("jit(shard(f)) hit, local input, 1 device", t["jit"], t["local"]),
    ]


def plans():
    """(name, ShardedProgram, args, analytic minimum bytes)."""
    out = []
    p = 4
    x, w1, w2 = (
        np.ones((64, 128), np.float32),
        np.ones((128, 512), np.float32),
        np.ones((512, 128), np.float32),
    )

    def block(x, w1, w2):
        return fflow.nn.gelu(x @ w1) @ w2 if hasattr(fflow.nn, "gelu") else jnp.tanh(x @ w1) @ w2

    pl = fflow.placement("cpu", list(range(p)))
    f = fflow.shard(block, pl, in_sbp=(B, S(1), S(0)), out_sbp=B)
    out.append(("Megatron MLP, 4 devices", f, (x, w1, w2), 2 * (p - 1) * x.nbytes))
    mesh = fflow.placement("cpu", [[0, 1], [2, 3]])
    f2 = fflow.shard(block, mesh, in_sbp=((S(0), B), (B, S(1)), (B, S(0))), out_sbp=(S(0), B))
    # two model groups of 2 devices, each all-reduces half the batch: 2 * 2(2-1) T/2
    out.append(("Megatron MLP, 2x2 data x model", f2, (x, w1, w2), 2 * x.nbytes))
    params, xb, yb = make(256, 64, 128, 10)
    dp = fflow.shard(sgd_step, pl, in_sbp=(B, S(0), S(0)), out_sbp=B)
    n_param_bytes = sum(a.nbytes for layer in params for a in layer)
    # one all-reduce per gradient (the loss scalar too): 2(p-1) * bytes
    out.append(("data-parallel MLP step, 4 devices", dp, (params, xb, yb),
                2 * (p - 1) * (n_param_bytes + 4)))  # fmt: skip
    return out


def _fmt(t):
    return f"{t * 1e3:.3f} ms" if t >= 1e-3 else f"{t * 1e6:.2f} us"


def main():
    args = parse_args(__doc__)
    reps = args.reps or (2 if args.tiny else 15)
    # one BLAS thread: on a loaded 2-core machine spinning BLAS workers dominate the timing
    fflow.config.update("blas_threads", 1)
    print("## shard: one simulated device vs unsharded jit\n")
    print("| workload | jit (unsharded) | shard on 1 device | ratio |")
    print("|---|---|---|---|")
    for name, tj, ts in one_device_overhead(args.tiny, reps) + dispatch_overhead(args.tiny):
        print(f"| {name} | {_fmt(tj)} | {_fmt(ts)} | {ts / tj:.2f}x |")
    print("\n## shard: bytes moved per call by each example plan\n")
    print("| workload | collectives | model bytes | measured bytes | minimum | equal |")
    print("|---|---|---|---|---|---|")
    for name, f, fargs, minimum in plans():
        sp = f.plan(*fargs)
        rt = runtime()
        before = rt.bytes_moved
        f(*fargs)
        measured = rt.bytes_moved - before
        ok = measured == sp.bytes == minimum
        colls = ",".join(sorted(set(sp.collectives()))) or "-"
        print(f"| {name} | {colls} | {sp.bytes} | {measured} | {minimum} | {ok} |")


if __name__ == "__main__":
    main()
