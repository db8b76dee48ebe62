"""Per-call overhead of `f(x) = x*2 + 1` on 4 floats: jitted (cache hit) and eager,
fflow vs JAX vs PyTorch vs NumPy."""

import numpy as np
from common import interleaved_times, load_jax, load_torch, parse_args, print_table, wanted


def f(x):
    return x * 2 + 1


def main():
    args = parse_args(__doc__)
    inner = 200 if args.tiny else 20000
    reps = args.reps or (2 if args.tiny else 7)
    x = np.arange(4, dtype=np.float32)
    jit_times_fns, eager_times_fns = {}, {}

    if wanted(args, "fflow"):
        import fflow
        import fflow.numpy as jnp

        fx = jnp.asarray(x)
        jf = fflow.jit(f)
        jit_times_fns["fflow"] = lambda: jf(fx)
        eager_times_fns["fflow"] = lambda: f(fx)

    jax = load_jax() if wanted(args, "jax") else None
    if jax is not None:
        jx = jax.numpy.asarray(x)
        jax_f = jax.jit(f)
        jit_times_fns["jax.jit"] = lambda: jax_f(jx)
        eager_times_fns["jax.jit"] = lambda: f(jx)

    torch = load_torch() if wanted(args, "torch") else None
    if torch is not None:
        tx = torch.tensor(x)
        eager_times_fns["torch eager"] = lambda: f(tx)

    if wanted(args, "numpy"):
        eager_times_fns["numpy"] = lambda: f(x)

    jit_times = interleaved_times(jit_times_fns, reps, inner=inner)
    eager_times = interleaved_times(eager_times_fns, reps, inner=inner)
    print_table(
        "Dispatch: f(x) = x*2+1 on 4 float32",
        [("jit, cache hit", jit_times), ("eager (no jit; jax column = JAX eager)", eager_times)],
    )


if __name__ == "__main__":
    main()
