"""Column reductions (over the rows) fused into the row kernel of the same rows: the
gamma / beta gradients of layernorm's backward and the last bias gradient of a
cross-entropy are accumulated per thread while the row kernel computes dx, combined
per block in shared memory and summed over blocks by one small kernel each.
Results through NVRTC + the host shim against JAX (float32) and NumPy."""

import numpy as np
import pytest
from cuda_harness import BACKEND, BF16, to_backend
from fflow.lowering import cuda_backend

import fflow
import fflow.numpy as jnp
from fflow import nn

jax = pytest.importorskip("jax")
jjnp = pytest.importorskip("jax.numpy")
rng = np.random.default_rng(5)


def _plan(fn, *args):
    return cuda_backend.Plan(cuda_backend._optimize(fflow.make_jaxpr(fn)(*args)))


def _run(fn, args):
    exe = cuda_backend.compile_program(fflow.make_jaxpr(fn)(*args), backend=BACKEND)
    return [np.asarray(o) for o in exe(*[to_backend(a) for a in args])]


def _ln_loss(np_):
    def loss(x, g, b, w):
        m = np_.mean(x, axis=-1, keepdims=True)
        v = np_.mean(x * x, axis=-1, keepdims=True) - m * m
        y = (x - m) / np_.sqrt(v + 1e-5) * g + b
        return np_.sum(np_.tanh(y) @ w)

    return loss


@pytest.mark.parametrize(
    "shape,dtype", [((2, 24, 64), np.float32), ((3, 2000), np.float32), ((16, 128), BF16)]
)
def test_layernorm_backward_is_one_row_kernel_with_its_column_sums(shape, dtype):
    dtype = np.dtype(dtype)
    d = shape[-1]
    x = rng.standard_normal(shape).astype(dtype)
    g = rng.uniform(0.5, 1.5, d).astype(dtype)
    b = rng.standard_normal(d).astype(dtype)
    w = (rng.standard_normal((d, 8)) / np.sqrt(d)).astype(dtype)

    def loss(x, g, b, w):
        return jnp.sum(jnp.tanh(nn.standardize(x, axis=-1) * g + b) @ w)

    fn = fflow.grad(loss, argnums=(0, 1, 2))
    plan = _plan(fn, x, g, b, w)
    fused = [s for s in plan.steps if "+ columns" in getattr(s, "note", "")]
    assert fused, [getattr(s, "note", "") for s in plan.steps]
    # one row kernel + a combining kernel per column sum; no separate strided reduction
    assert not [k for k in plan.kernels if k.kind in ("red", "cred")], [
        k.name for k in plan.kernels
    ]
    (step,) = fused
    assert [k.kind for k in step.kernels] == ["row", "red2", "red2"]
    dx, dg, db = _run(fn, [x, g, b, w])
    f32 = [a.astype(np.float32) for a in (x, g, b, w)]
    want = jax.grad(_ln_loss(jjnp), argnums=(0, 1, 2))(*f32)
    tol = 2e-4 if dtype == np.float32 else 6e-2
    for name, got, ref in zip(("dx", "dgamma", "dbeta"), (dx, dg, db), want):
        ref = np.asarray(ref)
        scale = np.abs(ref).max()
        np.testing.assert_allclose(got.astype(np.float32), ref, rtol=tol, atol=tol * scale,
                                   err_msg=f"{name} {shape} {dtype}")  # fmt: skip


def test_cross_entropy_bias_gradient_joins_the_softmax_row_kernel():
    h = rng.standard_normal((40, 16)).astype(np.float32)
    w = rng.standard_normal((16, 10)).astype(np.float32)
    b = rng.standard_normal(10).astype(np.float32)
    y = rng.integers(0, 10, 40)
    onehot = np.eye(10, dtype=np.float32)[y]

    def loss(w, b):
        return -jnp.mean(jnp.sum(nn.log_softmax(h @ w + b) * onehot, axis=-1))

    fn = fflow.grad(loss, argnums=(0, 1))
    plan = _plan(fn, w, b)
    assert any("columns" in getattr(s, "note", "") for s in plan.steps)
    dw, db = _run(fn, [w, b])
    p = np.exp(h @ w + b - (h @ w + b).max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dlogits = (p - onehot) / 40
    np.testing.assert_allclose(db, dlogits.sum(0), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(dw, h.T @ dlogits, rtol=1e-4, atol=1e-6)


def test_a_column_reduction_reading_another_is_not_fused_with_it():
    x = rng.standard_normal((30, 12)).astype(np.float32)

    def f(x):  # softmax rows + a batch variance: the second mean reads the first
        m = jnp.mean(x, axis=0)
        return nn.softmax(x, axis=-1), jnp.mean((x - m) ** 2, axis=0), jnp.max(x, axis=0)

    plan = _plan(f, x)
    (fused,) = [s for s in plan.steps if "+ columns" in getattr(s, "note", "")]
    assert len(fused.kernels) <= 3  # at most mean and max; the variance runs after
    assert any(k.kind == "cred" for k in plan.kernels)
    sm, var, mx = _run(f, [x])
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(sm, e / e.sum(-1, keepdims=True), rtol=3e-6, atol=1e-7)
    np.testing.assert_allclose(var, x.var(0), rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(mx, x.max(0))


def test_bias_gradient_joins_the_elementwise_kernel_of_its_rows():
    # relu backward writes dh (read by the next GEMMs) and its column sums (db) in one
    # row-structured kernel; also over (batch, seq) rows of a 3-D activation
    for shape in [(40, 48), (3, 5, 40)]:
        h = rng.standard_normal(shape).astype(np.float32)
        g = rng.standard_normal(shape).astype(np.float32)
        axes = tuple(range(len(shape) - 1))

        def f(h, g, axes=axes):
            dh = jnp.where(h > 0, g, 0.0)
            return dh, jnp.sum(dh, axis=axes)

        plan = _plan(f, h, g)
        (step,) = [s for s in plan.steps if "+ columns" in getattr(s, "note", "")]
        assert "elementwise + columns" in step.note and len(plan.kernels) == 2
        dh, db = _run(f, [h, g])
        ref = np.where(h > 0, g, 0.0).astype(np.float64)
        np.testing.assert_array_equal(dh, ref.astype(np.float32))
        np.testing.assert_allclose(db, ref.sum(axes), rtol=1e-5, atol=1e-6)
