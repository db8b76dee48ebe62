"""Row kernels of the CUDA backend read each row from memory once: softmax,
log_softmax and layernorm (forward and backward) keep the row in registers across
their passes, with 16-byte vector loads and stores when the row length allows.
Checked on the generated source (one load site per input), on NVRTC's PTX (128-bit
global loads, no local memory) and by running through the host shim against
float64 NumPy references."""

import re

import numpy as np
import pytest
import scipy.special
from cuda_harness import BACKEND, BF16, nvrtc_required, to_backend
from fflow.lowering import cuda_backend, nvrtc

import fflow
import fflow.numpy as jnp
from fflow import nn
from fflow.experimental import enable_x64

rng = np.random.default_rng(3)


def plan_of(fn, *args):
    return cuda_backend.Plan(cuda_backend._optimize(fflow.make_jaxpr(fn)(*args)))


def ref_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def ref_log_softmax(x):
    s = x - x.max(-1, keepdims=True)
    return s - np.log(np.exp(s).sum(-1, keepdims=True))


def ref_layernorm(x, g):
    m = x.mean(-1, keepdims=True)
    return (x - m) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * g + g


FNS = {
    "softmax": (lambda x, g: nn.softmax(x, axis=-1), lambda x, g: ref_softmax(x)),
    "log_softmax": (lambda x, g: nn.log_softmax(x, axis=-1), lambda x, g: ref_log_softmax(x)),
    "layernorm": (lambda x, g: nn.standardize(x, axis=-1) * g + g, ref_layernorm),
}
TOL = {"float32": 3e-5, "float64": 1e-12, "bfloat16": 3e-2}

# (shape, dtype, vector width of the loads): warp rows with 16-byte loads, a partial
# last chunk (100 = 25 x 4), odd rows (scalar), block rows (2000 > 1024), f64, bf16
CASES = [
    ((6, 256), np.float32, 4),
    ((3, 100), np.float32, 2),
    ((2, 3, 33), np.float32, 1),
    ((2, 2000), np.float32, 4),
    ((4, 64), np.float64, 2),
    ((3, 256), BF16, 8),
]


def _body(kernel):
    return kernel.source.split("void fflow_row_")[1]


def _run(fn, args):
    exe = cuda_backend.compile_program(fflow.make_jaxpr(fn)(*args), backend=BACKEND)
    return [np.asarray(o) for o in exe(*[to_backend(a) for a in args])]


@pytest.mark.parametrize("shape,dtype,vec", CASES, ids=lambda c: str(c))
def test_row_is_read_once(shape, dtype, vec):
    with enable_x64():  # float64 stays float64
        _check_read_once(shape, np.dtype(dtype), vec)


def _check_read_once(shape, dtype, vec):
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    g = rng.uniform(0.5, 1.5, shape[-1]).astype(dtype)
    x64, g64 = x.astype(np.float64), g.astype(np.float64)
    for name, (fn, ref) in FNS.items():
        (k,) = plan_of(fn, x, g).kernels
        body = _body(k)
        # the row's max / sum / mean stay in registers: the output is the only store
        assert "out0" in body and "out1" not in body, name
        params = re.findall(r"\b(in\d+)\b", body.split("{", 1)[0])
        for p in params:  # x (and gamma) are loaded at one place: once per row / thread
            assert len(re.findall(rf"\b{p}\b", body.split("{", 1)[1])) == 1, (name, p)
        if vec > 1:
            width = {16: "uint4", 8: "uint2", 4: "unsigned int"}[vec * dtype.itemsize]
            assert f"const {width} raw" in body, name
        else:
            assert "raw" not in body, name
        (out,) = _run(fn, [x, g])
        assert out.dtype == dtype
        tol = TOL[dtype.name]
        np.testing.assert_allclose(out.astype(np.float64), ref(x64, g64), rtol=tol, atol=tol,
                                   err_msg=f"{name} {shape} {dtype}")  # fmt: skip


def test_layernorm_backward_rows_read_once():
    x = rng.standard_normal((5, 96)).astype(np.float32)
    g = rng.uniform(0.5, 1.5, 96).astype(np.float32)
    dy = rng.standard_normal((5, 96)).astype(np.float32)

    def loss(x, g):
        return jnp.sum((nn.standardize(x, axis=-1) * g + g) * dy)

    fn = fflow.grad(loss, argnums=(0, 1))
    rows = [k for k in plan_of(fn, x, g).kernels if k.kind == "row"]
    assert rows and all("xc0" in k.source for k in rows)
    dx, dg = _run(fn, [x, g])
    # float64 reference: the layernorm backward formula
    x64, g64, dy64 = (a.astype(np.float64) for a in (x, g, dy))
    mu = x64.mean(-1, keepdims=True)
    inv = 1 / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
    xh = (x64 - mu) * inv
    dxh = dy64 * g64
    ref_dx = inv * (dxh - dxh.mean(-1, keepdims=True) - xh * (dxh * xh).mean(-1, keepdims=True))
    np.testing.assert_allclose(dx, ref_dx, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dg, (dy64 * xh + dy64).sum(0), rtol=1e-4, atol=1e-5)


def test_long_rows_take_an_online_max_and_sum():
    # 40,000 floats a row: past the register budget, so max and sum(exp(x - max))
    # are one pass (running max, rescaled sum) and the output a second one
    x = rng.standard_normal((5, 40000)).astype(np.float32) * 4
    x[1, 7] = np.inf
    x[2] = -np.inf
    x[3, 11] = np.nan
    x[4, :20000] = -np.inf  # -inf before the first finite element of some threads
    x64 = x.astype(np.float64)
    fns = {
        "softmax": (FNS["softmax"][0], FNS["softmax"][1], 2),
        "log_softmax": (FNS["log_softmax"][0], FNS["log_softmax"][1], 2),
        "layernorm": (FNS["layernorm"][0], FNS["layernorm"][1], 2),  # sum(x), sum(x*x): 1 pass
        "logsumexp": (
            lambda x, g: nn.logsumexp(x, axis=-1),
            lambda x, g: scipy.special.logsumexp(x, axis=-1),
            1,
        ),
    }
    for name, (fn, ref, passes) in fns.items():
        (k,) = plan_of(fn, x, x[0]).kernels
        body = _body(k)
        assert "xc0" not in body and ("s0 = (m0 == mn" in body or name == "layernorm"), name
        assert len(re.findall(r"\bin0\[", body)) == passes, name  # x: passes over it
        (out,) = _run(fn, [x, x[0]])
        with np.errstate(all="ignore"):
            want = ref(x64, x64[0])
        atol = 1e-5 if name == "layernorm" else 1e-9  # (x - mean) near 0: absolute
        np.testing.assert_allclose(out, want, rtol=3e-5, atol=atol, equal_nan=True, err_msg=name)


@pytest.mark.skipif(not nvrtc_required(), reason="NVRTC unavailable")
def test_row_cache_is_registers_with_128_bit_loads():
    for dtype, fn in [(np.float32, FNS["softmax"][0]), (BF16, FNS["layernorm"][0])]:
        x = np.zeros((8, 1024), dtype)
        (k,) = plan_of(fn, x, x[0]).kernels
        ptx = nvrtc.compile_ptx(k.source).decode()
        assert ".local" not in ptx, "the row cache spilled to local memory"
        loads = re.findall(r"ld\.global\S*", ptx)
        assert loads and all(".v4" in ld for ld in loads), loads
        assert re.search(r"st\.global\S*\.v4", ptx)


def test_online_max_and_sum_in_warp_rows():
    # a transposed input is not read at the row's element: no cache, online pass
    x = rng.standard_normal((96, 5)).astype(np.float32) * 4
    x[3, 1] = np.inf
    x[:, 2] = -np.inf
    fn = lambda x: nn.softmax(x.T, axis=-1)  # noqa: E731
    (k,) = plan_of(fn, x).kernels
    assert "xc0" not in k.source and "s0 = (m0 == mn" in k.source
    (out,) = _run(fn, [x])
    with np.errstate(all="ignore"):
        want = ref_softmax(x.T.astype(np.float64))
    np.testing.assert_allclose(out, want, rtol=3e-5, atol=1e-9, equal_nan=True)


@pytest.mark.parametrize("shape", [(37, 10), (9, 8), (5, 3)])
def test_short_rows_share_a_warp(shape):
    # rows under 32 elements: sub-groups of the next power of two lanes, a row each
    lanes = 16 if shape[1] == 10 else shape[1] if shape[1] == 8 else 4
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    x64 = x.astype(np.float64)
    cases = [
        (FNS["softmax"][0], lambda x: ref_softmax(x)),
        (FNS["log_softmax"][0], lambda x: ref_log_softmax(x)),
        (lambda x, g: jnp.sum(x * x, axis=-1), lambda x: (x * x).sum(-1)),
        (lambda x, g: jnp.argmax(x, axis=-1), lambda x: np.argmax(x, -1)),
        (lambda x, g: nn.softmax(x.T.T + 0 * x.T.T, axis=-1), lambda x: ref_softmax(x)),
    ]
    for fn, ref in cases:
        (k,) = plan_of(fn, x, x[0]).kernels
        assert f"const int nt = {lanes};" in k.source and "row0 + sub" in k.source
        assert f"for (int o = {lanes // 2}; o > 0" in k.source
        (out,) = _run(fn, [x, x[0]])
        np.testing.assert_allclose(out, ref(x64), rtol=3e-5, atol=1e-6)
    # a transposed input: no register cache, the online max/sum within sub-groups
    fn = lambda x: nn.softmax(x.T, axis=-1)  # noqa: E731
    (k,) = plan_of(fn, x.T.copy()).kernels
    assert "s0 = (m0 == mn" in k.source and "row0 + sub" in k.source
    (out,) = _run(fn, [x.T.copy()])
    np.testing.assert_allclose(out, ref_softmax(x64), rtol=3e-5, atol=1e-6)


def test_rows_over_several_trailing_axes_use_the_cache():
    # the reduced dims are 2-D: the cache is indexed by the row's linear offset
    for shape, axes in [((3, 4, 50), (1, 2)), ((2, 3, 8, 9), (2, 3)), ((5, 40, 40), (1, 2))]:
        x = rng.standard_normal(shape).astype(np.float32)
        x64 = x.astype(np.float64)
        for fn, ref in [
            (lambda x, a=axes: jnp.sum(x * x, axis=a), lambda x, a=axes: (x * x).sum(a)),
            (lambda x, a=axes: jnp.max(x, axis=a), lambda x, a=axes: x.max(a)),
        ]:
            (k,) = plan_of(fn, x).kernels
            assert k.kind == "row" and "xc0" in k.source
            (out,) = _run(fn, [x])
            np.testing.assert_allclose(out, ref(x64), rtol=1e-5)
