"""donate_argnums on the CUDA backend: a donated device buffer holds an output of its
shape and dtype once its last reader ran (or in place, for a pointwise kernel), and
never when that would be visible: an argument passed twice, a host array, a view."""

import numpy as np

import fflow
import fflow.numpy as jnp
from fflow import nn

DEV = fflow.devices("cuda_shim")[0]
rng = np.random.default_rng(0)


def ptr(x):
    return x._value.data.ctypes.data


def test_pointwise_kernel_writes_its_output_into_the_donated_input():
    a = rng.standard_normal((33, 7)).astype(np.float32)
    x = fflow.device_put(a, DEV)
    p = ptr(x)
    y = fflow.jit(lambda x: jnp.tanh(x) * 2 + 1, donate_argnums=0)(x)
    assert ptr(y) == p and x._deleted
    np.testing.assert_allclose(
        np.asarray(y), np.tanh(a.astype(np.float64)) * 2 + 1, rtol=1e-5, atol=1e-6
    )


def test_donated_buffer_is_reused_after_its_last_reader():
    a, w = rng.standard_normal((2, 6, 6)).astype(np.float32)
    x, wd = fflow.device_put(a, DEV), fflow.device_put(w, DEV)
    p = ptr(x)
    y = fflow.jit(lambda x, w: jnp.exp(x @ w) + 1, donate_argnums=0)(x, wd)
    assert ptr(y) == p  # the GEMM read x; the kernel after it writes into x's buffer
    ref = np.exp(a.astype(np.float64) @ w.astype(np.float64)) + 1
    np.testing.assert_allclose(np.asarray(y), ref, rtol=1e-5, atol=1e-6)


def test_row_kernel_does_not_write_over_its_donated_input():
    a = rng.standard_normal((5, 9)).astype(np.float32)
    x = fflow.device_put(a, DEV)
    p = ptr(x)
    y = fflow.jit(lambda x: nn.softmax(x * 3.0), donate_argnums=0)(x)
    e = np.exp(3.0 * a.astype(np.float64) - 3.0 * a.max(1, keepdims=True))
    np.testing.assert_allclose(np.asarray(y), e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)
    assert ptr(y) != p


def test_no_reuse_when_it_would_be_visible():
    a = rng.standard_normal(40).astype(np.float32)
    x = fflow.device_put(a, DEV)
    # the same buffer as a second, non-donated argument
    y = fflow.jit(lambda x, z: jnp.sin(x) + z, donate_argnums=0)(x, x)
    np.testing.assert_allclose(np.asarray(y), np.sin(a) + a, rtol=1e-5, atol=1e-6)
    # a host array is the caller's: never written, whatever the backend
    host = a.copy()
    old = fflow.config.jit_backend
    fflow.config.update("jit_backend", "cuda_shim")
    try:
        out = fflow.jit(lambda x: jnp.cos(x), donate_argnums=0)(host)
    finally:
        fflow.config.update("jit_backend", old)
    np.testing.assert_array_equal(host, a)
    np.testing.assert_allclose(np.asarray(out), np.cos(a), rtol=1e-5, atol=1e-6)
    # an input whose reshape view lives on is not reused
    x = fflow.device_put(a, DEV)
    p = ptr(x)
    f = fflow.jit(lambda x: (x.reshape(5, 8), jnp.exp(x)), donate_argnums=0)
    v, e = f(x)
    assert ptr(e) != p
    np.testing.assert_array_equal(np.asarray(v), a.reshape(5, 8))
