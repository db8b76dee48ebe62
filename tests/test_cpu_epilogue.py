"""GEMM epilogues on the CPU (lowering/cpu_epilogue.py): the bias add, activation,
ReLU mask, bias gradient and SGD update after a product run in one native pass over
its output. Every result is compared with a float64 NumPy reference written here,
and each test checks which epilogues the compiled program holds (so it fails when the
fusion is reverted)."""

import numpy as np
import pytest
from fflow.lowering import native

import fflow
import fflow.numpy as jnp

pytestmark = pytest.mark.skipif(not native.enabled(), reason="no C compiler")


def _epilogues(f, *args):
    return [e.members for e in f.lower(*args).entry.executable.epilogues]


def _mlp_params(rng, dims, dtype):
    return [
        (
            rng.normal(0, a**-0.5, (a, b)).astype(dtype),
            rng.normal(0, 0.1, b).astype(dtype),
        )
        for a, b in zip(dims[:-1], dims[1:])
    ]


def _loss(params, x, y):
    h = x
    for i, (w, b) in enumerate(params):
        h = h @ w + b
        if i < len(params) - 1:
            h = jnp.maximum(h, 0.0)
    return jnp.mean((h - y) ** 2)


def _step(params, x, y, lr=0.1):
    value, grads = fflow.value_and_grad(_loss)(params, x, y)
    return [(w - lr * gw, b - lr * gb) for (w, b), (gw, gb) in zip(params, grads)], value


def _reference_step(params, x, y, lr=0.1):
    """Forward, backward and SGD of `_step` in float64 NumPy."""
    params = [(w.astype(np.float64), b.astype(np.float64)) for w, b in params]
    acts, pre = [x.astype(np.float64)], []
    for i, (w, b) in enumerate(params):
        z = acts[-1] @ w + b
        pre.append(z)
        acts.append(np.maximum(z, 0) if i < len(params) - 1 else z)
    diff = acts[-1] - y
    loss = np.mean(diff**2)
    g = 2 * diff / diff.size
    new = [None] * len(params)
    for i in range(len(params) - 1, -1, -1):
        w, b = params[i]
        gw, gb = acts[i].T @ g, g.sum(axis=0)
        if i > 0:
            g = (g @ w.T) * (pre[i - 1] > 0)
        new[i] = (w - lr * gw, b - lr * gb)
    return new, loss


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mlp_step_epilogues_match_float64_numpy(dtype, request):
    if dtype == np.float64:
        request.getfixturevalue("x64_case")
    # odd sizes: 131 x 127 hidden outputs (>= native.ARITH_MIN_SIZE elements)
    rng = np.random.default_rng(0)
    dims = (131, 127, 131, 5)
    params = _mlp_params(rng, dims, dtype)
    x = rng.normal(size=(131, 131)).astype(dtype)
    y = rng.normal(size=(131, 5)).astype(dtype)
    args = ([(jnp.asarray(w), jnp.asarray(b)) for w, b in params], jnp.asarray(x), jnp.asarray(y))
    f = fflow.jit(_step)
    members = _epilogues(f, *args)
    # forward: bias + ReLU (2 outputs: the pre-activation is kept for the backward pass)
    assert members.count(["add", "max"]) == 2
    # backward: the ReLU mask on the input gradient, and the bias gradient's column sum
    assert sum("column_sum" in m and "select_n" in m for m in members) == 2
    # the SGD updates of the two large weights (the 131 x 5 one is below the size)
    assert members.count(["mul", "sub"]) == 2
    new, loss = f(*args)
    ref, ref_loss = _reference_step(params, x, y)
    tol = 2e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(float(loss), ref_loss, rtol=tol)
    for (w, b), (rw, rb) in zip(new, ref):
        assert np.asarray(w).dtype == dtype
        np.testing.assert_allclose(np.asarray(w), rw, rtol=tol, atol=tol)
        np.testing.assert_allclose(np.asarray(b), rb, rtol=tol, atol=tol)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("batch, dims", [(129, (257, 263, 259, 3)), (517, (257, 131, 263, 3))])
def test_epilogues_on_the_thread_pool(threads, batch, dims):
    # products above threads.SMALL_GEMM_FLOPS run in chunks on the pool: each chunk's
    # epilogue runs where it was computed; column sums of row chunks (batch 517 > the
    # 131 / 263 features) are added up in chunk order after the product
    rng = np.random.default_rng(1)
    params = _mlp_params(rng, dims, np.float32)
    x = rng.normal(size=(batch, dims[0])).astype(np.float32)
    y = rng.normal(size=(batch, 3)).astype(np.float32)
    args = ([(jnp.asarray(w), jnp.asarray(b)) for w, b in params], jnp.asarray(x), jnp.asarray(y))
    fflow.config.update("blas_threads", threads)
    try:
        f = fflow.jit(_step)
        assert sum("column_sum" in m for m in _epilogues(f, *args)) == 2
        for _ in range(3):
            new, loss = f(*args)
    finally:
        fflow.config.update("blas_threads", 0)
    ref, ref_loss = _reference_step(params, x, y)
    np.testing.assert_allclose(float(loss), ref_loss, rtol=2e-5)
    for (w, b), (rw, rb) in zip(new, ref):
        np.testing.assert_allclose(np.asarray(w), rw, rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(np.asarray(b), rb, rtol=2e-5, atol=2e-5)


def _gelu64(z):
    return 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z**3)))


@pytest.mark.parametrize("act", ["gelu", "tanh"])
def test_transcendental_activation_epilogue(act):
    # a 3-D activation (batch, seq, features) @ weight: the leading dims merge into M;
    # transcendental members from native.NATIVE_MIN_SIZE elements (here 3 x 89 x 1031)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(3, 89, 37)).astype(np.float32)
    w = rng.normal(0, 0.2, (37, 1031)).astype(np.float32)
    b = rng.normal(size=1031).astype(np.float32)
    fn = fflow.nn.gelu if act == "gelu" else jnp.tanh

    def layer(x, w, b):
        return fn(x @ w + b)

    f = fflow.jit(layer)
    args = (jnp.asarray(x), jnp.asarray(w), jnp.asarray(b))
    (members,) = _epilogues(f, *args)
    assert members[0] == "add" and ("tanh" in members)
    z = x.astype(np.float64) @ w + b
    ref = _gelu64(z) if act == "gelu" else np.tanh(z)
    np.testing.assert_allclose(np.asarray(f(*args)), ref, rtol=2e-5, atol=2e-5)
    # and its gradient: the backward product's epilogue multiplies by the derivative
    g = fflow.jit(fflow.grad(lambda x, w, b: jnp.sum(layer(x, w, b) ** 2), argnums=(1, 2)))
    gw, gb = g(*args)
    dz = 2 * ref * ((1 - np.tanh(z) ** 2) if act == "tanh" else _gelu_grad64(z))
    np.testing.assert_allclose(np.asarray(gb), dz.sum(axis=(0, 1)), rtol=2e-4, atol=2e-3)
    gw_ref = x.reshape(-1, 37).astype(np.float64).T @ dz.reshape(-1, 1031)
    np.testing.assert_allclose(np.asarray(gw), gw_ref, rtol=2e-4, atol=2e-3)


def _gelu_grad64(z):
    c = np.sqrt(2 / np.pi)
    t = np.tanh(c * (z + 0.044715 * z**3))
    return 0.5 * (1 + t) + 0.5 * z * (1 - t**2) * c * (1 + 3 * 0.044715 * z**2)


@pytest.mark.usefixtures("x64_case")
def test_product_read_elsewhere_is_kept_and_residual_inputs_are_read():
    # the raw product is also returned (so it stays in its buffer) and a full-size
    # residual made before the product joins the epilogue
    rng = np.random.default_rng(3)
    x = rng.normal(size=(137, 61)).astype(np.float64)
    w = rng.normal(size=(61, 139)).astype(np.float64)
    r = rng.normal(size=(137, 139)).astype(np.float64)
    s = rng.normal(size=137).astype(np.float64)

    def f(x, w, r, s):
        p = x @ w
        return p, jnp.maximum(p * s[:, None] + r, 0.0) * 2.0

    jf = fflow.jit(f)
    args = tuple(jnp.asarray(a) for a in (x, w, r, s))
    assert _epilogues(jf, *args)
    p, out = jf(*args)
    np.testing.assert_allclose(np.asarray(p), x @ w, rtol=1e-12)
    np.testing.assert_allclose(
        np.asarray(out), np.maximum((x @ w) * s[:, None] + r, 0) * 2, rtol=1e-12
    )


def test_nan_and_inf_pass_through_the_epilogue():
    x = np.ones((128, 4), np.float32)
    w = np.ones((4, 130), np.float32)
    x[0, 0], x[1, 1], w[2, 5] = np.nan, np.inf, -np.inf
    b = np.zeros(130, np.float32)

    def f(x, w, b):
        return jnp.maximum(x @ w + b, 0.0)

    jf = fflow.jit(f)
    args = (jnp.asarray(x), jnp.asarray(w), jnp.asarray(b))
    assert _epilogues(jf, *args) == [["add", "max"]]
    with np.errstate(all="ignore"):
        z = x.astype(np.float64) @ w + b
        ref = np.where(np.isnan(z), np.nan, np.maximum(z, 0))
    np.testing.assert_array_equal(np.asarray(jf(*args)), ref.astype(np.float32))


def test_amp_bf16_step_matches_reference():
    # 16-bit products (amp) compute in float32 and round once; their elementwise
    # steps stay bf16 ops, so they are not fused: the step must still be right
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(4)
    dims = (53, 127, 131, 5)
    params = _mlp_params(rng, dims, np.float32)
    x = rng.normal(size=(131, 53)).astype(np.float32)
    y = rng.normal(size=(131, 5)).astype(np.float32)
    args = ([(jnp.asarray(w), jnp.asarray(b)) for w, b in params], jnp.asarray(x), jnp.asarray(y))
    f = fflow.jit(fflow.amp(_step, "bf16"))
    new, loss = f(*args)
    ref, ref_loss = _reference_step(params, x, y)
    assert np.asarray(new[0][0]).dtype == np.float32
    np.testing.assert_allclose(float(loss), ref_loss, rtol=3e-2)
    for (w, b), (rw, rb) in zip(new, ref):
        np.testing.assert_allclose(np.asarray(w), rw, atol=3e-2)
        np.testing.assert_allclose(np.asarray(b), rb, atol=3e-2)
    assert ml_dtypes.bfloat16 is not None


def test_weight_gradient_computed_transposed_takes_the_sgd_update():
    # a 3-D activation's weight gradient comes out of autodiff as dot_general + transpose;
    # fflow computes it in the transposed layout and the SGD update reads that buffer
    rng = np.random.default_rng(5)
    x = rng.normal(size=(3, 45, 131)).astype(np.float32)
    w = rng.normal(0, 0.1, (131, 127)).astype(np.float32)
    t = rng.normal(size=(3, 45, 127)).astype(np.float32)

    def step(w, x, t):
        gw = fflow.grad(lambda w: jnp.sum((x @ w - t) ** 2))(w)
        return w - 0.01 * gw

    f = fflow.jit(step)
    args = (jnp.asarray(w), jnp.asarray(x), jnp.asarray(t))
    sgd = [e for e in f.lower(*args).entry.executable.epilogues if e.members == ["mul", "sub"]]
    assert [(e.m, e.n) for e in sgd] == [(131, 127)]
    x2, t2 = x.reshape(-1, 131).astype(np.float64), t.reshape(-1, 127).astype(np.float64)
    ref = w - 0.01 * (x2.T @ (2 * (x2 @ w - t2)))
    np.testing.assert_allclose(np.asarray(f(*args)), ref, rtol=2e-5, atol=2e-5)


def test_traced_learning_rate():
    # the SGD update reads a learning rate passed as an argument (a 0-d value spread
    # over the weight's shape), and a 2-D bias row of a larger parameter
    rng = np.random.default_rng(6)
    x = rng.normal(size=(131, 133)).astype(np.float32)
    w = rng.normal(0, 0.2, (133, 129)).astype(np.float32)
    b = rng.normal(size=129).astype(np.float32)

    def step(w, b, x, lr):
        def loss(w):
            return jnp.sum(jnp.maximum(x @ w + b, 0.0) ** 2)

        return w - lr * fflow.grad(loss)(w)

    f = fflow.jit(step)
    args = (jnp.asarray(w), jnp.asarray(b), jnp.asarray(x), jnp.asarray(np.float32(0.05)))
    members = [e.members for e in f.lower(*args).entry.executable.epilogues]
    assert ["mul", "sub"] in members  # w - lr * gw, lr read as a scalar
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    z = x64 @ w64 + b
    ref = w64 - 0.05 * (x64.T @ (2 * np.maximum(z, 0)))
    np.testing.assert_allclose(np.asarray(f(*args)), ref, rtol=2e-5, atol=2e-5)
    args2 = args[:3] + (jnp.asarray(np.float32(0.5)),)  # a new rate, the same program
    ref2 = w64 - 0.5 * (x64.T @ (2 * np.maximum(z, 0)))
    np.testing.assert_allclose(np.asarray(f(*args2)), ref2, rtol=2e-5, atol=2e-5)
