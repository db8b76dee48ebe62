"""Device-wide scans (lowering/cuda_scan.py): lines of 8,192 elements or more are cut
in chunks scanned by all blocks at once (partials, their prefixes, chunk scans),
checked through NVRTC + the host shim against float64 NumPy."""

import numpy as np
from cuda_harness import BF16, run_cases
from fflow.lowering import cuda_backend, cuda_scan

import fflow
import fflow.numpy as jnp
from fflow import lax

rng = np.random.default_rng(4)


def _kernels(fn, x):
    return cuda_backend.Plan(cuda_backend._optimize(fflow.make_jaxpr(fn)(x))).kernels


def _run(fn, x):
    exe = cuda_backend.compile_program(fflow.make_jaxpr(fn)(x), backend="cuda_shim")
    return np.asarray(exe(x)[0])


def test_long_cumsum_is_a_chunked_device_scan():
    x = rng.standard_normal(20000).astype(np.float32)
    fn = lambda x: jnp.cumsum(x * 2)  # noqa: E731  (the producer fuses into the scan)
    ks = _kernels(fn, x)
    assert [k.kind for k in ks] == ["scana", "scanb", "scanc"]
    nchunks = -(-20000 // cuda_scan.CHUNK)
    assert ks[0].grid == (nchunks, 1) and ks[2].grid == (nchunks, 1)
    np.testing.assert_allclose(
        _run(fn, x), np.cumsum(x.astype(np.float64) * 2), rtol=1e-5, atol=2e-3
    )


def test_chunked_scans_of_several_lines_axes_and_ops():
    xi = rng.integers(-5, 5, (3, 9000)).astype(np.int32)
    xf = rng.standard_normal((9000, 2)).astype(np.float32)
    cases = [
        (lambda x: jnp.cumsum(x, axis=1), xi, lambda x: np.cumsum(x, axis=1)),
        (lambda x: lax.cummax(x, axis=0, reverse=True), xf,
         lambda x: np.maximum.accumulate(x[::-1], axis=0)[::-1]),
        (lambda x: lax.cummin(x, axis=0), xf, lambda x: np.minimum.accumulate(x, axis=0)),
    ]  # fmt: skip
    for fn, x, ref in cases:
        assert [k.kind for k in _kernels(fn, x)] == ["scana", "scanb", "scanc"]
        np.testing.assert_array_equal(_run(fn, x), ref(x))  # integers, max / min: exact
    # bf16 in, fp32 partials: against the eager NumPy evaluation
    xb = (rng.standard_normal(9000) * 0.1).astype(BF16)
    run_cases([("bf16 cumsum", lambda x: jnp.cumsum(x), [xb])])


def test_short_lines_keep_one_block_per_line():
    x = np.ones((4, 100), np.float32)
    (k,) = _kernels(lambda x: jnp.cumsum(x, axis=1), x)
    assert k.kind == "scan"
