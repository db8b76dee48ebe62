"""`dot_product_attention` and its backward on the CPU: batched GEMMs over views.

The references in primitives/attention.py spell each product as `np.einsum`, which
NumPy runs in its own loops, not BLAS. Here every product is one batched matmul over
transposed views of the [B, T, N, H] operands (no copies; batch (B, N) and the
transposes go to fflow's GEMM pool, lowering/cpu_gemm.c, as strides and BLAS flags),
and the softmax runs in place on the one [B, N, T, S] buffer. The backward
recomputes the probabilities and uses rowsum(dP * P) = rowsum(dO * O), as flash
attention does.

float32 and float64 take this path; bf16/fp16 operands (amp) too, as float32 copies
(the reference also computes in float32), each result rounded back once.
"""

import numpy as np
from fflow.lowering import cpu_casts, cpu_gemm
from fflow.primitives.attention import BIG_NEG, attention_bwd_p, attention_p

_FAST = (np.dtype(np.float32), np.dtype(np.float64))
_LOW = ("bfloat16", "float16")  # by name: ml_dtypes (bf16) is an optional extra


def _low(*xs):
    """Whether the operands are all one 16-bit float dtype (computed in float32)."""
    return all(x.dtype == xs[0].dtype for x in xs) and xs[0].dtype.name in _LOW


def _up(x):
    return cpu_casts.cast(x, np.float32)


def _mm(a, b, nt):
    out = np.empty(a.shape[:-1] + b.shape[-1:], a.dtype)
    return cpu_gemm.matmul(a, b, out, nt)


def _heads(x, n):
    # [B, S, K, h] -> [B, S, N, h] for grouped-query attention (K divides N)
    return x if x.shape[2] == n else np.repeat(x, n // x.shape[2], axis=2)


def _invalid(mask, causal, t, s):
    """Where logits are masked ([B|1, N|1, T|1, S] bool, True = masked), or None."""
    bad = None if mask is None else ~np.asarray(mask, bool)
    if causal:
        upper = ~np.tril(np.ones((t, s), bool))
        bad = upper if bad is None else bad | upper
    return bad


def _logits(q, k, scale, bad, nt):
    n = q.shape[2]
    x = _mm(q.transpose(0, 2, 1, 3), _heads(k, n).transpose(0, 2, 3, 1), nt)
    x *= x.dtype.type(scale)
    if bad is not None:
        np.copyto(x, x.dtype.type(BIG_NEG), where=bad)
    return x


def _probs(q, k, scale, bad, nt):
    """(softmax probabilities [B, N, T, S] (one buffer), row max, row sum)."""
    p = _logits(q, k, scale, bad, nt)
    m = p.max(-1, keepdims=True)
    p -= m
    np.exp(p, out=p)
    z = p.sum(-1, keepdims=True)
    p /= z
    return p, m, z


def forward(q, k, v, *rest, scale, causal, has_mask, nt=1):
    """[out [B, T, N, Hv], lse [B, N, T]], as `dot_product_attention`'s reference."""
    if _low(q, k, v):
        out, lse = forward(_up(q), _up(k), _up(v), *rest, scale=scale, causal=causal,
                           has_mask=has_mask, nt=nt)  # fmt: skip
        return [cpu_casts.cast(out, v.dtype), lse]
    if not (q.dtype == k.dtype == v.dtype and q.dtype in _FAST):
        return attention_p.impl(q, k, v, *rest, scale=scale, causal=causal, has_mask=has_mask)
    mask = rest[0] if has_mask else None
    n, t, s = q.shape[2], q.shape[1], k.shape[1]
    p, m, z = _probs(q, k, scale, _invalid(mask, causal, t, s), nt)
    out = _mm(p, _heads(v, n).transpose(0, 2, 1, 3), nt)  # [B, N, T, Hv]
    lse = (m + np.log(z))[..., 0]
    return [np.ascontiguousarray(out.transpose(0, 2, 1, 3)), lse]


def backward(q, k, v, *rest, scale, causal, has_mask, nt=1):
    """[dq, dk, dv], as `attention_bwd`'s reference (args: q, k, v, [mask], out, lse, ct)."""
    mask = rest[0] if has_mask else None
    out, lse, ct = rest[has_mask:]
    if _low(q, k, v, ct):
        # out=None: rowsum(dP * P) from the float32 products, not from the rounded out
        args = (*(_up(x) for x in (q, k, v)), *rest[:has_mask], None, lse, _up(ct))
        grads = backward(*args, scale=scale, causal=causal, has_mask=has_mask, nt=nt)
        return [cpu_casts.cast(g, x.dtype) for g, x in zip(grads, (q, k, v))]
    if not (q.dtype == k.dtype == v.dtype == ct.dtype and q.dtype in _FAST):
        return attention_bwd_p.impl(q, k, v, *rest, scale=scale, causal=causal, has_mask=has_mask)
    n, kh, t, s = q.shape[2], k.shape[2], q.shape[1], k.shape[1]
    bad = _invalid(mask, causal, t, s)
    # recomputed with its own row max, not from lse: a fully masked row's lse
    # (-0.7 * float32 max + log S) rounds to the masked logit itself
    p, _, _ = _probs(q, k, scale, bad, nt)
    ct_t = ct.transpose(0, 2, 1, 3)  # [B, N, T, Hv]
    vv = _heads(v, n)
    ds = _mm(ct_t, vv.transpose(0, 2, 3, 1), nt)  # dP [B, N, T, S]
    if out is None:
        row = np.sum(ds * p, axis=-1, keepdims=True)
    else:
        row = np.einsum("btnh,btnh->bnt", ct, out.astype(ct.dtype))[..., None]
    ds -= row
    ds *= p
    if bad is not None:
        np.copyto(ds, 0, where=bad)
    c = q.dtype.type(scale)
    dq = _mm(ds, _heads(k, n).transpose(0, 2, 1, 3), nt)
    dq *= c
    ds_t = ds.transpose(0, 1, 3, 2)  # [B, N, S, T]
    dk = _mm(ds_t, q.transpose(0, 2, 1, 3), nt)
    dk *= c
    dv = _mm(p.transpose(0, 1, 3, 2), ct_t, nt)
    dq, dk, dv = (x.transpose(0, 2, 1, 3) for x in (dq, dk, dv))  # [B, *, N, h]
    if kh != n:
        b = q.shape[0]
        dk = dk.reshape(b, s, kh, n // kh, -1).sum(3)
        dv = dv.reshape(b, s, kh, n // kh, -1).sum(3)
    return [np.ascontiguousarray(x) for x in (dq, dk, dv)]


__all__ = ["forward", "backward"]
