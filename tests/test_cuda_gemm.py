"""bf16 / fp16 matmuls as 16-bit cuBLAS GEMMs with fp32 accumulation (cublasGemmEx,
strided-batched for batch dims): no float32 copies and no conversion kernels around
them in the launch plan, operands passed transposed instead of copied, and the numbers
through a stand-in cuBLAS (tests/fake_cupy.py, column-major like the real one)."""

import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from cuda_harness import nvrtc_required
from fflow.lowering import cuda_backend

import fflow
import fflow.numpy as jnp
from fflow import lax, nn

BF16 = np.dtype(ml_dtypes.bfloat16)


def plan_text(fn, *args):
    prog = cuda_backend._optimize(fflow.make_jaxpr(fn)(*args))
    plan = cuda_backend.Plan(prog)
    return plan, cuda_backend.plan_text(plan)


def test_bf16_gemm_is_one_cublas_call_without_conversions():
    x, w = np.ones((8, 16), BF16), np.ones((16, 4), BF16)
    plan, text = plan_text(lambda x, w: x @ w, x, w)
    assert not plan.kernels, text  # no f32 copies, no conversion kernels: just the GEMM
    assert "cublasGemmEx bfloat16 x bfloat16 -> bfloat16, fp32 accumulate" in text
    assert "m=8 n=4 k=16 lhs=N rhs=N" in text
    # bias + relu epilogue: in cuBLASLt's epilogue (RELU_BIAS), or one bf16 fallback
    # kernel reading the GEMM's 16-bit output (test_cuda_cublaslt.py)
    b = np.ones(4, BF16)
    plan, text = plan_text(lambda x, w, b: nn.relu(x @ w + b), x, w, b)
    assert not plan.kernels and len(plan.fallback_kernels) == 1, text
    assert "convert" not in text and "RELU_BIAS" in text, text


def test_weight_gradient_and_attention_layouts_need_no_transpose_copy():
    x, g = np.ones((8, 16), BF16), np.ones((8, 4), BF16)
    dn = (((0,), (0,)), ((), ()))  # x.T @ g, the weight gradient of x @ w
    plan, text = plan_text(lambda x, g: lax.dot_general(x, g, dn), x, g)
    assert not plan.kernels and "lhs=T rhs=N" in text, text
    q, k = np.ones((2, 3, 5, 4), np.float16), np.ones((2, 3, 6, 4), np.float16)
    plan, text = plan_text(lambda q, k: jnp.einsum("bhqd,bhkd->bhqk", q, k), q, k)
    assert not plan.kernels, text
    assert "cublasGemmStridedBatchedEx batch=6 float16 x float16 -> float16" in text
    assert "m=5 n=6 k=4 lhs=N rhs=T" in text


SCRIPT = """
import sys
sys.path.insert(0, {here!r})
import fake_cupy
fake_cupy.install()
import ml_dtypes, numpy as np
import fflow, fflow.numpy as jnp
from fflow import lax
BF16 = np.dtype(ml_dtypes.bfloat16)
gpu = fflow.devices("gpu")[0]
rng = np.random.default_rng(0)
def r(*s, dt=BF16):
    return rng.standard_normal(s).astype(dt)
cases = [
    ("x @ w", lambda a, b: a @ b, r(9, 17), r(17, 5)),
    ("x.T @ g", lambda a, b: lax.dot_general(a, b, (((0,), (0,)), ((), ()))), r(7, 6), r(7, 3)),
    ("x @ w.T", lambda a, b: a @ b.T, r(4, 8), r(5, 8)),
    ("q @ k^T batched", lambda a, b: jnp.einsum("bhqd,bhkd->bhqk", a, b), r(2, 3, 5, 4),
     r(2, 3, 6, 4)),
    ("p @ v batched fp16", lambda a, b: jnp.einsum("bqk,bkd->bqd", a, b),
     r(3, 5, 6, dt=np.float16), r(3, 6, 4, dt=np.float16)),
    ("to f32", lambda a, b: lax.dot_general(a, b, (((1,), (0,)), ((), ())),
     preferred_element_type=np.float32), r(6, 10), r(10, 3)),
    ("odd layout", lambda a, b: jnp.einsum("kbm,bkn->bmn", a, b), r(4, 2, 3), r(2, 4, 5)),
]
for name, fn, a, b in cases:
    ref = np.asarray(fn(a.astype(np.float64), b.astype(np.float64)))
    fake_cupy.USED.clear()
    out = fflow.jit(fn)(fflow.device_put(a, gpu), fflow.device_put(b, gpu))
    kinds = [k for k, _ in fake_cupy.USED]
    assert "gemmEx" in kinds and "matmul" not in kinds, (name, kinds)
    got = np.asarray(out).astype(np.float64)
    assert out.dtype == fn(jnp.asarray(a), jnp.asarray(b)).dtype, (name, out.dtype)
    tol = 8e-3 if out.dtype == np.float16 else 1.6e-2 if out.dtype == BF16 else 1e-5
    err = np.max(np.abs(got - ref)) / np.max(np.abs(ref))
    assert err <= tol, (name, err)
print("ok")
"""


@pytest.mark.skipif(not nvrtc_required(), reason="libnvrtc cannot be loaded here")
def test_16_bit_gemms_through_a_stand_in_cublas():
    here = os.path.dirname(os.path.abspath(__file__))
    env = {k: v for k, v in os.environ.items() if k != "FFLOW_JIT_BACKEND"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(here=here)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout + proc.stderr[-3000:]


def test_transposed_operands_are_read_by_cublas_not_copied():
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((8, 16)).astype(np.float32), rng.standard_normal((4, 16))
    w = w.astype(np.float32)
    q = rng.standard_normal((2, 3, 5, 8)).astype(BF16)
    k = rng.standard_normal((2, 3, 7, 8)).astype(BF16)
    cases = [
        (lambda x, w: x @ w.T, (x, w), None),  # PyTorch's Linear
        (lambda x, w: x @ w.T, (x.astype(BF16), w.astype(BF16)), "lhs=N rhs=T"),
        (lambda q, k: q @ k.transpose(0, 1, 3, 2), (q, k), "batch=6 bfloat16"),  # attention
    ]
    for fn, args, note in cases:
        plan, text = plan_text(fn, *args)
        assert not plan.kernels, text  # one GEMM, no transpose kernel before it
        if note:
            assert note in text and "rhs=T" in text, text
    # free dims that would come out reordered: the transpose stays a kernel
    y = rng.standard_normal((3, 2, 16)).astype(np.float32)
    plan, text = plan_text(lambda y, w: y.transpose(1, 0, 2) @ w.T, y, w)
    assert plan.kernels and "BlasStep" in [type(s).__name__ for s in plan.steps]
    for fn, args in [(cases[0][0], (x, w)), (cases[2][0], (q, k)),
                     (lambda y, w: y.transpose(1, 0, 2) @ w.T, (y, w))]:  # fmt: skip
        exe = cuda_backend.compile_program(fflow.make_jaxpr(fn)(*args), backend="cuda_shim")
        out = np.asarray(exe(*args)[0]).astype(np.float64)
        ref = fn(*[np.asarray(a, np.float64) for a in args])  # NumPy float64
        tol = 2e-2 if args[0].dtype == BF16 else 1e-5
        np.testing.assert_allclose(out, ref, rtol=tol, atol=tol)


def test_weight_gradients_of_3d_activations_need_no_transpose_kernel():
    # dW of x @ w with x [b, s, d]: reverse mode gives transpose(dot(dy, x)); the GEMM is
    # swapped to write [d_in, d_out] directly
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 5, 8)).astype(np.float32)
    w = rng.standard_normal((8, 6)).astype(np.float32)

    def loss(w, x):
        return jnp.sum(jnp.tanh(x @ w) ** 2)

    fn = fflow.grad(loss)
    plan, text = plan_text(fn, w, x)
    assert [type(s).__name__ for s in plan.steps][-1] == "BlasStep", text
    assert not [k for k in plan.kernels if k.kind in ("ewt",)], text
    exe = cuda_backend.compile_program(fflow.make_jaxpr(fn)(w, x), backend="cuda_shim")
    (dw,) = exe(w, x)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    t = np.tanh(x64 @ w64)
    ref = np.einsum("bsi,bso->io", x64, 2 * t * (1 - t * t))  # float64 by hand
    np.testing.assert_allclose(np.asarray(dw), ref, rtol=1e-5, atol=1e-6)


def test_fp32_product_cast_back_to_bf16_is_written_by_the_gemm():
    # amp: bf16 operands, fp32 product, cast back to bf16 -> one GEMM writing bf16
    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 16)).astype(BF16)
    w = rng.standard_normal((16, 5)).astype(BF16)

    def f(x, w):
        dn = (((1,), (0,)), ((), ()))
        return lax.dot_general(x, w, dn, preferred_element_type=np.float32).astype(BF16)

    plan, text = plan_text(f, x, w)
    assert not plan.kernels and "bfloat16 x bfloat16 -> bfloat16" in text, text
    exe = cuda_backend.compile_program(fflow.make_jaxpr(f)(x, w), backend="cuda_shim")
    got = np.asarray(exe(x, w)[0])
    want = (x.astype(np.float64) @ w.astype(np.float64)).astype(np.float32).astype(BF16)
    assert got.dtype == BF16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=8e-3)
