"""dot_product_attention on the CPU backend (lowering/cpu_attention.py: batched GEMMs
over views, softmax in place, flash-style backward) against float64 NumPy."""

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp


def reference(q, k, v, mask, causal, scale):
    """Attention in float64: softmax(q k^T * scale, masked) v, grouped-query heads."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    n, kh = q.shape[2], k.shape[2]
    k, v = np.repeat(k, n // kh, axis=2), np.repeat(v, n // kh, axis=2)
    logits = np.einsum("btnh,bsnh->bnts", q, k) * scale
    valid = np.ones(logits.shape[-2:], bool) if mask is None else mask
    if causal:
        valid = valid & np.tril(np.ones(logits.shape[-2:], bool))
    logits = np.where(valid, logits, -0.7 * float(np.finfo(np.float32).max))
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bnts,bsnh->btnh", p, v)


def numeric_grads(q, k, v, mask, causal, scale, w):
    # d/dx sum(w * attention) in float64 by central differences along random directions
    def f(q, k, v):
        return float(np.sum(w * reference(q, k, v, mask, causal, scale)))

    rng = np.random.default_rng(7)
    out = []
    for which in range(3):
        args = [np.asarray(x, np.float64) for x in (q, k, v)]
        d = rng.normal(size=args[which].shape)
        plus, minus = list(args), list(args)
        plus[which] = args[which] + 1e-5 * d
        minus[which] = args[which] - 1e-5 * d
        out.append((d, (f(*plus) - f(*minus)) / 2e-5))
    return out


@pytest.mark.parametrize(
    "heads, kv_heads, causal, masked, threads",
    [(4, 4, False, False, 1), (4, 2, True, False, 2), (2, 2, False, True, 2)],
)
def test_attention_and_its_gradient_match_float64(heads, kv_heads, causal, masked, threads):
    rng = np.random.default_rng(heads + 3 * kv_heads + causal)
    b, t, s, h = 2, 24, 24, 16
    q = rng.normal(size=(b, t, heads, h)).astype(np.float32)
    k = rng.normal(size=(b, s, kv_heads, h)).astype(np.float32)
    v = rng.normal(size=(b, s, kv_heads, h)).astype(np.float32)
    w = rng.normal(size=(b, t, heads, h)).astype(np.float32)
    mask = rng.random((b, 1, t, s)) > 0.3 if masked else None
    if masked:
        mask[0, 0, 3] = False  # a fully masked row averages every key, as in JAX
    scale = h**-0.5

    def f(q, k, v):
        return fflow.nn.dot_product_attention(q, k, v, mask=mask, is_causal=causal)

    def loss(q, k, v):
        return jnp.sum(w * f(q, k, v))

    fflow.config.update("blas_threads", threads)
    try:
        lowered = fflow.jit(fflow.grad(loss, argnums=(0, 1, 2))).lower(q, k, v)
        assert "attn" in lowered.as_text() and "impl_attention_bwd" not in lowered.as_text()
        out = fflow.jit(f)(q, k, v)
        grads = lowered.compile()(q, k, v)
    finally:
        fflow.config.update("blas_threads", 0)
    np.testing.assert_allclose(out, reference(q, k, v, mask, causal, scale), rtol=1e-4, atol=1e-5)
    for g, (d, want) in zip(grads, numeric_grads(q, k, v, mask, causal, scale, w)):
        got = float(np.sum(np.asarray(g, np.float64) * d))
        assert abs(got - want) <= 2e-3 * max(1.0, abs(want)), (got, want)
