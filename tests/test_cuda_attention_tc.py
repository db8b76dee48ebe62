"""Tensor-core flash attention (lowering/cuda_attention_tc.py): bf16/fp16 through the
host shim (which emulates mma.m16n8k16 lane by lane) against a float64 NumPy formula,
the launch plan's note, and NVRTC builds whose PTX holds mma.sync."""

import numpy as np
import pytest
from cuda_harness import BACKEND, BF16, nvrtc_required, to_backend
from fflow.lowering import cuda_backend, nvrtc

import fflow
from fflow import nn


def _ref64(q, k, v, valid):
    """Attention output in float64; `valid` [b, n|1, t, s] bool (mask and causal)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    n = q.shape[2]
    k, v = np.repeat(k, n // k.shape[2], 2), np.repeat(v, n // v.shape[2], 2)
    logits = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
    logits = np.where(valid, logits, -1e300)  # a fully masked row averages every key
    p = np.exp(logits - logits.max(-1, keepdims=True))
    return np.einsum("bnts,bsnh->btnh", p / p.sum(-1, keepdims=True), v)


def _valid(b, t, s, causal, mask):
    valid = np.ones((b, 1, t, s), bool)
    if mask is not None:
        valid &= mask
    if causal:
        valid &= np.tril(np.ones((t, s), bool))
    return valid


def _dtype(name):
    if name == "bf16" and BF16 is None:
        pytest.skip("ml_dtypes missing")
    return BF16 if name == "bf16" else np.dtype(np.float16)


def _compile(fn, *args):
    prog = fflow.make_jaxpr(fn)(*args)
    return cuda_backend.compile_program(prog, backend=BACKEND, verify_nvrtc=False)


CASES = [  # (b, t, s, n, kh, h, causal, padding mask): tiles of 64 queries / 64 keys
    (1, 20, 70, 2, 1, 64, False, False),
    (1, 70, 70, 2, 2, 64, True, False),
    (2, 9, 33, 2, 1, 128, False, True),
    (1, 40, 40, 1, 1, 128, True, True),
]


@pytest.mark.parametrize("kind", ["bf16", "f16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "b{}t{}s{}n{}kh{}h{}{}{}".format(*c))
def test_forward_on_tensor_cores_matches_float64(kind, case):
    b, t, s, n, kh, h, causal, padded = case
    dtype = _dtype(kind)
    rng = np.random.default_rng(sum(case[:6]))
    q = rng.standard_normal((b, t, n, h)).astype(dtype)
    k, v = (rng.standard_normal((b, s, kh, h)).astype(dtype) for _ in range(2))
    mask = None
    if padded:  # key padding: batch i has length s - 5 i; the first query row sees nothing
        mask = np.arange(s)[None, None, None, :] < (s - 5 * np.arange(b))[:, None, None, None]
        mask = np.broadcast_to(mask, (b, 1, t, s)).copy()
        mask[:, :, 0] = False
    kw = {"is_causal": causal} | ({"mask": mask} if padded else {})

    def fwd(q, k, v):
        return nn.dot_product_attention(q, k, v, **kw)

    exe = _compile(fwd, q, k, v)
    assert [kern.kind for kern in exe.plan.kernels] == ["attn_fwd"]
    src = exe.plan.kernels[0].source
    assert "fflow_mma_sync_" + kind in src and "fflow_ldmatrix_sync_x4(" in src
    (out,) = exe(*(to_backend(a) for a in (q, k, v)))
    ref = _ref64(q, k, v, _valid(b, t, s, causal, mask))
    got = np.asarray(out, np.float64)
    tol = 2e-2 if kind == "bf16" else 4e-3  # P is rounded to 16 bits before P.V
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)
    # an error in the fragment layout would be O(1): check the bulk is much closer
    assert np.abs(got - ref).mean() < tol / 4


def _grads64(q, k, v, ct, valid):
    """dq, dk, dv of sum(attention * ct) in float64 (grouped heads summed into dk, dv)."""
    q, k, v, ct = (np.asarray(x, np.float64) for x in (q, k, v, ct))
    n, kh = q.shape[2], k.shape[2]
    kr, vr = np.repeat(k, n // kh, 2), np.repeat(v, n // kh, 2)
    sc = 1 / np.sqrt(q.shape[-1])
    logits = np.where(valid, np.einsum("btnh,bsnh->bnts", q, kr) * sc, -1e300)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dp = np.einsum("btnh,bsnh->bnts", ct, vr)
    ds = np.where(valid, p * (dp - (dp * p).sum(-1, keepdims=True)), 0) * sc
    dq = np.einsum("bnts,bsnh->btnh", ds, kr)
    group = lambda x: x.reshape(*x.shape[:2], kh, n // kh, x.shape[-1]).sum(3)  # noqa: E731
    dk = group(np.einsum("bnts,btnh->bsnh", ds, q))
    dv = group(np.einsum("bnts,btnh->bsnh", p, ct))
    return dq, dk, dv


BWD_CASES = [  # (b, t, s, n, kh, h, causal, padding mask)
    (1, 70, 70, 2, 1, 64, True, False),
    (2, 9, 33, 2, 2, 64, False, True),
    (1, 50, 45, 2, 1, 128, False, False),  # t > s; 2 key tiles of 32 in the dQ half
]


@pytest.mark.parametrize("kind", ["bf16", "f16"])
@pytest.mark.parametrize("case", BWD_CASES, ids=lambda c: "b{}t{}s{}n{}kh{}h{}{}{}".format(*c))
def test_backward_on_tensor_cores_matches_float64(kind, case):
    b, t, s, n, kh, h, causal, padded = case
    dtype = _dtype(kind)
    rng = np.random.default_rng(100 + sum(case[:6]))
    q, ct = (rng.standard_normal((b, t, n, h)).astype(dtype) for _ in range(2))
    k, v = (rng.standard_normal((b, s, kh, h)).astype(dtype) for _ in range(2))
    mask = None
    if padded:
        mask = np.arange(s)[None, None, None, :] < (s - 7 * np.arange(b))[:, None, None, None]
        mask = np.broadcast_to(mask, (b, 1, t, s)).copy()
        mask[:, :, 1] = False  # a fully masked query row: its dv share is 1/s, no dq/dk
    kw = {"is_causal": causal} | ({"mask": mask} if padded else {})

    def bwd(q, k, v, ct):
        _, vjp = fflow.vjp(lambda q, k, v: nn.dot_product_attention(q, k, v, **kw), q, k, v)
        return vjp(ct)

    exe = _compile(bwd, q, k, v, ct)
    kerns = exe.plan.kernels
    assert [kern.kind for kern in kerns] == ["attn_fwd", "attn_bwd"]
    assert all("fflow_mma_sync_" + kind in kern.source for kern in kerns)
    assert all("fflow_ldmatrix_sync_x4_trans(" in kern.source for kern in kerns)
    got = exe(*(to_backend(a) for a in (q, k, v, ct)))
    refs = _grads64(q, k, v, ct, _valid(b, t, s, causal, mask))
    tol = 1e-2 if kind == "bf16" else 2e-3  # P and dS are rounded to 16 bits
    for name, g, r in zip("qkv", got, refs):
        g = np.asarray(g, np.float64)
        scale = np.abs(r).max()
        assert np.abs(g - r).max() <= tol * scale, (name, np.abs(g - r).max() / scale)
        assert np.abs(g - r).mean() <= tol / 8 * scale, name


def test_plan_names_the_tensor_core_kernel_and_f32_stays_simt():
    q16 = np.zeros((2, 64, 4, 64), BF16 if BF16 is not None else np.float16)
    q32 = np.zeros((2, 64, 4, 64), np.float32)
    texts = []
    for q in (q16, q32):
        fn = lambda q: fflow.grad(lambda q: nn.dot_product_attention(q, q, q).sum())(q)  # noqa: E731
        prog = cuda_backend._optimize(fflow.make_jaxpr(fn)(q))
        texts.append(cuda_backend.plan_text(cuda_backend.Plan(prog)))
    kind = "bf16" if BF16 is not None else "f16"
    for direction in ("fwd", "bwd"):
        assert f"attention {direction} (tensor cores mma.m16n8k16 {kind})" in texts[0], texts[0]
    assert "tensor cores" not in texts[1] and "SIMT" in texts[1], texts[1]


@pytest.mark.parametrize("h", [64, 128])
def test_full_size_kernels_build_for_sm80_sm90_with_mma(h):
    if not nvrtc_required():
        pytest.skip("libnvrtc does not load here")
    q = np.zeros((8, 512, 16, h), BF16 if BF16 is not None else np.float16)

    def fn(q, k, v):
        return fflow.grad(lambda q: nn.dot_product_attention(q, k, v, is_causal=True).sum())(q)

    prog = cuda_backend._optimize(fflow.make_jaxpr(fn)(q, q, q))
    kerns = [kern for kern in cuda_backend.Plan(prog).kernels if kern.kind.startswith("attn")]
    assert [kern.kind for kern in kerns] == ["attn_fwd", "attn_bwd"]
    for kern in kerns:
        ptx = nvrtc.compile_ptx(kern.source, arch="compute_80").decode()
        assert "mma.sync.aligned.m16n8k16.row.col.f32" in ptx, kern.kind
        # tiles arrive 16 bytes a thread and leave shared memory by ldmatrix
        assert "ld.global.nc.v4.u32" in ptx and "st.shared.v4.u32" in ptx, kern.kind
        assert "ldmatrix.sync.aligned.m8n8.x4.trans.b16" in ptx, kern.kind
        for arch in ("sm_80", "sm_90"):
            assert nvrtc.compile_cubin(kern.source, arch=arch)[:4] == b"\x7fELF"
        # ptxas keeps every fragment and accumulator in registers: no local memory
        (usage,) = nvrtc.resource_usage(kern.source, "sm_90").values()
        assert usage["stack"] == usage["spill_stores"] == usage["spill_loads"] == 0, usage
        assert usage["smem"] <= 48 * 1024, usage


def test_amp_bf16_training_step_runs_attention_on_tensor_cores():
    """f32 parameters under fflow.amp(..., "bf16"): attention sees bf16 operands, so its
    forward and backward both plan the tensor-core kernels."""
    import fflow.numpy as jnp

    def loss(q, k, v):
        return jnp.sum(nn.dot_product_attention(q, k, v, is_causal=True))

    q = np.ones((2, 32, 2, 16), np.float32)
    step = fflow.grad(fflow.amp(loss, "bf16"), argnums=(0, 1, 2))
    text = cuda_backend.plan_text(
        cuda_backend.Plan(cuda_backend._optimize(fflow.make_jaxpr(step)(q, q, q)))
    )
    for direction in ("fwd", "bwd"):
        assert f"attention {direction} (tensor cores mma.m16n8k16 bf16)" in text, text
