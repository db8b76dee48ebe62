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
