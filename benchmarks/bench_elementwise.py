"""Elementwise chain `tanh(gelu(a*x + b)) * c` on 4M float32 values, forward and
gradient (of the sum, w.r.t. x): fflow jit vs JAX jit vs PyTorch eager vs naive NumPy."""

import math

import numpy as np
from bench_mlp import cpu_and_preemption
from common import interleaved_times, load_jax, load_torch, parse_args, print_table, wanted

A, B, C = 1.5, 0.25, 0.75
K = math.sqrt(2 / math.pi)


def gelu(jnp, x):
    # the tanh approximation (jax.nn.gelu's default)
    return 0.5 * x * (1 + jnp.tanh(K * (x + 0.044715 * x**3)))


def numpy_forward(x):
    # u*u*u, not u**3: NumPy's float power calls powf per element (~100x slower)
    u = A * x + B
    return np.tanh(0.5 * u * (1 + np.tanh(K * (u + 0.044715 * (u * u * u))))) * C


def numpy_grad(x):
    u = A * x + B
    inner = K * (u + 0.044715 * (u * u * u))
    t = np.tanh(inner)
    g = 0.5 * u * (1 + t)
    dg = 0.5 * (1 + t) + 0.5 * u * (1 - t * t) * K * (1 + 3 * 0.044715 * u * u)
    h = np.tanh(g)
    return C * (1 - h * h) * dg * A


def main():
    args = parse_args(__doc__)
    n = 4096 if args.tiny else 4 * 1024 * 1024
    reps = args.reps or (2 if args.tiny else 15)
    x = np.random.default_rng(0).normal(size=n).astype(np.float32)
    fwd_fns, grad_fns = {}, {}

    if wanted(args, "fflow"):
        import fflow
        import fflow.numpy as jnp

        def f(x):
            return jnp.tanh(gelu(jnp, A * x + B)) * C

        ff = fflow.jit(f)
        fg = fflow.jit(fflow.grad(lambda x: jnp.sum(f(x))))
        fx = jnp.asarray(x)
        fwd_fns["fflow"] = lambda: ff(fx)
        grad_fns["fflow"] = lambda: fg(fx)

    jax = load_jax() if wanted(args, "jax") else None
    if jax is not None:
        jax_np = jax.numpy

        def jf(x):
            return jax_np.tanh(gelu(jax_np, A * x + B)) * C

        jff = jax.jit(jf)
        jfg = jax.jit(jax.grad(lambda x: jax_np.sum(jf(x))))
        jx = jax_np.asarray(x)
        fwd_fns["jax.jit"] = lambda: jff(jx).block_until_ready()
        grad_fns["jax.jit"] = lambda: jfg(jx).block_until_ready()

    torch = load_torch() if wanted(args, "torch") else None
    if torch is not None:
        tx = torch.tensor(x)

        def tf(x):
            return torch.tanh(gelu(torch, A * x + B)) * C

        fwd_fns["torch eager"] = lambda: tf(tx)

        def tgrad():
            xx = tx.detach().requires_grad_(True)
            tf(xx).sum().backward()
            return xx.grad

        grad_fns["torch eager"] = tgrad

    if wanted(args, "numpy"):
        fwd_fns["numpy"] = lambda: numpy_forward(x)
        grad_fns["numpy"] = lambda: numpy_grad(x)

    notes = []
    results = []
    for label, fns in (("forward", fwd_fns), ("grad", grad_fns)):
        picks = None
        if "fflow" in fns:
            from fflow import threads

            threads.picks.clear()
        results.append(interleaved_times(fns, reps))
        if "fflow" in fns:
            # the forward once kept 1 thread (1.06x JAX) while the grad ran on 2: say so
            picks = ", ".join(f"{k}: {c}" for k, c in sorted(threads.picks.items()))
        pair = {k: f for k, f in fns.items() if k in ("fflow", "jax.jit")}
        cpu = cpu_and_preemption(pair, reps) if len(pair) == 2 else {}
        if picks or cpu:
            notes.append(
                f"{label}: fflow's calls per thread count {picks or 'n/a'}; CPU per call "
                "(process, median), calls descheduled: "
                + (
                    ", ".join(f"{k} {c * 1e3:.2f} ms, {late:.0%}" for k, (c, late) in cpu.items())
                    or "n/a"
                )
                + "."
            )
    fwd, grad = results
    print_table(
        "Elementwise chain tanh(gelu(a*x+b))*c",
        [(f"forward, {n} float32", fwd), (f"grad, {n} float32", grad)],
        " ".join(notes),
    )


if __name__ == "__main__":
    main()
