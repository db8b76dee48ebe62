"""Multi-head attention over `fflow.nn.dot_product_attention` (JAX's signature).

Example:
    >>> import fflow, fflow.numpy as jnp
    >>> from fflow import nn
    >>> mha = nn.MultiHeadAttention(num_heads=2, query_size=8, key=fflow.random.PRNGKey(0))
    >>> x = jnp.ones((3, 5, 8))                      # (batch, seq, features)
    >>> mha(x, causal=True).shape
    (3, 5, 8)
"""

import fflow.numpy as jnp
from fflow import random
from fflow.errors import user_error
from fflow.nn.functions import dot_product_attention
from fflow.nn.layers import Dropout, Linear
from fflow.nn.module import Module, field


def make_causal_mask(length):
    """(length, length) bool mask, True where a query may attend to a key (key <= query)."""
    return jnp.tril(jnp.ones((length, length), dtype=bool))


def make_padding_mask(valid, num_keys=None):
    """(batch, 1, 1, keys) bool mask from a (batch, keys) bool array of valid positions,
    or from (batch,) lengths with `num_keys`."""
    valid = jnp.asarray(valid)
    if valid.ndim == 1:
        valid = jnp.arange(num_keys)[None, :] < valid[:, None]
    return valid[:, None, None, :]


class MultiHeadAttention(Module):
    """Multi-head attention: project query/key/value, attend per head, project back.

    Args:
        num_heads: number of heads; `qk_size`/`vo_size` (per head) default to
            query_size // num_heads.
        query_size: features of the query; key_size/value_size default to it.
        output_size: features of the output (query_size by default).
        use_bias: biases in the projections.
        dropout_p: dropout on the attention output (before the output projection).
        key: PRNG key.
        qkv_sbp: SBP of the query/key/value weights (`S(1)`: heads split over devices,
            Megatron-style); `out_sbp`: SBP of the output weight (`S(0)` with it).

    Call with `(query, key_=None, value=None, mask=None, *, causal=False,
    padding_mask=None, key=None)`; inputs are (batch, seq, features) or (seq, features);
    `mask` broadcasts to (batch, heads, q_seq, kv_seq) (True = attend).
    """

    query_proj: Linear
    key_proj: Linear
    value_proj: Linear
    output_proj: Linear
    dropout: Dropout
    num_heads: int = field(static=True)
    qk_size: int = field(static=True)
    vo_size: int = field(static=True)

    def __init__(self, num_heads, query_size, key_size=None, value_size=None, output_size=None,
                 qk_size=None, vo_size=None, use_bias=True, dropout_p=0.0, *, key, dtype=None,
                 qkv_sbp=None, out_sbp=None):  # fmt: skip
        key_size = key_size or query_size
        value_size = value_size or query_size
        output_size = output_size or query_size
        qk_size = qk_size or query_size // num_heads
        vo_size = vo_size or query_size // num_heads
        if qk_size * num_heads == 0:
            raise user_error(
                ValueError, f"query_size={query_size} is smaller than num_heads={num_heads}"
            )
        qkey, kkey, vkey, okey = random.split(key, 4)
        h = num_heads
        self.query_proj = Linear(query_size, h * qk_size, use_bias, key=qkey, dtype=dtype,
                                 sbp=qkv_sbp)  # fmt: skip
        self.key_proj = Linear(key_size, h * qk_size, use_bias, key=kkey, dtype=dtype,
                               sbp=qkv_sbp)  # fmt: skip
        self.value_proj = Linear(value_size, h * vo_size, use_bias, key=vkey, dtype=dtype,
                                 sbp=qkv_sbp)  # fmt: skip
        self.output_proj = Linear(h * vo_size, output_size, use_bias, key=okey, dtype=dtype,
                                  sbp=out_sbp)  # fmt: skip
        self.dropout = Dropout(dropout_p)
        self.num_heads, self.qk_size, self.vo_size = h, qk_size, vo_size

    def __call__(self, query, key_=None, value=None, mask=None, *, causal=False,
                 padding_mask=None, key=None, inference=None):  # fmt: skip
        key_ = query if key_ is None else key_
        value = key_ if value is None else value
        q_in, k_in, v_in = (jnp.asarray(a) for a in (query, key_, value))
        unbatched = q_in.ndim == 2
        if unbatched:
            q_in, k_in, v_in = q_in[None], k_in[None], v_in[None]
        b, t = q_in.shape[:2]
        s = k_in.shape[1]
        h = self.num_heads
        q = jnp.reshape(self.query_proj(q_in), (b, t, h, self.qk_size))
        k = jnp.reshape(self.key_proj(k_in), (b, s, h, self.qk_size))
        v = jnp.reshape(self.value_proj(v_in), (b, s, h, self.vo_size))
        if padding_mask is not None:
            pm = make_padding_mask(padding_mask, s)
            mask = pm if mask is None else jnp.logical_and(mask, pm)
        out = dot_product_attention(q, k, v, mask=mask, is_causal=causal)
        out = jnp.reshape(out, (b, t, h * self.vo_size))
        out = self.dropout(out, key=key, inference=inference)
        out = self.output_proj(out)
        return out[0] if unbatched else out
