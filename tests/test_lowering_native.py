"""Large fused elementwise groups compiled to native loops: same numbers as eager
(IEEE ops bit for bit, transcendental functions within an ulp or two), NaN/inf kept."""

import numpy as np
import pytest
from fflow.lowering import native

import fflow
import fflow.numpy as jnp

pytestmark = pytest.mark.skipif(not native.enabled(), reason="no C compiler")

N = native.NATIVE_MIN_SIZE


def chain(x, y):
    u = x * 1.5 + y
    return jnp.tanh(0.5 * u * (1 + jnp.tanh(u + 0.044715 * u**3))) * 0.75 - jnp.exp(-u * u)


def data(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=N).astype(np.float32)
    y = rng.normal(size=N).astype(np.float32)
    x[:6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30]
    return jnp.asarray(x), jnp.asarray(y)


def test_native_group_matches_eager():
    x, y = data()
    f = fflow.jit(chain)
    assert "native loop" in f.lower(x, y).as_text()
    with np.errstate(all="ignore"):
        expected = np.asarray(chain(x, y))
        got = np.asarray(f(x, y))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-6)


def test_native_grad_matches_eager():
    x, y = data(1)
    g = fflow.grad(lambda x: jnp.sum(chain(x, y)))
    x = jnp.asarray(np.asarray(x)[10:].copy().tolist() + [0.0] * 10, dtype=jnp.float32)
    with np.errstate(all="ignore"):
        # atol: cancellation near 0; eager's own error vs float64 reaches 1.2e-6 here
        np.testing.assert_allclose(fflow.jit(g)(x), g(x), rtol=1e-5, atol=3e-6)


def test_ieee_ops_are_bit_identical_and_nan_propagates():
    def f(x, y):
        return jnp.maximum(x * y + 1, jnp.exp(x) * 0) - jnp.minimum(x, y) / (y - 2)

    x, y = data(2)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(fflow.jit(f)(x, y), f(x, y))


def test_disabled_falls_back_to_numpy():
    x, y = data(3)
    fflow.config.update("jit_native", False)
    try:
        lowered = fflow.jit(chain).lower(x, y)
        assert "native loop" not in lowered.as_text()
        with np.errstate(all="ignore"):
            np.testing.assert_array_equal(lowered.compile()(x, y), chain(x, y))
    finally:
        fflow.config.update("jit_native", True)


def _small(seed, *shape):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def test_arithmetic_groups_with_broadcasts_are_native_and_bit_identical():
    # bias rows, per-row columns and scalars: one C pass, the same IEEE operations
    x, b, c = _small(0, 128, 256), _small(1, 256), _small(2, 128, 1)
    x[0, :4] = [np.nan, np.inf, -0.0, 0.0]

    def f(x, b, c, lr):
        h = jnp.maximum(x + b, 0.0)
        return (h - c) * lr + jnp.where(x > 0, 1.0, 0.5) * x

    lowered = fflow.jit(f).lower(x, b, c, 0.1)
    assert "native loop" in lowered.as_text()
    with np.errstate(all="ignore"):
        h = np.maximum(x + b, np.float32(0))
        want = (h - c) * np.float32(0.1) + np.where(x > 0, np.float32(1), np.float32(0.5)) * x
        np.testing.assert_array_equal(lowered.compile()(x, b, c, 0.1), want)


def test_native_sgd_update_in_place_of_donated_weights():
    w, g = _small(3, 200, 100), _small(4, 200, 100)
    step = fflow.jit(lambda w, g: w - 0.01 * g * g, donate_argnums=0)
    want = w - np.float32(0.01) * g * g
    assert "native loop" in step.lower(w, g).as_text()
    np.testing.assert_array_equal(step(jnp.asarray(w), g), want)


def test_new_scalar_constants_reuse_the_library():
    x = _small(5, 128, 128)
    seen = []
    for lr in (0.1, 0.2):
        f = fflow.jit(lambda x, lr=lr: x * lr + x * x)
        np.testing.assert_array_equal(f(x), x * np.float32(lr) + x * x)
        seen.append(f.lower(x).as_text().split("native loop")[1])
    assert seen[0] == seen[1]  # constants are run-time arguments of one C source


def _softmax64(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_softmax_is_one_native_row_kernel():
    x = _small(6, 64, 4, 32, 64) * 4  # 2^19 elements: rows of 64
    x[0, 0, 0, :3] = [np.nan, 1.0, 2.0]  # a NaN row stays NaN
    x[0, 0, 1, :] = -np.inf  # an all -inf row is NaN, as in NumPy
    x[0, 0, 2, 5] = np.inf
    f = fflow.jit(lambda x: fflow.nn.softmax(x * 0.5, axis=-1))
    text = f.lower(x).as_text()
    assert "fflow_softmax" in text and "reduce_max" not in f.lower(x).source
    with np.errstate(all="ignore"):
        got = np.asarray(f(x))
        want = _softmax64(x * np.float32(0.5))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_softmax_grad_with_the_row_kernel_matches_eager():
    x = _small(7, 16, 4, 64, 128)
    w = _small(8, 16, 4, 64, 128)
    g = fflow.grad(lambda x: jnp.sum(fflow.nn.softmax(x, axis=-1) * w))
    lowered = fflow.jit(g).lower(x)
    assert "fflow_softmax" in lowered.as_text()
    y = _softmax64(x)
    want = y * (w - np.sum(y * w, axis=-1, keepdims=True))  # softmax's VJP in float64
    np.testing.assert_allclose(lowered.compile()(x), want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("threads", [1, 2])
def test_large_transcendental_groups_run_in_chunks_on_the_pool(threads):
    # chunks of the same C loop on fflow's thread pool: the same bits on any thread
    # count (a row-broadcast bias and an output written in place of a donated input)
    x, b = _small(6, 512, 1024), _small(7, 1024)
    x[0, :3] = [np.nan, np.inf, -np.inf]

    def f(x, b):
        return jnp.tanh(x * 1.5 + b) * jnp.exp(-x * x)

    step = fflow.jit(f, donate_argnums=0)
    assert "_par(" in step.lower(x, b).as_text()
    with np.errstate(all="ignore"):
        want = np.asarray(f(x, b))
        fflow.config.update("blas_threads", threads)
        try:
            got = [np.asarray(step(jnp.asarray(x), b)) for _ in range(3)]
        finally:
            fflow.config.update("blas_threads", 0)
    np.testing.assert_array_equal(np.isnan(got[0]), np.isnan(want))
    np.testing.assert_allclose(got[0], want, rtol=2e-6, atol=1e-6)
    for g in got[1:]:
        np.testing.assert_array_equal(g, got[0])


def test_every_math_function_of_a_program_library_stays_vectorized():
    # two loops (exp, tanh) in one library: each declaration keeps its `omp declare
    # simd` pragma, so gcc calls libmvec's vector variants for both (the softmax row
    # kernel before a GELU left its tanhf scalar)
    import shutil
    import subprocess

    x = _small(8, 512, 512)

    def f(x):
        h = jnp.tanh(x * 0.5 + 1.0) * x
        return fflow.nn.softmax(h, axis=-1), h

    step = fflow.jit(f)
    sources = step.lower(x).entry.executable.native_sources
    assert len(sources) >= 2
    source = native.program_source([(None, None, src, None) for src in sources])
    lines = source.split("\n")
    for k, line in enumerate(lines):
        if line.startswith(("float ", "double ")) and line.endswith(");"):
            assert lines[k - 1] == "#pragma omp declare simd notinbranch", source
    with np.errstate(all="ignore"):
        got, want = step(x), f(x)
    np.testing.assert_allclose(got[1], want[1], rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-7)
    if shutil.which("nm"):
        path = native.load_library(source)._name
        symbols = subprocess.run(["nm", "-D", path], capture_output=True, text=True).stdout
        for fn in ("expf", "tanhf"):
            assert f"v_{fn}@" in symbols, (fn, symbols)


def test_a_computed_scalar_is_read_once_not_copied_into_a_full_array():
    # Adam's bias corrections: 0-d values computed in the program, broadcast into the
    # update's group; the loop reads each once (no full-size copy of a broadcast view)
    m, v = _small(6, 200, 100), np.abs(_small(7, 200, 100))
    m[0, :3] = [np.nan, np.inf, -0.0]

    def f(m, v, t):
        return m / (1 - 0.9**t) + jnp.sqrt(v) * (1 - 0.999**t)

    t = np.float32(3.0)
    jf = fflow.jit(f)
    text = jf.lower(m, v, t).as_text()
    assert "native loop" in text and "broadcast_to" not in text.split("# native loop")[0]
    with np.errstate(all="ignore"):
        one = np.float32(1)
        want = m / (one - np.float32(0.9) ** t) + np.sqrt(v) * (one - np.float32(0.999) ** t)
        np.testing.assert_array_equal(jf(m, v, t), want)
        np.testing.assert_array_equal(jf(m, v, np.float32(7.0)), f(m, v, np.float32(7.0)))
