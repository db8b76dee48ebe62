"""Reductions over the contiguous axis plus leading ones (batch-norm statistics of
NCHW data: sum over (0, 2, 3)) run a block per output walking the reduced elements
in memory order (lowering/cuda_blockreduce.py), split over blockIdx.y when outputs
are few; checked through the host shim against float64 NumPy."""

import numpy as np
from cuda_harness import BF16, run_cases
from fflow.lowering import cuda_backend

import fflow
import fflow.numpy as jnp

rng = np.random.default_rng(9)


def _kinds(fn, x):
    plan = cuda_backend.Plan(cuda_backend._optimize(fflow.make_jaxpr(fn)(x)))
    return [k.kind for k in plan.kernels], plan.kernels


def _run(fn, x):
    exe = cuda_backend.compile_program(fflow.make_jaxpr(fn)(x), backend="cuda_shim")
    return np.asarray(exe(x)[0])


def test_nchw_statistics_are_a_block_per_channel():
    x = rng.standard_normal((4, 6, 7, 9)).astype(np.float32)
    x64 = x.astype(np.float64)
    fn = lambda x: jnp.sum(x * x, axis=(0, 2, 3))  # noqa: E731
    kinds, ks = _kinds(fn, x)
    assert kinds == ["bred"] and ks[0].grid == (6, 1) and ks[0].block == 256
    np.testing.assert_allclose(_run(fn, x), (x64 * x64).sum((0, 2, 3)), rtol=1e-5)


def test_few_outputs_split_the_reduced_elements():
    y = rng.standard_normal((300, 5, 40)).astype(np.float32)
    cases = [
        (lambda y: jnp.max(y, axis=(0, 2)), lambda y: y.max((0, 2))),
        (lambda y: jnp.mean(y, axis=(0, 2)), lambda y: y.astype(np.float64).mean((0, 2))),
    ]
    for fn, ref in cases:
        kinds, ks = _kinds(fn, y)
        assert kinds[:2] == ["bred", "red2"] and ks[0].grid[1] > 1, kinds
        np.testing.assert_allclose(_run(fn, y), ref(y), rtol=1e-5, atol=1e-7)
    # bf16 input, fp32 accumulation: against the eager NumPy evaluation
    run_cases([("bf16 sum", lambda y: jnp.sum(y, axis=(0, 2)), [y.astype(BF16)])])


def test_other_layouts_keep_their_kernels():
    x = np.ones((64, 40), np.float32)
    assert _kinds(lambda x: jnp.sum(x, axis=0), x)[0] == ["cred"]  # last axis kept
    assert _kinds(lambda x: jnp.sum(x, axis=1), x)[0] == ["row"]
    big = np.ones((128, 80), np.float32)
    assert _kinds(lambda x: jnp.sum(x, axis=(0, 1)), big)[0] == ["sum1", "sum2"]
    z = np.ones((8, 6, 4), np.float32)  # 4 contiguous elements: too few for a warp
    assert _kinds(lambda z: jnp.sum(z, axis=(0, 2)), z)[0] != ["bred"]


def test_column_reductions_are_32_by_8_blocks():
    # bias / gamma gradients standing alone: 32 columns x 8 row slices per block,
    # split over row ranges when the columns are few
    cases = [
        ((128, 512), (0,), (16, 1), lambda x: jnp.sum(x, axis=0), lambda x: x.sum(0)),
        ((3000, 40), (0,), (2, 23), lambda x: jnp.max(x * 2, axis=0), lambda x: (x * 2).max(0)),
        ((4, 50, 33), (0, 1), (2, 1), lambda x: jnp.sum(x, axis=(0, 1)), lambda x: x.sum((0, 1))),
    ]
    for shape, _, grid, fn, ref in cases:
        x = rng.standard_normal(shape).astype(np.float32)
        kinds, ks = _kinds(fn, x)
        assert kinds[0] == "cred" and ks[0].grid == grid and ks[0].block == 256, kinds
        np.testing.assert_allclose(_run(fn, x), ref(x.astype(np.float64)), rtol=1e-5, atol=2e-5)
    run_cases(
        [
            (
                "bf16 bias grad",
                lambda x: jnp.sum(x, axis=0),
                [rng.standard_normal((64, 40)).astype(BF16)],
            )
        ]
    )
