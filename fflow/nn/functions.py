"""fflow.nn functions: activations, softmax/logsumexp, one_hot, standardize and
attention, with `jax.nn`'s names, defaults and numerics.

Softmax, log_softmax and logsumexp subtract a `stop_gradient`-ed maximum, so large
inputs neither overflow nor give NaN gradients.

Example:
    >>> import fflow.numpy as jnp
    >>> from fflow import nn
    >>> nn.softmax(jnp.array([1000.0, 1000.0])).tolist()
    [0.5, 0.5]
    >>> nn.relu(jnp.array([-1.0, 2.0])).tolist()
    [0.0, 2.0]
"""

import math

import numpy as np

import fflow.numpy as jnp
from fflow import dtypes, lax
from fflow.primitives.attention import dot_product_attention as attention_primitive
from fflow.scipy.special import log_softmax, logsumexp, softmax  # noqa: F401  (jax.nn's names)


def _float(x):
    x = jnp.asarray(x)
    return x if dtypes.is_inexact(x.dtype) else x.astype(dtypes.float_)


def _const(x, value):
    return np.asarray(value, dtype=x.dtype)


# ----------------------------------------------------------------------------
# Activations


def relu(x):
    """max(x, 0); the derivative at 0 is 0 (as in JAX) and NaN stays NaN."""
    x = jnp.asarray(x)
    return jnp.where(x <= 0, jnp.zeros_like(x), x)


def relu6(x):
    """min(max(x, 0), 6); the derivative is 0 at both kinks (as in JAX)."""
    x = jnp.asarray(x)
    zero = jnp.zeros_like(x)
    return jnp.where(x <= 0, zero, jnp.where(x >= 6, jnp.full_like(x, 6), x))


def sigmoid(x):
    """1 / (1 + exp(-x))."""
    return lax.logistic(_float(x))


def log_sigmoid(x):
    """log(sigmoid(x)) = -softplus(-x), stable for large |x|."""
    return -softplus(-_float(x))


def softplus(x):
    """log(1 + exp(x)), stable for large |x|."""
    return jnp.logaddexp(_float(x), 0)


def soft_sign(x):
    x = _float(x)
    return x / (jnp.abs(x) + 1)


def silu(x):
    """x * sigmoid(x) (also called swish)."""
    x = _float(x)
    return x * sigmoid(x)


swish = silu


def gelu(x, approximate=True):
    """Gaussian error linear unit; tanh approximation by default, exact erf form with
    `approximate=False` (both as in JAX)."""
    x = _float(x)
    if approximate:
        c = _const(x, math.sqrt(2 / math.pi))
        cdf = 0.5 * (1.0 + jnp.tanh(c * (x + 0.044715 * (x**3))))
        return x * cdf
    return 0.5 * x * (1.0 + lax.erf(x * _const(x, math.sqrt(0.5))))


def elu(x, alpha=1.0):
    x = _float(x)
    safe = jnp.where(x > 0, jnp.zeros_like(x), x)
    return jnp.where(x > 0, x, alpha * jnp.expm1(safe))


def celu(x, alpha=1.0):
    x = _float(x)
    return jnp.maximum(x, 0.0) + alpha * jnp.expm1(jnp.minimum(x, 0.0) / alpha)


def selu(x):
    alpha = 1.6732632423543772848170429916717
    scale = 1.0507009873554804934193349852946
    return scale * elu(x, alpha)


def leaky_relu(x, negative_slope=0.01):
    x = _float(x)
    return jnp.where(x >= 0, x, negative_slope * x)


def hard_tanh(x):
    x = _float(x)
    return jnp.where(x > 1, jnp.ones_like(x), jnp.where(x < -1, -jnp.ones_like(x), x))


def hard_sigmoid(x):
    return relu6(_float(x) + 3.0) / 6.0


def hard_silu(x):
    x = _float(x)
    return x * hard_sigmoid(x)


hard_swish = hard_silu


def tanh(x):
    return jnp.tanh(x)


def mish(x):
    x = _float(x)
    return x * jnp.tanh(softplus(x))


def squareplus(x, b=4):
    x = _float(x)
    return (x + jnp.sqrt(jnp.square(x) + b)) / 2


def sparse_plus(x):
    x = _float(x)
    return jnp.where(x <= -1.0, 0.0, jnp.where(x >= 1.0, x, (x + 1.0) ** 2 / 4))


def glu(x, axis=-1):
    """Gated linear unit: split `x` in two along `axis`, a * sigmoid(b)."""
    a, b = jnp.split(x, 2, axis=axis)
    return a * sigmoid(b)


def identity(x):
    return jnp.asarray(x)


def sparse_sigmoid(x):
    x = _float(x)
    return 0.5 * jnp.clip(x + 1.0, 0.0, 2.0)


def log1mexp(x):
    """log(1 - exp(-x)) for x > 0, accurate near 0 and for large x."""
    x = _float(x)
    return jnp.where(x > math.log(2), jnp.log1p(-jnp.exp(-x)), jnp.log(-jnp.expm1(-x)))


# ----------------------------------------------------------------------------
# Normalizers


def logmeanexp(x, axis=None, where=None, keepdims=False):
    """log(mean(exp(x))) along `axis`, computed stably."""
    x = _float(x)
    lse = logsumexp(x, axis=axis, keepdims=keepdims, where=where)
    count = jnp.sum(jnp.ones_like(x) if where is None else where, axis=axis, keepdims=keepdims)
    return lse - jnp.log(count.astype(lse.dtype))


def dot_product_attention(
    query,
    key,
    value,
    bias=None,
    mask=None,
    *,
    scale=None,
    is_causal=False,
    query_seq_lengths=None,
    key_value_seq_lengths=None,
    local_window_size=None,
    implementation=None,
):
    """Scaled dot-product attention on [batch, seq, heads, head_dim] inputs (JAX's layout;
    the batch dim may be absent); key/value heads may be fewer (grouped-query attention)."""
    q, k, v = jnp.asarray(query), jnp.asarray(key), jnp.asarray(value)
    unbatched = q.ndim == 3
    if unbatched:
        q, k, v = q[None], k[None], v[None]
    b, t, n, h = q.shape
    s, kn = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(h) if scale is None else scale
    if bias is None and local_window_size is None and query_seq_lengths is None:
        # the fused primitive (one flash kernel per direction on CUDA)
        out = _fused_attention(q, k, v, mask, unbatched, scale, is_causal, key_value_seq_lengths)
        if out is not None:
            return out[0] if unbatched else out
    if n != kn:
        # grouped-query attention: each key/value head serves n // kn query heads
        q = jnp.reshape(q, (b, t, kn, n // kn, h))
        logits = jnp.einsum("btkgh,bskh->bkgts", q, k)
        logits = jnp.reshape(logits, (b, n, t, s))
    else:
        logits = jnp.einsum("btnh,bsnh->bnts", q, k)
    logits = logits * np.asarray(scale, logits.dtype)
    if bias is not None:
        bias = jnp.asarray(bias)
        logits = logits + (bias[None] if unbatched and bias.ndim == 3 else bias)
    big_neg = np.asarray(-0.7 * float(dtypes.finfo(logits.dtype).max), logits.dtype)
    if mask is not None:
        mask = jnp.asarray(mask)
        logits = jnp.where(mask[None] if unbatched and mask.ndim == 3 else mask, logits, big_neg)
    if is_causal:
        causal = np.tril(np.ones((t, s), dtype=bool))  # JAX: key j <= query i
        logits = jnp.where(causal, logits, big_neg)
    if key_value_seq_lengths is not None:
        valid = jnp.arange(s)[None, :] < jnp.asarray(key_value_seq_lengths)[:, None]
        logits = jnp.where(valid[:, None, None, :], logits, big_neg)
    probs = softmax(logits.astype(np.float32), axis=-1).astype(v.dtype)
    if n != kn:
        probs = jnp.reshape(probs, (b, kn, n // kn, t, s))
        out = jnp.einsum("bkgts,bskh->btkgh", probs, v)
        out = jnp.reshape(out, (b, t, n, v.shape[-1]))
    else:
        out = jnp.einsum("bnts,bsnh->btnh", probs, v)
    return out[0] if unbatched else out


def _fused_attention(q, k, v, mask, unbatched, scale, is_causal, kv_lengths):
    """`dot_product_attention_p` on [B, T, N, H] operands, or None for inputs it does not
    take (integer operands)."""
    dtype = jnp.result_type(q, k, v)
    if not dtypes.is_inexact(dtype):
        return None
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    b, t, n, _ = q.shape
    s = k.shape[1]
    if mask is not None:
        mask = jnp.asarray(mask, dtype=bool)
        if unbatched and mask.ndim == 3:
            mask = mask[None]
        mask = jnp.reshape(mask, (1,) * (4 - mask.ndim) + mask.shape)
    if kv_lengths is not None:
        valid = jnp.arange(s)[None, :] < jnp.asarray(kv_lengths)[:, None]
        valid = valid[:, None, None, :]
        mask = valid if mask is None else jnp.logical_and(mask, valid)
    if mask is not None:
        want = (b, n, t, s)
        shape = tuple(m if m == 1 and i < 3 else want[i] for i, m in enumerate(mask.shape))
        mask = jnp.broadcast_to(mask, shape)
    return attention_primitive(q, k, v, mask, scale=scale, causal=is_causal)


def standardize(x, axis=-1, mean=None, variance=None, epsilon=1e-5, where=None):
    """(x - mean) / sqrt(variance + epsilon) along `axis`."""
    x = _float(x)
    if mean is None:
        mean = jnp.mean(x, axis=axis, keepdims=True, where=where)
    if variance is None:
        variance = jnp.mean(jnp.square(x), axis=axis, keepdims=True, where=where) - jnp.square(mean)
    return (x - mean) * lax.rsqrt(jnp.asarray(variance + epsilon, x.dtype))


normalize = standardize


def one_hot(x, num_classes, *, dtype=None, axis=-1):
    """One-hot encoding: `out[..., c] = (x == c)` (float32 by default); values outside
    [0, num_classes) give all zeros.

    Example:
        >>> import fflow.numpy as jnp
        >>> from fflow import nn
        >>> nn.one_hot(jnp.array([0, 2]), 3).tolist()
        [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]
    """
    dtype = dtypes.float_ if dtype is None else dtypes.canonicalize(dtype)
    x = jnp.asarray(x)
    out_ndim = x.ndim + 1
    pos = int(axis) % out_ndim
    lhs = jnp.expand_dims(x, pos)
    shape = [1] * out_ndim
    shape[pos] = int(num_classes)
    rhs = jnp.reshape(jnp.arange(int(num_classes), dtype=x.dtype), shape)
    return jnp.equal(lhs, rhs).astype(dtype)
