"""Transformer block training step (seq 128, d 256, 4 heads, MLP 1024, batch 8; pre-LN,
softmax attention, GELU MLP, mean-square loss, SGD): fflow jit vs JAX jit vs PyTorch
eager. (No hand-written NumPy backward for this one: the column shows n/a.)"""

import numpy as np
from bench_mlp import cpu_and_preemption, thread_note
from common import interleaved_times, load_jax, load_torch, parse_args, print_table, wanted

LR = 1e-3


def sizes(tiny):
    # batch, seq, d_model, heads, d_mlp
    return (2, 8, 16, 2, 32) if tiny else (8, 128, 256, 4, 1024)


def init(d, m, seed=0):
    rng = np.random.default_rng(seed)

    def w(*shape):
        return rng.normal(0, shape[0] ** -0.5, shape).astype(np.float32)

    return {
        "ln1": np.ones(d, np.float32),
        "ln2": np.ones(d, np.float32),
        "wqkv": w(d, 3 * d),
        "wo": w(d, d),
        "w1": w(d, m),
        "b1": np.zeros(m, np.float32),
        "w2": w(m, d),
        "b2": np.zeros(d, np.float32),
    }


def block(np_like, nn, p, x, heads):
    """One pre-LN transformer block, written against a NumPy-like module."""
    b, s, d = x.shape
    hd = d // heads

    def ln(x, g):
        mu = np_like.mean(x, axis=-1, keepdims=True)
        var = np_like.mean((x - mu) * (x - mu), axis=-1, keepdims=True)
        return (x - mu) / np_like.sqrt(var + 1e-5) * g

    h = ln(x, p["ln1"])
    qkv = h @ p["wqkv"]
    q, k, v = qkv[..., :d], qkv[..., d : 2 * d], qkv[..., 2 * d :]

    def split(t):
        return np_like.transpose(np_like.reshape(t, (b, s, heads, hd)), (0, 2, 1, 3))

    q, k, v = split(q), split(k), split(v)
    att = nn.softmax((q @ np_like.swapaxes(k, -1, -2)) * (hd**-0.5), axis=-1)
    o = np_like.reshape(np_like.transpose(att @ v, (0, 2, 1, 3)), (b, s, d))
    x = x + o @ p["wo"]
    h = ln(x, p["ln2"])
    h = nn.gelu(h @ p["w1"] + p["b1"])
    return x + h @ p["w2"] + p["b2"]


def make_run(np_like, nn, value_and_grad, jit, params, x, heads, wait=False):
    """A jitted SGD step on the block for one library (fflow or JAX), as a no-argument
    call that updates its own parameters; `wait` blocks until the result is ready."""

    def loss(p, x):
        return np_like.mean(block(np_like, nn, p, x, heads) ** 2)

    @jit
    def step(p, x):
        value, g = value_and_grad(loss)(p, x)
        return {k: p[k] - LR * g[k] for k in p}, value

    state = {"p": {k: np_like.asarray(v) for k, v in params.items()}}
    x = np_like.asarray(x)

    def run():
        state["p"], value = step(state["p"], x)
        if wait:
            value.block_until_ready()

    return run


def main():
    args = parse_args(__doc__)
    b, s, d, heads, m = sizes(args.tiny)
    reps = args.reps or (2 if args.tiny else 10)
    params = init(d, m)
    x = np.random.default_rng(1).normal(size=(b, s, d)).astype(np.float32)
    times_fns = {}

    if wanted(args, "fflow"):
        import fflow
        import fflow.numpy as jnp

        times_fns["fflow"] = make_run(
            jnp, fflow.nn, fflow.value_and_grad, fflow.jit, params, x, heads
        )

    jax = load_jax() if wanted(args, "jax") else None
    if jax is not None:
        times_fns["jax.jit"] = make_run(
            jax.numpy, jax.nn, jax.value_and_grad, jax.jit, params, x, heads, wait=True
        )

    torch = load_torch() if wanted(args, "torch") else None
    if torch is not None:
        import types

        tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
        tx = torch.tensor(x)
        tnp = types.SimpleNamespace(
            mean=lambda t, axis, keepdims: t.mean(dim=axis, keepdim=keepdims),
            sqrt=torch.sqrt,
            transpose=lambda t, perm: t.permute(*perm),
            reshape=lambda t, shape: t.reshape(shape),
            swapaxes=lambda t, a, b: t.transpose(a, b),
        )
        tnn = types.SimpleNamespace(
            softmax=lambda t, axis: torch.softmax(t, dim=axis),
            gelu=lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
        )

        def trun():
            for t in tp.values():
                t.grad = None
            value = (block(tnp, tnn, tp, tx, heads) ** 2).mean()
            value.backward()
            with torch.no_grad():
                for t in tp.values():
                    t -= LR * t.grad

        times_fns["torch eager"] = trun

    if "fflow" in times_fns:
        from fflow import threads

        threads.picks.clear()
    times = interleaved_times(times_fns, reps)
    note = thread_note() if "fflow" in times else ""
    pair = {n: f for n, f in times_fns.items() if n in ("fflow", "jax.jit")}
    if len(pair) == 2:
        cpu = cpu_and_preemption(pair, reps)
        note += (
            " CPU time per step (process, median) and calls descheduled: "
            + ", ".join(f"{n} {c * 1e3:.2f} ms, {late:.0%}" for n, (c, late) in cpu.items())
            + "."
        )
    print_table(
        "Transformer block training step",
        [(f"batch {b}, seq {s}, d {d}, {heads} heads, MLP {m}", times)],
        note,
    )


if __name__ == "__main__":
    main()
