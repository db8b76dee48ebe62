"""Per-call overhead of `f(x) = x*2 + 1` on 4 floats: jitted (cache hit) and eager,
fflow vs JAX vs PyTorch vs NumPy."""

import numpy as np
from common import load_jax, load_torch, median_time, parse_args, print_table, wanted


def f(x):
    return x * 2 + 1


def main():
    args = parse_args(__doc__)
    inner = 200 if args.tiny else 20000
    reps = args.reps or (2 if args.tiny else 7)
    x = np.arange(4, dtype=np.float32)
    jit_times, eager_times = {}, {}

    if wanted(args, "fflow"):
        import fflow
        import fflow.numpy as jnp

        fx = jnp.asarray(x)
        jf = fflow.jit(f)
        jit_times["fflow"] = median_time(lambda: jf(fx), reps, inner=inner)
        eager_times["fflow"] = median_time(lambda: f(fx), reps, inner=inner)

    jax = load_jax() if wanted(args, "jax") else None
    if jax is not None:
        jx = jax.numpy.asarray(x)
        jf = jax.jit(f)
        jit_times["jax.jit"] = median_time(lambda: jf(jx), reps, inner=inner)
        eager_times["jax.jit"] = median_time(lambda: f(jx), reps, inner=inner)

    torch = load_torch() if wanted(args, "torch") else None
    if torch is not None:
        tx = torch.tensor(x)
        eager_times["torch eager"] = median_time(lambda: f(tx), reps, inner=inner)

    if wanted(args, "numpy"):
        eager_times["numpy"] = median_time(lambda: f(x), reps, inner=inner)

    print_table(
        "Dispatch: f(x) = x*2+1 on 4 float32",
        [("jit, cache hit", jit_times), ("eager (no jit; jax column = JAX eager)", eager_times)],
    )


if __name__ == "__main__":
    main()
