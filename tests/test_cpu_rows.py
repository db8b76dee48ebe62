"""Row groups on the CPU (lowering/cpu_rows.py): layernorm / RMS norm forward and
backward as one native loop over rows. Results are compared with float64 NumPy
written here (forward and analytic gradients), and each test checks the compiled
program's row groups (so it fails when the fusion is reverted)."""

import numpy as np
import pytest
from fflow.lowering import native

import fflow
import fflow.numpy as jnp

pytestmark = pytest.mark.skipif(not native.enabled(), reason="no C compiler")

SHAPE = (5, 37, 131)  # odd sizes; 24235 elements (>= native.ARITH_MIN_SIZE)


def _groups(f, *args):
    return f.lower(*args).entry.executable.row_groups


def ln_bench(x, g):
    # the form of benchmarks/bench_transformer.py
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mu) * (x - mu), axis=-1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + 1e-5) * g


def ln_module(x, g):
    # the form of fflow.nn.LayerNorm (square, rsqrt), with a bias
    return fflow.nn.LayerNorm(x.shape[-1])(x) * g + 0.5


def rms(x, g):
    return x * fflow.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + 1e-6) * g


def _ln64(x, g, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    sigma = np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
    xhat = (x - mu) / sigma
    return xhat * g, xhat, sigma


def _ln_grads64(x, g, w, eps=1e-5):
    """d/dx and d/dg of sum(layernorm(x, g) * w)."""
    _, xhat, sigma = _ln64(x, g, eps)
    d = w * g
    dx = (d - d.mean(-1, keepdims=True) - xhat * (d * xhat).mean(-1, keepdims=True)) / sigma
    return dx, (w * xhat).sum(axis=(0, 1))


def _rms_grads64(x, g, w, eps=1e-6):
    r = 1 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    d = w * g
    dx = r * d - r**3 * x * (d * x).mean(-1, keepdims=True)
    return dx, (w * x * r).sum(axis=(0, 1))


def _data(dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=SHAPE) * 3 + 1).astype(dtype)
    g = rng.normal(size=SHAPE[-1]).astype(dtype)
    w = rng.normal(size=SHAPE).astype(dtype)
    return x, g, w


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("form", [ln_bench, ln_module, rms])
def test_norm_forward_and_grads_match_float64_numpy(form, dtype, request):
    if dtype == np.float64:
        request.getfixturevalue("x64_case")
    x, g, w = _data(dtype)
    args = (jnp.asarray(x), jnp.asarray(g))
    f = fflow.jit(form)
    (group,) = _groups(f, *args)  # the whole forward is one row group
    assert "reduce_sum" in group.members and (group.rows, group.cols) == (5 * 37, 131)
    x64, g64, w64 = x.astype(np.float64), g.astype(np.float64), w.astype(np.float64)
    if form is rms:
        ref = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6) * g64
        dx, dg = _rms_grads64(x64, g64, w64)
    else:  # the module's weight is 1 and its bias 0: both forms are xhat * g (+ 0.5)
        ref = _ln64(x64, g64)[0] + (0.5 if form is ln_module else 0)
        dx, dg = _ln_grads64(x64, g64, w64)
    tol = 3e-5 if dtype == np.float32 else 1e-11
    np.testing.assert_allclose(np.asarray(f(*args)), ref, rtol=tol, atol=tol)
    loss = fflow.jit(fflow.grad(lambda x, g: jnp.sum(form(x, g) * w), argnums=(0, 1)))
    assert any("reduce_sum" in r.members for r in _groups(loss, *args))
    gx, gg = loss(*args)
    np.testing.assert_allclose(np.asarray(gx), dx, rtol=20 * tol, atol=20 * tol)
    np.testing.assert_allclose(np.asarray(gg), dg, rtol=20 * tol, atol=20 * tol)


def test_row_statistics_returned_and_nan_rows_stay_in_their_row():
    x, g, _ = _data(np.float32, 1)
    x[1, 2, 7] = np.nan
    x[3, 0, 0] = np.inf

    def f(x, g):
        mu = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean((x - mu) * (x - mu), axis=-1, keepdims=True)
        return (x - mu) / jnp.sqrt(var + 1e-5) * g, mu, var

    jf = fflow.jit(f)
    args = (jnp.asarray(x), jnp.asarray(g))
    assert len(_groups(jf, *args)) == 1
    with np.errstate(all="ignore"):
        y, mu, var = (np.asarray(a) for a in jf(*args))
        x64 = x.astype(np.float64)
        ref, _, _ = _ln64(x64, g.astype(np.float64))
        mean64, var64 = x64.mean(-1), x64.var(-1)
    bad = ~np.isfinite(x64).all(-1)
    assert np.isnan(y[bad]).all() and np.isfinite(y[~bad]).all()
    np.testing.assert_allclose(y[~bad], ref[~bad], rtol=3e-5, atol=3e-5)
    np.testing.assert_allclose(mu[..., 0][~bad], mean64[~bad], rtol=1e-6)
    np.testing.assert_allclose(var[..., 0][~bad], var64[~bad], rtol=1e-5)


def test_amp_bf16_layernorm_matches_reference():
    # 16-bit rows are not fused (bf16 ops round per op); the result must be right
    pytest.importorskip("ml_dtypes")
    x, g, _ = _data(np.float32, 2)
    f = fflow.jit(fflow.amp(lambda x, g: ln_bench(x, g) @ jnp.eye(131), "bf16"))
    ref, _, _ = _ln64(x.astype(np.float64), g.astype(np.float64))
    np.testing.assert_allclose(
        np.asarray(f(jnp.asarray(x), jnp.asarray(g))).astype(np.float64), ref, atol=0.08
    )


def test_small_rows_stay_numpy():
    x = jnp.asarray(np.ones((4, 64), np.float32))  # below native.ARITH_MIN_SIZE
    assert _groups(fflow.jit(ln_bench), x, jnp.ones(64)) == []
