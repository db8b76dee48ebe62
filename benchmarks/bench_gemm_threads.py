"""float32 GEMM on 1 thread vs all available cores (fflow's C pool over one-thread BLAS
calls, and OpenBLAS's own threads), per size:
where a second thread starts to pay (fflow.threads.SMALL_GEMM_FLOPS) and the
machine's sgemm limit in GFLOP/s (what the MLP step is compared with)."""

import os

import numpy as np
from common import interleaved_times, parse_args

SHAPES = [  # (m, k, n)
    (32, 64, 64),
    (64, 128, 128),
    (128, 128, 256),
    (128, 256, 256),
    (128, 512, 512),
    (128, 784, 512),
    (512, 512, 512),
    (1024, 1024, 1024),
]
# the MLP step's backward GEMMs: operands read transposed (BLAS flags, no copies)
TRANSPOSED = [  # (m, k, n, a transposed, b transposed)
    (128, 512, 512, False, True),  # input gradient g @ W.T
    (512, 128, 512, True, False),  # weight gradient h.T @ g
    (784, 128, 512, True, False),  # first layer's weight gradient x.T @ g
]


def gflops(m, k, n, seconds):
    return 2 * m * k * n / seconds / 1e9


def main():
    args = parse_args(__doc__)
    from fflow.lowering import cpu_gemm

    from fflow import threads

    cores = threads.available_cores()
    threads.blas()  # short-spin pool, as fflow runs it
    shapes = [(m, k, n, False, False) for m, k, n in SHAPES]
    shapes = shapes[:3] + TRANSPOSED[:1] if args.tiny else shapes + TRANSPOSED
    reps = args.reps or (2 if args.tiny else 30)
    rng = np.random.default_rng(0)
    lines = [
        "## float32 GEMM: one thread vs all cores",
        "",
        f"| workload | MFLOP | 1 thread | {cores} threads (fflow C pool) | {cores} OpenBLAS "
        f"threads | 1 thread GFLOP/s | {cores} threads GFLOP/s | pool speed-up |",
        "|---|---|---|---|---|---|---|---|",
    ]
    best = 0.0
    for m, k, n, ta, tb in shapes:
        a = rng.random((k, m), np.float32).T if ta else rng.random((m, k), np.float32)
        b = rng.random((n, k), np.float32).T if tb else rng.random((k, n), np.float32)
        out = np.empty((m, n), np.float32)

        def on(t, a=a, b=b, out=out):
            return lambda: cpu_gemm.matmul(a, b, out, t)

        def openblas(a=a, b=b, out=out):
            threads.set_blas_threads(cores)
            np.matmul(a, b, out=out)
            threads.set_blas_threads(1)

        inner = max(1, int(2e7 // (2 * m * k * n)))
        fns = {1: on(1), cores: on(cores), "openblas": openblas}
        times = interleaved_times(fns, reps, inner=inner)
        t1, tn, to = times[1], times[cores], times["openblas"]
        best = max(best, gflops(m, k, n, t1), gflops(m, k, n, tn))
        lines.append(
            f"| {m}x{k}{'ᵀ' if ta else ''} @ {k}x{n}{'ᵀ' if tb else ''} "
            f"| {2 * m * k * n / 1e6:.1f} | {t1 * 1e6:.1f} µs "
            f"| {tn * 1e6:.1f} µs "
            f"| {to * 1e6:.1f} µs | {gflops(m, k, n, t1):.0f} | {gflops(m, k, n, tn):.0f} "
            f"| {t1 / tn:.2f}× |"
        )
    kernels = "this CPU's (a private copy)" if cpu_gemm.own_kernels() else "NumPy's"
    lines += [
        "",
        f"sgemm limit measured: {best:.0f} GFLOP/s; fflow runs GEMMs below "
        f"{threads.SMALL_GEMM_FLOPS / 1e6:.0f} MFLOP on one thread. The 1-thread and "
        f"pool columns run {kernels} OpenBLAS kernels, the OpenBLAS column NumPy's "
        f"(OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')}).",
    ]
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
