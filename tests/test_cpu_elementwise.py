"""The CPU backend's native elementwise loops (lowering/native.py) on large arrays, run
in chunks on fflow's thread pool: the benchmark's chain tanh(gelu(a*x+b))*c and its
gradient against float64 NumPy written here, with NaN/inf, saturating and tiny values,
odd sizes (a ragged last chunk), strided inputs, and 1-3 pool threads."""

import math

import numpy as np
import pytest
from fflow.lowering import native

import fflow
import fflow.numpy as jnp

pytestmark = pytest.mark.skipif(not native.enabled(), reason="no C compiler")

A, B, C = 1.5, 0.25, 0.75
K = math.sqrt(2 / math.pi)
N = native.PARALLEL_MIN_SIZE + 3  # the pool path, a last chunk shorter than the others
SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30, 88.0, -88.0, 9.0, -9.0]
SPECIAL += [1e4, -1e4, 1e-30, -1e-30, 1e-40, -1e-40, 3.9, -3.9, 0.5, -0.5]


def chain(x):
    u = A * x + B
    return jnp.tanh(0.5 * u * (1 + jnp.tanh(K * (u + 0.044715 * u**3)))) * C


def chain64(x):
    u = A * x.astype(np.float64) + B
    return np.tanh(0.5 * u * (1 + np.tanh(K * (u + 0.044715 * u**3)))) * C


def grad64(x):
    u = A * x.astype(np.float64) + B
    t = np.tanh(K * (u + 0.044715 * u**3))
    g = 0.5 * u * (1 + t)
    dg = 0.5 * (1 + t) + 0.5 * u * (1 - t * t) * K * (1 + 3 * 0.044715 * u * u)
    h = np.tanh(g)
    return C * (1 - h * h) * dg * A


def data(n, seed=0, scale=2.0):
    x = (np.random.default_rng(seed).normal(size=n) * scale).astype(np.float32)
    x[: len(SPECIAL)] = SPECIAL
    return x


def on_threads(threads, fn, *args):
    fflow.config.update("blas_threads", threads)
    try:
        with np.errstate(all="ignore"):
            return np.asarray(fn(*args))
    finally:
        fflow.config.update("blas_threads", 0)


def assert_close(got, want, rtol, atol):
    assert got.dtype == np.float32
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def assert_pooled(fn, *args):
    text = fn.lower(*args).as_text()
    assert "native loop" in text and "_par(" in text  # one C loop, chunked on the pool


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_chain_forward_matches_float64(threads):
    x = data(N)
    f = fflow.jit(chain)
    assert_pooled(f, x)
    with np.errstate(all="ignore"):
        want = chain64(x)
    got = on_threads(threads, f, x)
    assert_close(got, want, rtol=2e-6, atol=1e-6)
    assert got[1] == np.float32(C) and np.isnan(got[2])  # +inf saturates; -inf: inf * 0
    assert got[3] == got[4]  # +0 and -0


@pytest.mark.parametrize("threads", [1, 2])
def test_chain_gradient_matches_float64(threads):
    x = data(N, seed=1)
    x[: len(SPECIAL)] = np.clip(np.nan_to_num(x[: len(SPECIAL)]), -20, 20)  # finite grads
    g = fflow.jit(fflow.grad(lambda x: jnp.sum(chain(x))))
    assert_pooled(g, x)
    got = on_threads(threads, g, x)
    assert_close(got, grad64(x), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("threads", [1, 2])
def test_exact_gelu_and_sigmoid_match_float64(threads):
    # erf-based GELU (jax.nn.gelu(approximate=False)) and the logistic: libmvec's erff
    # and expf in one pooled loop, saturating at large |x|, NaN kept
    special = pytest.importorskip("scipy.special")
    x = data(N, seed=9, scale=4.0)
    f = fflow.jit(lambda x: fflow.nn.gelu(x, approximate=False) * 1.5 + fflow.nn.sigmoid(x))
    assert_pooled(f, x)
    x64 = x.astype(np.float64)
    with np.errstate(all="ignore"):
        gelu = 0.5 * x64 * (1 + special.erf(x64 / math.sqrt(2)))  # -inf: NaN, as JAX
        want = gelu * 1.5 + 1 / (1 + np.exp(-x64))
    got = on_threads(threads, f, x)
    assert_close(got, want, rtol=2e-6, atol=2e-6)
    assert got[1] == np.inf and got[5] == np.float32(1e30) * np.float32(1.5)  # pass through
    assert got[6] == 0 and got[7] == np.float32(88 * 1.5 + 1)  # -1e30 -> 0, 88 saturated


@pytest.mark.parametrize(
    "view",
    [
        lambda a: a[::2],  # every other element
        lambda a: a[: 512 * 1031].reshape(512, 1031).T,  # transposed, 2-D
        lambda a: a[1 : 2 * N + 1].reshape(-1, 2)[:, 0],  # starts off the buffer's start
    ],
)
def test_strided_inputs(view):
    x = view(data(3 * N, seed=2))
    assert not x.flags.c_contiguous
    f = fflow.jit(chain)
    got = on_threads(2, f, x)
    with np.errstate(all="ignore"):
        assert_close(got, chain64(x), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("n", [N, 3 * N + 17, 1 << 20])
def test_same_bits_on_any_thread_count_and_every_call(n):
    # chunks are the same loop over index ranges: identical results for 1, 2, 3 threads
    x = data(n, seed=3)
    f = fflow.jit(lambda x: jnp.exp(-x * x) * jnp.tanh(x) + jnp.log1p(jnp.abs(x)))
    one = on_threads(1, f, x)
    with np.errstate(all="ignore"):
        x64 = x.astype(np.float64)
        want = np.exp(-x64 * x64) * np.tanh(x64) + np.log1p(np.abs(x64))
    assert_close(one, want, rtol=2e-6, atol=1e-6)
    for threads in (2, 3, 2):
        np.testing.assert_array_equal(on_threads(threads, f, x), one)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_large_arithmetic_groups_on_the_pool_are_bit_identical_to_numpy(threads):
    # pure IEEE arithmetic over >= 1M elements runs in chunks too: NumPy's bits exactly,
    # flat (odd size) and with a row-broadcast bias
    n = (1 << 20) + 5  # native.ARITH_PARALLEL_MIN_SIZE: 1M
    x, y = data(n, seed=5), data(n, seed=6)[::-1].copy()
    f = fflow.jit(lambda x, y: jnp.maximum((x * 1.5 + y) * 0.5 - x * y, 0.0) / (y - 2))
    assert_pooled(f, x, y)
    with np.errstate(all="ignore"):
        want = np.maximum((x * np.float32(1.5) + y) * np.float32(0.5) - x * y, np.float32(0))
        want = want / (y - np.float32(2))
    np.testing.assert_array_equal(on_threads(threads, f, x, y), want)
    rows, b = data(1024 * 1031, seed=7).reshape(1024, 1031), data(1031, seed=8)
    g = fflow.jit(lambda r, b: (r + b) * (r - b))
    assert_pooled(g, rows, b)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(on_threads(threads, g, rows, b), (rows + b) * (rows - b))


STALL_SOURCE = """
#include <pthread.h>
#include <unistd.h>
static pthread_t caller;
int stalled;
void set_caller(void) { caller = pthread_self(); }
/* out[i] = x[i] + i/2; a worker stalls 300 ms in its first chunk (descheduled), the
 * caller takes 1 ms per chunk so that the worker joins */
void fill(long *a, char *o, long s, long e) {
  if (pthread_equal(pthread_self(), caller)) usleep(1000);
  else if (!__atomic_exchange_n(&stalled, 1, __ATOMIC_SEQ_CST)) usleep(300000);
  const float *x = (const float *)a[0];
  float *out = (float *)o;
  for (long i = s; i < e; i++) out[i - s] = x[i] + 0.5f * (float)i;
}
"""


def test_a_stalled_pool_worker_neither_stalls_the_caller_nor_writes_late():
    import ctypes
    import time

    from fflow.lowering import cpu_gemm

    from fflow import threads

    if threads.available_cores() < 2:
        pytest.skip("one core: no pool worker")
    lib = native.load_library(STALL_SOURCE)
    lib.set_caller()
    fill = ctypes.cast(lib.fill, ctypes.c_void_p).value
    n = 64 * 1024 + 5
    x = np.random.default_rng(4).normal(size=n).astype(np.float32)
    out = np.full(n, np.nan, np.float32)
    want = x + np.float32(0.5) * np.arange(n, dtype=np.float32)
    t0 = time.perf_counter()
    ran = cpu_gemm.parallel(
        fill, (native.address(x),), native.address(out), n, 4, 1024, 2, (x,), 64
    )
    elapsed = time.perf_counter() - t0
    if not ran:
        pytest.skip("no C thread pool")
    np.testing.assert_array_equal(out, want)  # the caller backed up the stalled chunk
    assert elapsed < 0.25  # it did not wait for the stalled worker (300 ms)
    out[:] = 0  # the worker wakes up later: its copy must be dropped, not written here
    time.sleep(0.45)
    assert not out.any()
    again = np.zeros(n, np.float32)
    assert cpu_gemm.parallel(fill, (native.address(x),), native.address(again), n, 4, 1024, 2, (x,))
    np.testing.assert_array_equal(again, want)  # the pool still works


SLOW_SOURCE = """
#include <pthread.h>
#include <unistd.h>
static pthread_t caller;
void set_caller(void) { caller = pthread_self(); }
/* out[i] = 2 x[i]; the caller takes 50 ms per chunk (so the worker claims the other
 * one), the worker sleeps 300 ms in it: its CPU clock stands still, as when descheduled */
void twice(long *a, char *o, long s, long e) {
  usleep(pthread_equal(pthread_self(), caller) ? 50000 : 300000);
  const float *x = (const float *)a[0];
  float *out = (float *)o;
  for (long i = s; i < e; i++) out[i - s] = 2.0f * x[i];
}
"""


def test_a_descheduled_worker_is_backed_up_before_the_deadline():
    # the caller backs up a chunk as soon as its worker's CPU clock stops, not after
    # twice its own chunk time (here 100 ms)
    import ctypes
    import time

    from fflow.lowering import cpu_gemm

    from fflow import threads

    if threads.available_cores() < 2 or not cpu_gemm.pool_stats():
        pytest.skip("no C pool worker")
    lib = native.load_library(SLOW_SOURCE)
    lib.set_caller()
    twice = ctypes.cast(lib.twice, ctypes.c_void_p).value
    n = 2 * 1024
    x = np.arange(n, dtype=np.float32)
    out = np.full(n, np.nan, np.float32)
    before = cpu_gemm.pool_stats()
    assert cpu_gemm.parallel(twice, (native.address(x),), native.address(out), n, 4, 1024, 2, (x,))
    after = cpu_gemm.pool_stats()
    np.testing.assert_array_equal(out, 2 * x)
    delta = {k: after[k] - before[k] for k in before}
    assert delta["backups of descheduled workers"] == 1, delta
    assert delta["backups after the deadline"] == 0, delta
    assert delta["caller chunks"] == 1 and delta["worker chunks"] == 0, delta
    time.sleep(0.35)  # the worker wakes up, its copy is dropped; the pool is free again
