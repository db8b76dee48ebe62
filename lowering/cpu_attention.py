"""`dot_product_attention` and its backward on the CPU: batched GEMMs over views.

The references in primitives/attention.py spell each product as `np.einsum`, which
NumPy runs in its own loops, not BLAS. Here every product is one batched matmul over
transposed views of the [B, T, N, H] operands (no copies; batch (B, N) and the
transposes go to fflow's GEMM pool, lowering/cpu_gemm.c, as strides and BLAS flags),
and the softmax runs in place on the one [B, N, T, S] buffer. The backward
recomputes the probabilities and uses rowsum(dP * P) = rowsum(dO * O), as flash
attention does.

With a C compiler (lowering/native.py) the row work between the GEMMs is one C loop
per row: forward scale + mask + softmax + lse in place (was 6 NumPy passes), backward
P = exp(S·scale - lse) and dS = P·(dP - rowsum)·scale (was 8); a fully masked row is
the uniform average, as in the reference.

float32 and float64 take this path; bf16/fp16 operands (amp) too, as float32 copies
(the reference also computes in float32), each result rounded back once.
"""

import ctypes
import weakref

import numpy as np
from fflow.lowering import cpu_casts, cpu_gemm, native
from fflow.primitives.attention import BIG_NEG, attention_bwd_p, attention_p

from fflow import threads

_FAST = (np.dtype(np.float32), np.dtype(np.float64))
_LOW = ("bfloat16", "float16")  # by name: ml_dtypes (bf16) is an optional extra


def _low(*xs):
    """Whether the operands are all one 16-bit float dtype (computed in float32)."""
    return all(x.dtype == xs[0].dtype for x in xs) and xs[0].dtype.name in _LOW


def _up(x):
    return cpu_casts.cast(x, np.float32)


_ROWS_C = """#include <math.h>
#pragma omp declare simd notinbranch
{t} {exp}({t});
static int ok(const unsigned char* bad, long r, long j, long n, long t, int causal) {{
  return !(bad && bad[r * n + j]) && !(causal && j > r % t);
}}
static int any_ok(const unsigned char* bad, long r, long n, long t, int causal) {{
  if (!bad) return 1;
  for (long j = 0; j < n; j++) if (ok(bad, r, j, n, t, causal)) return 1;
  return 0;
}}
void fflow_attn_rows_fwd({t}* x, const unsigned char* bad, {t}* lse, long rows, long n,
                         long t, int causal, {t} scale, {t} big) {{
  for (long r = 0; r < rows; r++) {{
    {t}* xr = x + r * n;
    const long end = causal && r % t + 1 < n ? r % t + 1 : n;  /* keys after it: masked */
    {t} mx = -INFINITY; int nan = 0;
    if (bad) {{
      const unsigned char* br = bad + r * n;
      for (long j = 0; j < end; j++) xr[j] = br[j] ? big : xr[j] * scale;
    }} else {{
      #pragma omp simd
      for (long j = 0; j < end; j++) xr[j] *= scale;
    }}
    for (long j = end; j < n; j++) xr[j] = big;
    #pragma omp simd reduction(max:mx) reduction(|:nan)
    for (long j = 0; j < n; j++) {{ mx = xr[j] > mx ? xr[j] : mx; nan |= xr[j] != xr[j]; }}
    if (nan) mx = NAN;
    {t} sum = 0;
    #pragma omp simd reduction(+:sum)
    for (long j = 0; j < n; j++) {{ {t} e = {exp}(xr[j] - mx); xr[j] = e; sum += e; }}
    #pragma omp simd
    for (long j = 0; j < n; j++) xr[j] = xr[j] / sum;
    lse[r] = mx + log(sum);
  }}
}}
void fflow_attn_rows_bwd({t}* x, {t}* dp, const unsigned char* bad, const {t}* lse,
                         const {t}* row, long rows, long n, long t, int causal, {t} scale,
                         int have_p) {{
  for (long r = 0; r < rows; r++) {{
    {t}* xr = x + r * n; {t}* dr = dp + r * n;
    const int uniform = !any_ok(bad, r, n, t, causal);
    const {t} l = lse[r];
    {t} d = row ? row[r] : 0;
    if (!have_p)
      for (long j = 0; j < n; j++)
        xr[j] = uniform ? 1 / ({t})n : (ok(bad, r, j, n, t, causal) ? {exp}(xr[j] * scale - l) : 0);
    if (!row) {{
      #pragma omp simd reduction(+:d)
      for (long j = 0; j < n; j++) d += xr[j] * dr[j];
    }}
    for (long j = 0; j < n; j++)
      dr[j] = ok(bad, r, j, n, t, causal) ? xr[j] * (dr[j] - d) * scale : 0;
  }}
}}
"""
_rows_cache = {}


def _rows(dtype):
    """The (forward, backward) C row loops for float32/float64, or None (no compiler)."""
    if dtype not in _rows_cache:
        fns = None
        if native.enabled():
            t, exp = ("float", "expf") if dtype == np.float32 else ("double", "exp")
            lib = native.load_library(_ROWS_C.format(t=t, exp=exp))
            if lib is not None:
                fns = (lib.fflow_attn_rows_fwd, lib.fflow_attn_rows_bwd)
                real = ctypes.c_float if dtype == np.float32 else ctypes.c_double
                ptr, long_, int_ = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
                fns[0].argtypes = [ptr] * 3 + [long_] * 3 + [int_, real, real]
                fns[1].argtypes = [ptr] * 5 + [long_] * 3 + [int_, real, int_]
                for fn in fns:
                    fn.restype = None
        _rows_cache[dtype] = fns
    return _rows_cache[dtype]


def _bad_rows(mask, shape):
    """Where the caller's mask says no, as a contiguous uint8 [B, N, T, S] buffer."""
    if mask is None:
        return None
    return np.ascontiguousarray(np.broadcast_to(~np.asarray(mask, bool), shape)).view(np.uint8)


def _ptr(x):
    return None if x is None else x.ctypes.data


# lse array -> (P, key): the forward's probabilities, kept for the backward of the same
# call while its lse (the residual) lives. The CPU has the memory a GPU lacks: reading P
# back saves recomputing q·kᵀ and the exps (the hand-written softmax keeps P too).
_saved = {}  # id(lse) -> (weakref to lse, P, key)


def _save(lse, p, key):
    i = id(lse)
    _saved[i] = (weakref.ref(lse, lambda _: _saved.pop(i, None)), p, key)


def _take(lse):
    entry = _saved.pop(id(lse), None)
    if entry is None or entry[0]() is not lse:
        return None
    return entry[1:]


def _key(q, k, scale, causal, mask):
    return (q.shape, k.shape, float(scale), bool(causal), None if mask is None else mask.shape)


def _forward_c(fwd, q, k, v, mask, scale, causal, nt):
    n, t, s = q.shape[2], q.shape[1], k.shape[1]
    x = _mm(q.transpose(0, 2, 1, 3), _heads(k, n).transpose(0, 2, 3, 1), nt)  # [B, N, T, S]
    bad = _bad_rows(mask, x.shape)
    lse = np.empty(x.shape[:3], x.dtype)
    fwd(_ptr(x), _ptr(bad), _ptr(lse), x.size // s, s, t, int(causal), scale, BIG_NEG)
    out = _mm(x, _heads(v, n).transpose(0, 2, 1, 3), nt)  # [B, N, T, Hv]
    _save(lse, x, _key(q, k, scale, causal, mask))
    return [np.ascontiguousarray(out.transpose(0, 2, 1, 3)), lse]


def _backward_c(bwd, q, k, v, mask, out, lse, ct, scale, causal, nt):
    n, t, s = q.shape[2], q.shape[1], k.shape[1]
    saved = _take(lse)
    have_p = saved is not None and saved[1] == _key(q, k, scale, causal, mask)
    if have_p:
        x = saved[0]
    else:
        x = _mm(q.transpose(0, 2, 1, 3), _heads(k, n).transpose(0, 2, 3, 1), nt)  # S, then P
    ct_t = ct.transpose(0, 2, 1, 3)  # [B, N, T, Hv]
    dp = _mm(ct_t, _heads(v, n).transpose(0, 2, 3, 1), nt)  # dP, then dS·scale
    row = None
    if out is not None:
        out = out.astype(ct.dtype, copy=False)
        row = np.ascontiguousarray(np.einsum("btnh,btnh->bnt", ct, out))
    lse = np.ascontiguousarray(lse, x.dtype)
    bad = _bad_rows(mask, x.shape)
    bwd(_ptr(x), _ptr(dp), _ptr(bad), _ptr(lse), _ptr(row), x.size // s, s, t, int(causal),
        scale, int(have_p))  # fmt: skip
    dq = _mm(dp, _heads(k, n).transpose(0, 2, 1, 3), nt)
    dk = _mm(dp.transpose(0, 1, 3, 2), q.transpose(0, 2, 1, 3), nt)
    dv = _mm(x.transpose(0, 1, 3, 2), ct_t, nt)
    return dq, dk, dv


def _mm(a, b, nt):
    """a @ b by the size rules of numpy_rows.emit_dot: NumPy's matmul for small products
    (the pool's job costs more than they do), one thread below SMALL_GEMM_FLOPS."""
    out = np.empty(a.shape[:-1] + b.shape[-1:], a.dtype)
    flops = 2.0 * out.size * a.shape[-1]
    if flops < cpu_gemm.OWN_KERNEL_MIN_FLOPS:
        return np.matmul(a, b, out=out)
    return cpu_gemm.matmul(a, b, out, nt if flops >= threads.SMALL_GEMM_FLOPS else 1)


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
    fns = _rows(q.dtype)
    if fns is not None:
        return _forward_c(fns[0], q, k, v, mask, scale, causal, nt)
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
    fns = _rows(q.dtype)
    if fns is not None:
        dq, dk, dv = _backward_c(fns[1], q, k, v, mask, out, lse, ct, scale, causal, nt)
        return _finish(dq, dk, dv, q.shape[0], s, n, kh)
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
        row = np.einsum("btnh,btnh->bnt", ct, out.astype(ct.dtype, copy=False))[..., None]
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
    return _finish(dq, dk, dv, q.shape[0], s, n, kh)


def _finish(dq, dk, dv, b, s, n, kh):
    """[B, N, *, h] products -> [B, *, N|K, h] gradients (key/value heads summed)."""
    dq, dk, dv = (x.transpose(0, 2, 1, 3) for x in (dq, dk, dv))  # [B, *, N, h]
    if kh != n:
        dk = dk.reshape(b, s, kh, n // kh, -1).sum(3)
        dv = dv.reshape(b, s, kh, n // kh, -1).sum(3)
    return [np.ascontiguousarray(x) for x in (dq, dk, dv)]


__all__ = ["forward", "backward"]
