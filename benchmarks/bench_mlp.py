"""MLP training step (784-512-512-10, batch 128, ReLU, softmax cross-entropy, SGD):
fflow jit vs JAX jit vs PyTorch eager vs hand-written NumPy; and the first call
(trace + lower + compile + run) of fflow vs JAX."""

import time

import numpy as np
from common import (
    interleaved_times,
    load_jax,
    load_torch,
    parse_args,
    print_table,
    settle,
    wanted,
)

LR = 0.01


def sizes(tiny):
    return (8, (784, 32, 32, 10)) if tiny else (128, (784, 512, 512, 10))


def init(dims, seed=0):
    rng = np.random.default_rng(seed)
    params = []
    for a, b in zip(dims[:-1], dims[1:]):
        params.append((rng.normal(0, a**-0.5, (a, b)).astype(np.float32), np.zeros(b, np.float32)))
    return params


def data(batch, dims, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batch, dims[0])).astype(np.float32)
    y = np.eye(dims[-1], dtype=np.float32)[rng.integers(0, dims[-1], batch)]
    return x, y


def make_step(jnp, nn, value_and_grad, lr=LR):
    """The SGD training step, written once for either library (fflow or JAX)."""

    def loss(params, x, y):
        h = x
        for i, (w, b) in enumerate(params):
            h = h @ w + b
            if i < len(params) - 1:
                h = jnp.maximum(h, 0.0)
        return -jnp.mean(jnp.sum(nn.log_softmax(h) * y, axis=-1))

    def step(params, x, y):
        value, grads = value_and_grad(loss)(params, x, y)
        new = [(w - lr * gw, b - lr * gb) for (w, b), (gw, gb) in zip(params, grads)]
        return new, value

    return step


def make_fflow_step(lr=LR):
    import fflow
    import fflow.numpy as jnp

    return fflow.jit(make_step(jnp, fflow.nn, fflow.value_and_grad, lr), donate_argnums=0)


def make_jax_step(jax, lr=LR):
    return jax.jit(make_step(jax.numpy, jax.nn, jax.value_and_grad, lr))


def numpy_step(params, x, y, lr=LR):
    """Hand-written forward and backward, updating the parameters in place."""
    acts = [x]
    h = x
    for i, (w, b) in enumerate(params):
        h = h @ w
        h += b
        if i < len(params) - 1:
            np.maximum(h, 0, out=h)
        acts.append(h)
    logits = acts[-1]
    m = logits.max(axis=-1, keepdims=True)
    e = np.exp(logits - m)
    s = e.sum(axis=-1, keepdims=True)
    logp = logits - m - np.log(s)
    loss = -np.mean(np.sum(logp * y, axis=-1))
    g = (e / s - y) / x.shape[0]
    for i in range(len(params) - 1, -1, -1):
        w, b = params[i]
        a = acts[i]
        gw = a.T @ g
        gb = g.sum(axis=0)
        if i > 0:
            g = g @ w.T
            g *= acts[i] > 0
        w -= lr * gw
        b -= lr * gb
    return params, loss


def torch_setup(torch, params):
    tp = [
        (torch.tensor(w, requires_grad=True), torch.tensor(b, requires_grad=True))
        for w, b in params
    ]

    def step(x, y):
        h = x
        for i, (w, b) in enumerate(tp):
            h = h @ w + b
            if i < len(tp) - 1:
                h = torch.relu(h)
        loss = -(torch.log_softmax(h, -1) * y).sum(-1).mean()
        for w, b in tp:
            w.grad = None
            b.grad = None
        loss.backward()
        with torch.no_grad():
            for w, b in tp:
                w -= LR * w.grad
                b -= LR * b.grad
        return loss

    return step


def step_flops(batch, dims):
    """FLOPs of the GEMMs of one step: forward, weight gradients, input gradients of
    every layer but the first (the data needs none)."""
    pairs = list(zip(dims[:-1], dims[1:]))
    fwd = sum(2 * batch * a * b for a, b in pairs)
    return 2 * fwd + sum(2 * batch * a * b for a, b in pairs[1:])


def thread_note(pool_before=None):
    """How many threads fflow's adaptive steps ran their GEMMs on, which kernels, and
    what the C pool did over the timed calls (`pool_before`: its counters before
    them, if given)."""
    from fflow.lowering import cpu_gemm

    from fflow import threads

    counts = ", ".join(f"{n}: {c}" for n, c in sorted(threads.picks.items()))
    lib = "this CPU's (a private copy)" if cpu_gemm._own[0] else "NumPy's"
    note = f"fflow's calls per GEMM thread count: {counts or 'none'}; OpenBLAS kernels: {lib}."
    after = cpu_gemm.pool_stats()
    if after and pool_before:
        d = {k: after[k] - pool_before[k] for k in after}
        note += (
            f" C pool over the timed calls: {d['shared jobs']} jobs shared with a worker,"
            f" chunks by the caller {d['caller chunks']} / workers {d['worker chunks']},"
            f" backups of late chunks {d['backups']} ({d['backups of descheduled workers']}"
            f" of descheduled workers), caller waited {d['wait seconds'] * 1e3:.2f} ms."
        )
    return note


def cpu_and_preemption(fns, reps):
    """Per framework: median CPU seconds of the process per step, and the share of calls
    whose wall time exceeded 1.5x their CPU time (the OS ran something else meanwhile).

    Beside busy processes the wall times are two clusters, steps that ran through and
    steps that were descheduled for a time slice, so the median wall time jumps between
    them from run to run; equal CPU per step says the frameworks did the same work.
    """
    cpu = {name: [] for name in fns}
    late = {name: 0 for name in fns}
    names = list(fns)
    for r in range(reps):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            settle()
            c0, t0 = time.process_time(), time.perf_counter()
            fns[name]()
            c, t = time.process_time() - c0, time.perf_counter() - t0
            cpu[name].append(c)
            late[name] += t > 1.5 * c
    return {n: (float(np.median(cpu[n])), late[n] / reps) for n in names}


def sgemm_limit(reps):
    """Best float32 GFLOP/s of a 512^3 GEMM here: one thread and fflow's pool, interleaved."""
    from fflow.lowering import cpu_gemm

    from fflow import threads

    rng = np.random.default_rng(0)
    a, b = rng.random((512, 512), np.float32), rng.random((512, 512), np.float32)
    out = np.empty((512, 512), np.float32)
    cores = threads.available_cores()
    fns = {n: (lambda n=n: cpu_gemm.matmul(a, b, out, n)) for n in sorted({1, cores})}
    times = interleaved_times(fns, reps)
    return {n: 2 * 512**3 / t / 1e9 for n, t in times.items()}


def main():
    args = parse_args(__doc__)
    batch, dims = sizes(args.tiny)
    reps = args.reps or (2 if args.tiny else 30)
    x, y = data(batch, dims)
    step_times_fns, first_times = {}, {}

    if wanted(args, "fflow"):
        import fflow.numpy as jnp

        step = make_fflow_step()
        state = {"p": [(jnp.asarray(w.copy()), jnp.asarray(b.copy())) for w, b in init(dims)]}
        fx, fy = jnp.asarray(x), jnp.asarray(y)

        def run_fflow():
            state["p"], loss = step(state["p"], fx, fy)
            return loss

        step_times_fns["fflow"] = run_fflow
        firsts = []
        for k in range(1 if args.tiny else 3):
            params = [(jnp.asarray(w), jnp.asarray(b)) for w, b in init(dims)]
            t0 = time.perf_counter()
            fresh = make_fflow_step(LR * (1 + k))  # a new function: trace + lower + compile
            fresh(params, fx, fy)[1].block_until_ready()
            firsts.append(time.perf_counter() - t0)
        first_times["fflow"] = float(np.median(firsts))

    jax = load_jax() if wanted(args, "jax") else None
    if jax is not None:
        jax_step = make_jax_step(jax)
        jax_state = {"p": [(jax.numpy.asarray(w), jax.numpy.asarray(b)) for w, b in init(dims)]}
        jx, jy = jax.numpy.asarray(x), jax.numpy.asarray(y)

        def run_jax():
            jax_state["p"], loss = jax_step(jax_state["p"], jx, jy)
            loss.block_until_ready()

        step_times_fns["jax.jit"] = run_jax
        firsts = []
        for k in range(1 if args.tiny else 3):
            params = [(jax.numpy.asarray(w), jax.numpy.asarray(b)) for w, b in init(dims)]
            t0 = time.perf_counter()
            fresh = make_jax_step(jax, LR * (1 + k))
            fresh(params, jx, jy)[1].block_until_ready()
            firsts.append(time.perf_counter() - t0)
        first_times["jax.jit"] = float(np.median(firsts))

    torch = load_torch() if wanted(args, "torch") else None
    if torch is not None:
        tstep = torch_setup(torch, init(dims))
        tx, ty = torch.tensor(x), torch.tensor(y)
        step_times_fns["torch eager"] = lambda: tstep(tx, ty)

    if wanted(args, "numpy"):
        params = init(dims)
        step_times_fns["numpy"] = lambda: numpy_step(params, x, y)

    pool_before = None
    if "fflow" in step_times_fns:
        from fflow.lowering import cpu_gemm

        from fflow import threads

        threads.picks.clear()
        pool_before = cpu_gemm.pool_stats()
    step_times = interleaved_times(step_times_fns, reps)
    pool_note = thread_note(pool_before) if "fflow" in step_times else ""
    name = f"MLP step {'-'.join(map(str, dims))}, batch {batch}"
    flops = step_flops(batch, dims)
    parts = [f"GEMM work of the step: {flops / 1e6:.0f} MFLOP"]
    for label, key in (("fflow", "fflow"), ("JAX", "jax.jit")):
        if key in step_times:
            parts.append(f"{label} achieves {flops / step_times[key] / 1e9:.0f} GFLOP/s")
    if "fflow" in step_times:
        limit = sgemm_limit(reps)
        rates = ", ".join(f"{n} thread(s) {g:.0f}" for n, g in limit.items())
        parts.append(f"sgemm limit measured in the same run (512^3, GFLOP/s): {rates}")
    note = "; ".join(parts) + "." if len(parts) > 1 else ""
    if pool_note:
        note += f" {pool_note}"
    pair = {n: f for n, f in step_times_fns.items() if n in ("fflow", "jax.jit")}
    if pair:
        cpu = cpu_and_preemption(pair, reps)
        note += (
            " CPU time per step (process, median) and calls descheduled: "
            + ", ".join(f"{n} {c * 1e3:.2f} ms, {late:.0%}" for n, (c, late) in cpu.items())
            + "."
        )
    print_table(
        "MLP training step",
        [(name, step_times), ("first call (trace+lower+compile+run)", first_times)],
        note,
    )


if __name__ == "__main__":
    main()
