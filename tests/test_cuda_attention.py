"""dot_product_attention as one primitive: its NumPy reference and rules against JAX
(forward, grads, jvp, vmap of grad) and against a float64 formula written here; on the
CUDA backend one fused kernel per direction, run through NVRTC + the host shim."""

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp
from fflow import nn


def _np64(q, k, v, mask=None, causal=False):
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    n = q.shape[2]
    k, v = np.repeat(k, n // k.shape[2], 2), np.repeat(v, n // v.shape[2], 2)
    logits = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
    valid = np.ones(logits.shape, bool)
    if mask is not None:
        valid &= mask
    if causal:
        valid &= np.tril(np.ones(logits.shape[-2:], bool))
    logits = np.where(valid, logits, -1e300)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    return np.einsum("bnts,bsnh->btnh", p / p.sum(-1, keepdims=True), v)


def _case(seed=0, b=2, t=5, s=7, n=4, kh=2, h=8):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, t, n, h)).astype(np.float32)
    k = rng.standard_normal((b, s, kh, h)).astype(np.float32)
    v = rng.standard_normal((b, s, kh, h)).astype(np.float32)
    mask = rng.random((b, 1, t, s)) < 0.7
    mask[..., 0] = True  # no fully masked row (the float64 formula's -1e300 differs there)
    return q, k, v, mask


KWARGS = [{}, {"is_causal": True}, {"mask": True}, {"mask": True, "is_causal": True}]


@pytest.mark.parametrize("kw", KWARGS, ids=lambda kw: "-".join(kw) or "plain")
def test_forward_matches_float64_formula(kw):
    q, k, v, mask = _case()
    kw = {**kw, "mask": mask} if "mask" in kw else kw
    out = nn.dot_product_attention(q, k, v, **kw)
    ref = _np64(q, k, v, kw.get("mask"), kw.get("is_causal", False))
    np.testing.assert_allclose(np.asarray(out), ref, rtol=2e-5, atol=2e-6)


def test_is_one_primitive_and_grad_is_one_backward_primitive():
    q, k, v, mask = _case()

    def loss(q, k, v):
        return jnp.sum(nn.dot_product_attention(q, k, v, mask=mask))

    fwd = str(fflow.make_jaxpr(loss)(q, k, v))
    assert fwd.count("dot_product_attention[") == 1 and "exp" not in fwd, fwd
    bwd = str(fflow.make_jaxpr(fflow.grad(loss, argnums=(0, 1, 2)))(q, k, v))
    assert bwd.count("attention_bwd[") == 1 and "dot_general" not in bwd, bwd


@pytest.mark.parametrize("kw", KWARGS[1:], ids=lambda kw: "-".join(kw))
def test_grads_jvp_vmap_match_jax(kw):
    jax = pytest.importorskip("jax")
    q, k, v, mask = _case(1)
    kw = {**kw, "mask": mask} if "mask" in kw else kw

    def f(q, k, v):
        return jnp.sum(jnp.sin(nn.dot_product_attention(q, k, v, **kw)))

    def jf(q, k, v):
        return jax.numpy.sum(jax.numpy.sin(jax.nn.dot_product_attention(q, k, v, **kw)))

    ours = fflow.jit(fflow.grad(f, argnums=(0, 1, 2)))(q, k, v)
    theirs = jax.grad(jf, argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    t = fflow.jvp(f, (q, k, v), (k[:, :5].repeat(2, 2), v, k))[1]
    jt = jax.jvp(jf, (q, k, v), (k[:, :5].repeat(2, 2), v, k))[1]
    np.testing.assert_allclose(float(t), float(jt), rtol=1e-4)
    qs = np.stack([q, 2 * q])
    vg = fflow.vmap(fflow.grad(f, argnums=(0, 1)), in_axes=(0, None, None))(qs, k, v)
    jvg = jax.vmap(jax.grad(jf, argnums=(0, 1)), in_axes=(0, None, None))(qs, k, v)
    for a, b in zip(vg, jvg):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def test_bad_mask_names_the_fix():
    q, k, v, _ = _case()
    with pytest.raises(Exception, match="broadcast|mask"):
        nn.dot_product_attention(q, k, v, mask=np.ones((3, 1, 5, 7), bool))


# -- CUDA: the fused kernels through NVRTC + the host shim --------------------------------
def _fwd_bwd(kw):
    def fn(q, k, v, ct):
        out, vjp = fflow.vjp(lambda q, k, v: nn.dot_product_attention(q, k, v, **kw), q, k, v)
        return (out, *vjp(ct))

    return fn


SHIM_CASES = [
    # (label, b, t, s, n, kh, h, dtype, kwargs): odd sizes cross tile edges
    ("f32 gqa", 2, 5, 7, 4, 2, 8, np.float32, {}),
    ("f32 causal 2 tiles", 1, 37, 45, 2, 1, 8, np.float32, {"is_causal": True}),
    ("f32 mask+causal, a fully masked row", 1, 37, 45, 2, 2, 8, np.float32, "mask"),
    ("f64 mask", 1, 9, 11, 2, 2, 5, np.float64, "mask"),
    ("bf16 causal", 2, 17, 17, 2, 2, 16, "bfloat16", {"is_causal": True}),
    ("f16 tq>ts", 1, 12, 6, 1, 1, 8, np.float16, {"is_causal": True}),
]


def test_fused_kernels_match_the_reference_through_the_shim():
    from cuda_harness import BF16, run_cases

    rng = np.random.default_rng(3)
    cases = []
    for label, b, t, s, n, kh, h, dtype, kw in SHIM_CASES:
        dtype = BF16 if dtype == "bfloat16" else np.dtype(dtype)
        if dtype is None:
            continue
        q, ct = (rng.standard_normal((b, t, n, h)).astype(dtype) for _ in range(2))
        k, v = (rng.standard_normal((b, s, kh, h)).astype(dtype) for _ in range(2))
        if kw == "mask":
            mask = rng.random((b, 1, t, s)) < 0.6
            mask[0, 0, 1] = False  # JAX: a fully masked row averages every key
            kw = {"mask": mask, "is_causal": True}
        cases.append((label, _fwd_bwd(kw), [q, k, v, ct]))
    built = run_cases(cases)
    for label, exe, _, _ in built:
        names = [k.name for k in exe.plan.kernels]
        assert len(names) == 2 and "attn_fwd" in names[0] and "attn_bwd" in names[1], label


def test_launch_plan_has_one_kernel_per_direction_and_no_scores_tensor():
    from fflow.lowering import cuda_backend

    q, k, v, mask = _case(b=2, t=64, s=96, n=4, kh=4, h=16)
    ct = np.ones(q.shape, np.float32)
    prog = cuda_backend._optimize(fflow.make_jaxpr(_fwd_bwd({"mask": mask}))(q, k, v, ct))
    plan = cuda_backend.Plan(prog)
    text = cuda_backend.plan_text(plan)
    launches = [ln for ln in text.splitlines() if ln[:3].strip().isdigit()]
    assert len(launches) == 2, text
    assert "fused dot_product_attention" in launches[0] and "fused attention_bwd" in launches[1]
    # the only [.., 64, 96] value is the caller's bool mask: scores stay in shared memory
    assert "f32[2,4,64,96]" not in text and "[2,4,64,96]" not in text, text


@pytest.mark.parametrize("h", [64, 128, 256])
def test_full_size_kernels_build_with_nvrtc(h):
    """The H200-size shapes (b8 s512 16 heads, bf16) build for sm_90: tiles fit 48 KB."""
    from cuda_harness import BF16, nvrtc_required
    from fflow.lowering import cuda_backend, nvrtc

    if not nvrtc_required():
        pytest.skip("libnvrtc does not load here")
    q = np.zeros((8, 512, 16, h), BF16)
    prog = cuda_backend._optimize(fflow.make_jaxpr(_fwd_bwd({"is_causal": True}))(q, q, q, q))
    kernels = cuda_backend.Plan(prog).kernels
    assert [k.kind for k in kernels] == ["attn_fwd", "attn_bwd"]
    assert nvrtc.compile_cubin("\n".join(k.source for k in kernels))[:4] == b"\x7fELF"
