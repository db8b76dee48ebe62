"""GEMM + bias + relu / gelu as one cuBLASLt call (lowering/cuda_cublaslt.py): the
planner's matching (cuda_layout.match_epilogues), the launch-plan text, the ctypes
argument packing checked by a stand-in libcublasLt (tests/fake_cublaslt.py, which
computes what cuBLASLt's documentation says the epilogue computes), and the fallback
to the GEMM + fused kernel when cuBLASLt is missing or refuses a layout."""

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
from fflow import nn

BF16 = np.dtype(ml_dtypes.bfloat16)


def plans(fn, *args):
    prog = cuda_backend._optimize(fflow.make_jaxpr(fn)(*args))
    lt, plain = cuda_backend.Plan(prog), cuda_backend.Plan(prog, epilogues=False)
    return lt, plain, cuda_backend.plan_text(lt)


def test_bias_and_activation_fuse_into_the_gemm_only_when_the_math_matches():
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s).astype(BF16) for s in ((8, 16), (16, 32), (32,)))
    cases = [
        (lambda x, w, b: nn.gelu(x @ w + b), "GEMM+bias+gelu (cuBLASLt epilogue GELU_BIAS)", 1),
        (lambda x, w, b: nn.relu(x @ w + b), "GEMM+bias+relu (cuBLASLt epilogue RELU_BIAS)", 1),
        (lambda x, w, b: jnp.maximum(x @ w + b, 0), "epilogue RELU_BIAS", 1),
        (lambda x, w, b: nn.gelu(x @ w), "GEMM+gelu (cuBLASLt epilogue GELU)", 1),
        # exact (erf) gelu: cuBLASLt's GELU is the tanh form, so only the bias joins
        (lambda x, w, b: nn.gelu(x @ w + b, approximate=False), "GEMM+bias (cuBLASLt epi", 0),
        # the pre-activation is read again: GELU_AUX_BIAS writes it beside the output
        (lambda x, w, b: nn.gelu(x @ w + b) * (x @ w + b), "epilogue GELU_AUX_BIAS", 0),
        (lambda x, w, b: nn.gelu(x @ w) * (x @ w), "epilogue GELU_AUX)", 0),
    ]
    for fn, want, fewer in cases:
        lt, plain, text = plans(fn, x, w, b)
        assert want in text, text
        assert "bfloat16 x bfloat16 -> bfloat16, fp32 accumulate, m=8 n=32 k=16" in text
        assert len(lt.kernels) == len(plain.kernels) - fewer, text  # the epilogue kernel
    # amp: fp32 bias + gelu, cast back to bf16 for the next GEMM: cuBLASLt writes bf16
    # (BIAS_DATA_TYPE fp32), so neither the epilogue nor the cast is a kernel
    p32 = [a.astype(np.float32) for a in (x, w, b)]
    lt, plain, text = plans(fflow.amp(lambda x, w, b: nn.gelu(x @ w + b) @ w.T, "bf16"), *p32)
    assert "bfloat16 x bfloat16 -> bfloat16" in text and "bias %2:f32[32]" in text, text
    assert len(lt.kernels) == len(plain.kernels) - 1, text
    # no bias along the last axis, a relu with another threshold: the plain GEMM
    for fn in (lambda x, w, b: x @ w + b[:8, None], lambda x, w, b: jnp.maximum(x @ w, 1)):
        lt, plain, text = plans(fn, x, w, b)
        assert "cuBLASLt" not in text and len(lt.kernels) == len(plain.kernels), text


def test_fallback_kernel_on_the_shim_computes_the_epilogue():
    # the host shim has no cuBLASLt: the plan runs the GEMM and the fallback kernel
    rng = np.random.default_rng(1)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((6, 12), (12, 16), (16,)))

    def f(x, w, b):
        return nn.gelu(x @ w + b)

    exe = cuda_backend.compile_program(fflow.make_jaxpr(f)(x, w, b), backend="cuda_shim")
    (out,) = exe(x, w, b)
    z = x.astype(np.float64) @ w + b
    ref = 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z**3)))
    np.testing.assert_allclose(np.asarray(out), ref, rtol=2e-6, atol=2e-6)
    assert "taken: GEMM + kernel fflow_ew_" in exe.source and "(fallback)" in exe.source


SCRIPT = """
import sys
sys.path.insert(0, {here!r})
import fake_cupy
fake_cupy.install()
import fake_cublaslt
fake_cublaslt.install(available={available})
fake_cublaslt.REFUSE.update({refuse})
import ml_dtypes, numpy as np
import fflow, fflow.numpy as jnp
from fflow import nn, lax
BF16 = np.dtype(ml_dtypes.bfloat16)
gpu = fflow.devices("gpu")[0]
rng = np.random.default_rng(0)
def put(*xs):
    return [fflow.device_put(x, gpu) for x in xs]
def gelu(z):
    return 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z**3)))
def rel(got, ref):
    return np.max(np.abs(np.asarray(got, np.float64) - ref)) / np.max(np.abs(ref))

# 1. MLP forward and grad (f32): the forward GEMM writes relu's bit mask (RELU_AUX_BIAS),
# the backward's GEMM applies it and sums the bias gradient (DRELU_BGRAD)
w1, b1 = rng.standard_normal((20, 24)) / 4, rng.standard_normal(24)
w2, b2 = rng.standard_normal((24, 8)) / 4, rng.standard_normal(8)
x, y = rng.standard_normal((16, 20)), rng.standard_normal((16, 8))
def loss(p, x, y):
    h = nn.relu(x @ p[0] + p[1])
    return jnp.mean((h @ p[2] + p[3] - y) ** 2)
p32 = [a.astype(np.float32) for a in (w1, b1, w2, b2)]
fake_cublaslt.CALLS.clear()
val, g = fflow.jit(fflow.value_and_grad(loss))(put(*p32), *put(x.astype(np.float32), y.astype(np.float32)))
z = x @ w1 + b1; h = np.maximum(z, 0); o = h @ w2 + b2
d = 2 * (o - y) / o.size
dh = (d @ w2.T) * (z > 0)
refs = [x.T @ dh, dh.sum(0), h.T @ d, d.sum(0)]
assert rel(val, ((o - y) ** 2).mean()) < 1e-5
for got, ref in zip(g, refs):
    assert rel(got, ref) < 1e-5, rel(got, ref)
calls = [c["epilogue"] for c in fake_cublaslt.CALLS]
print("mlp", calls)

# 1b. the same under amp bf16: the backward GEMM writes bf16 from its fp32 accumulator
fake_cublaslt.CALLS.clear()
val, g = fflow.jit(fflow.value_and_grad(fflow.amp(loss, "bf16")))(
    put(*p32), *put(x.astype(np.float32), y.astype(np.float32)))
q16 = [np.asarray(a.astype(BF16), np.float64) for a in (w1, w2, x)]
z = q16[2] @ q16[0] + b1; h = np.maximum(z, 0); o = h @ q16[1] + b2
d = 2 * (o - y) / o.size
dh = (d @ q16[1].T) * (z > 0)
for got, ref in zip(g, [q16[2].T @ dh, dh.sum(0), h.T @ d, d.sum(0)]):
    assert rel(got, ref) < 2e-2, rel(got, ref)
print("ampmlp", [c["epilogue"] for c in fake_cublaslt.CALLS])

# 2. a bias + gelu block under amp bf16: x @ w1 + b1 -> gelu -> @ w2 + b2 (3-D activations)
def block(p, x):
    return nn.gelu(x @ p[0] + p[1]) @ p[2] + p[3]
xb = rng.standard_normal((2, 8, 20))
fake_cublaslt.CALLS.clear()
f = fflow.jit(fflow.amp(block, "bf16"))
out = f(put(*p32), *put(xb.astype(np.float32)))
q = [np.asarray(a.astype(BF16), np.float64) for a in p32]
xq = np.asarray(xb.astype(BF16), np.float64)
ref = gelu(xq @ q[0] + q[1]) @ q[2] + q[3]
assert rel(out, ref) < 2e-2, rel(out, ref)
calls2 = fake_cublaslt.CALLS
print("block", [(c["epilogue"], c["m"], c["n"], c["k"], c["atype"], c["dtype"]) for c in calls2])
text = f.lower(put(*p32), *put(xb.astype(np.float32))).as_text()
print("plan", [ln for ln in text.splitlines() if "cuBLASLt" in ln])

# 3. packing: x.T-style operands (OP_T), a batched GEMM with a shared bias, bf16 out
a, wt, bb = rng.standard_normal((3, 5, 16)), rng.standard_normal((24, 16)), rng.standard_normal(24)
fake_cublaslt.CALLS.clear()
args = [v.astype(BF16) for v in (a, wt, bb)]
out = fflow.jit(lambda a, wt, bb: nn.relu(a @ wt.T + bb))(*put(*args))
qa, qw, qb = (np.asarray(v, np.float64) for v in args)
assert rel(out, np.maximum(qa @ qw.T + qb, 0)) < 1e-2
bt = rng.standard_normal((4, 5, 16)), rng.standard_normal((4, 16, 8)), rng.standard_normal(8)
args = [v.astype(np.float32) for v in bt]
out = fflow.jit(lambda u, v, c: jnp.matmul(u, v) + c)(*put(*args))
assert rel(out, np.matmul(bt[0], bt[1]) + bt[2]) < 1e-5
# 4. the pre-activation read again: GELU_AUX_BIAS writes it (aux, ld n) beside gelu(z)
z3 = [rng.standard_normal(s).astype(np.float32) for s in ((6, 12), (12, 16), (16,))]
out = fflow.jit(lambda x, w, b: nn.gelu(x @ w + b) * (x @ w + b))(*put(*z3))
zz = z3[0].astype(np.float64) @ z3[1] + z3[2]
assert rel(out, gelu(zz) * zz) < 1e-5, rel(out, gelu(zz) * zz)
print("pack", [(c["epilogue"], c["transa"], c["transb"], c["batch"], c["m"], c["n"], c["k"])
               for c in fake_cublaslt.CALLS])

# 5. CUDA graphs: the second call captures the Lt calls, the third replays them
wg, bg, xg = (rng.standard_normal(s).astype(np.float32) / 3 for s in ((12, 12), (12,), (5, 12)))
def deep(x, w, b):
    for _ in range(6):
        x = nn.relu(x @ w + b)
    return x
ref = xg.astype(np.float64)
for _ in range(6):
    ref = np.maximum(ref @ wg + bg, 0)
f = fflow.jit(deep)
for i in range(3):
    fake_cupy.USED.clear()
    assert rel(f(*put(xg, wg, bg)), ref) < 1e-5, i
print("graph", [k for k, _ in fake_cupy.USED if k in ("graph_launch", "ltMatmul")])
print("ok")
"""


def run_script(available=True, refuse=()):
    here = os.path.dirname(os.path.abspath(__file__))
    env = {k: v for k, v in os.environ.items() if k != "FFLOW_JIT_BACKEND"}
    src = SCRIPT.format(here=here, available=available, refuse=set(refuse) or "()")
    proc = subprocess.run(
        [sys.executable, "-c", src], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    return dict(ln.split(" ", 1) for ln in proc.stdout.splitlines() if " " in ln)


@pytest.mark.skipif(not nvrtc_required(), reason="libnvrtc cannot be loaded here")
def test_epilogues_through_a_stand_in_cublaslt():
    out = run_script()
    assert out["mlp"] == "['RELU_AUX_BIAS', 'BIAS', 'DRELU_BGRAD']", out
    assert out["ampmlp"] == "['RELU_AUX_BIAS', 'BIAS', 'DRELU_BGRAD']", out
    # amp: bf16 operands, fp32 bias, gelu's result cast to bf16 by cuBLASLt (D bf16)
    assert "('GELU_BIAS', 24, 16, 20, 14, 14)" in out["block"], out
    assert "('BIAS', 8, 16, 24, 14, 0)" in out["block"], out
    assert "GEMM+bias+gelu (cuBLASLt epilogue GELU_BIAS)" in out["plan"], out
    assert "taken: cuBLASLt" in out["plan"], out
    # x @ w.T: cuBLASLt's A is w's memory read transposed (OP_T); one bias for 4 batches
    assert "('RELU_BIAS', 1, 0, 1, 24, 15, 16)" in out["pack"], out
    assert "('BIAS', 0, 0, 4, 8, 5, 16)" in out["pack"], out
    assert "('GELU_AUX_BIAS', 0, 0, 1, 16, 6, 12)" in out["pack"], out
    assert out["graph"] == "['graph_launch']", out  # a replay: one launch, no Lt calls


@pytest.mark.skipif(not nvrtc_required(), reason="libnvrtc cannot be loaded here")
def test_fallback_when_cublaslt_is_missing_or_refuses():
    out = run_script(available=False)  # the same numbers from GEMM + epilogue kernel
    assert out["mlp"] == "[]" and "taken: GEMM + kernel" in out["plan"], out
    assert "libcublasLt not found" in out["plan"], out
    out = run_script(refuse={36, 152})  # the heuristic has no GELU_BIAS, DRELU_BGRAD algorithm
    assert "GELU_BIAS" not in out["block"] and "no GELU_BIAS algorithm" in out["plan"], out
    assert out["mlp"] == "['RELU_AUX_BIAS', 'BIAS']", out  # the backward: GEMM + kernels
    assert out["ampmlp"] == "['RELU_AUX_BIAS', 'BIAS']", out
    out = run_script(refuse={134})  # no mask from the forward: the backward falls back too
    assert out["mlp"] == "['BIAS']", out


def test_relu_mask_read_from_the_output_is_the_same_predicate():
    # relu_masks_from_outputs: the backward's `z <= 0` becomes `relu(z) <= 0`; the rewritten
    # program must give what the original gives at z = 0, -0, NaN, +-inf (eager evaluation)
    from fflow.lowering import cuda_layout
    from fflow.transforms.staging import eval_program

    z = np.array([1.0, 0.0, -0.0, np.nan, -1.0, np.inf, -np.inf, 2.5], np.float32)
    x, w, b = z[:, None], np.ones((1, 3), np.float32), np.zeros(3, np.float32)
    c = np.arange(1.0, 25.0, dtype=np.float32).reshape(8, 3)

    def f(x, w, b):
        return jnp.sum(nn.relu(x @ w + b) * c)

    vg = fflow.value_and_grad(f)
    prog = cuda_backend._optimize(fflow.make_jaxpr(vg)(x, w, b))
    plain = cuda_layout.fold_operand_transposes(passes_optimize(fflow.make_jaxpr(vg)(x, w, b)))
    assert len(prog.eqns) == len(plain.eqns) + 1, prog  # one `le` of the relu's output
    got = [np.asarray(o) for o in eval_program(prog, prog.consts, [x, w, b])]
    want = [np.asarray(o) for o in eval_program(plain, plain.consts, [x, w, b])]
    for g, r in zip(got, want):
        np.testing.assert_array_equal(g, r)  # NaN where the original has NaN
    dx = want[1][:, 0]  # relu' passes the gradient at z > 0 and at NaN (NaN <= 0 is false)
    assert np.isnan(want[0]) and (dx[[1, 2, 4, 6]] == 0).all() and (dx[[0, 3, 5, 7]] > 0).all()


def passes_optimize(program):
    from fflow.lowering import passes

    return passes.optimize(program)[0]
