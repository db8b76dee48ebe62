"""`dot_product_attention`: softmax(q·kᵀ·scale, masked) · v as one primitive.

Layout is JAX's: q [B, T, N, H], k [B, S, K, H], v [B, S, K, Hv] with K dividing N
(grouped-query attention: query head n reads key/value head n // (N // K)); an
optional bool `mask` of shape [B|1, N|1, T|1, S] (True = attend); `causal` masks
key j > query i (JAX's top-left tril). Masked logits take JAX's value
-0.7·finfo(float32).max, so a fully masked row averages every key, as in JAX.

Three primitives, so that reverse mode needs no [T, S] tensor outside the kernels:

* `dot_product_attention` -> (out, lse): lse (log-sum-exp per query row, fp32) is the
  residual the backward kernel needs; its tangent is zero (the public function never
  returns it).
* `attention_jvp`(q, k, v, [mask], out, lse, q_dot, k_dot, v_dot) -> out_dot: linear in
  the three tangents; its transpose is
* `attention_bwd`(q, k, v, [mask], out, lse, ct) -> (dq, dk, dv): the flash backward.

Second derivatives differentiate the same math written as a composite of primitives
(`_composite`: the derivative of `attention_jvp`/`attention_bwd` is the JVP of the
composite's JVP/VJP), so `hessian` of a program holding the fused primitive works. On
CUDA each of the three is one fused kernel (lowering/cuda_attention.py); elsewhere the
NumPy references below run.
"""

import numpy as np
from fflow.transforms import vmap as vm
from fflow.transforms.autodiff import (
    Zero,
    instantiate,
    jvp_flat,
    jvp_rules,
    tangent_aval,
    transpose_rules,
    vjp_flat,
)
from fflow.transforms.shard_rules import Sig, def_sbp

from fflow import dtypes
from fflow import lax_ops as lax
from fflow.core import Primitive, ShapedArray
from fflow.errors import DtypeError, ShapeError, user_error
from fflow.sbp import B, S

attention_p = Primitive("dot_product_attention", multiple_results=True)
attention_p.amp_class = "low"  # bf16/fp16 operands, fp32 accumulation inside the kernel
attention_jvp_p = Primitive("attention_jvp")
attention_jvp_p.amp_class = "keep"  # its operands come from the (already cast) forward
attention_jvp_p.traits.add("linear_in_tangents")
attention_bwd_p = Primitive("attention_bwd", multiple_results=True)
attention_bwd_p.amp_class = "keep"

BIG_NEG = -0.7 * float(np.finfo(np.float32).max)


# -- NumPy references ---------------------------------------------------------------------
def _compute_dtype(*xs):
    return np.float64 if any(np.dtype(x.dtype) == np.float64 for x in xs) else np.float32


def _heads(x, n):
    """[B, S, K, h] -> [B, S, N, h]: each key/value head repeated for its query heads."""
    return np.repeat(x, n // x.shape[2], axis=2)


def _valid(mask, causal, t, s):
    valid = None if mask is None else np.asarray(mask, bool)
    if causal:
        tri = np.tril(np.ones((t, s), bool))
        valid = tri if valid is None else valid & tri
    return valid


# The products as batched matmuls over transposed views (BLAS; np.einsum runs these in
# its own loops, 5-10x slower, which eager code and grad(jit(f)) would pay):
def _scores(a, b):
    """[B, T, N, h] x [B, S, N, h] -> [B, N, T, S] (einsum btnh,bsnh->bnts)."""
    return np.matmul(a.transpose(0, 2, 1, 3), b.transpose(0, 2, 3, 1))


def _apply(p, x):
    """[B, N, T, S] x [B, S, N, h] -> [B, T, N, h] (einsum bnts,bsnh->btnh)."""
    return np.ascontiguousarray(np.matmul(p, x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3))


def _apply_t(p, x):
    """[B, N, T, S] x [B, T, N, h] -> [B, S, N, h] (einsum bnts,btnh->bsnh)."""
    out = np.matmul(p.transpose(0, 1, 3, 2), x.transpose(0, 2, 1, 3))
    return np.ascontiguousarray(out.transpose(0, 2, 1, 3))


def _probs(q, k, mask, scale, causal, cd):
    """(probs [B,N,T,S], valid or None, lse [B,N,T]) in the compute dtype."""
    n, t, s = q.shape[2], q.shape[1], k.shape[1]
    logits = _scores(q.astype(cd), _heads(k, n).astype(cd)) * cd(scale)
    valid = _valid(mask, causal, t, s)
    if valid is not None:
        logits = np.where(valid, logits, cd(BIG_NEG))
    m = logits.max(-1, keepdims=True)
    p = np.exp(logits - m)
    z = p.sum(-1, keepdims=True)
    return p / z, valid, (m + np.log(z))[..., 0]


def _split(args, has_mask):
    q, k, v = args[:3]
    mask = args[3] if has_mask else None
    return q, k, v, mask, args[3 + has_mask :]


def _group_sum(x, kh):
    b, s, n, h = x.shape
    return x.reshape(b, s, kh, n // kh, h).sum(3)


@attention_p.def_impl
def _attention_impl(*args, scale, causal, has_mask):
    q, k, v, mask, _ = _split(args, has_mask)
    cd = _compute_dtype(q, k, v)
    p, _, lse = _probs(q, k, mask, scale, causal, cd)
    out = _apply(p, _heads(v, q.shape[2]).astype(cd))
    return [out.astype(v.dtype), lse.astype(cd)]


@attention_jvp_p.def_impl
def _attention_jvp_impl(*args, scale, causal, has_mask):
    q, k, v, mask, (_out, _lse, q_dot, k_dot, v_dot) = _split(args, has_mask)
    cd = _compute_dtype(q, k, v)
    n = q.shape[2]
    p, valid, _ = _probs(q, k, mask, scale, causal, cd)
    kk, vv = _heads(k, n).astype(cd), _heads(v, n).astype(cd)
    s_dot = cd(scale) * (
        _scores(q_dot.astype(cd), kk) + _scores(q.astype(cd), _heads(k_dot, n).astype(cd))
    )
    if valid is not None:  # a masked logit is a constant
        s_dot = np.where(valid, s_dot, 0)
    p_dot = p * (s_dot - (p * s_dot).sum(-1, keepdims=True))
    out_dot = _apply(p_dot, vv) + _apply(p, _heads(v_dot, n).astype(cd))
    return out_dot.astype(v.dtype)


@attention_bwd_p.def_impl
def _attention_bwd_impl(*args, scale, causal, has_mask):
    q, k, v, mask, (_out, _lse, ct) = _split(args, has_mask)
    cd = _compute_dtype(q, k, v)
    n, kh = q.shape[2], k.shape[2]
    p, valid, _ = _probs(q, k, mask, scale, causal, cd)
    ct = ct.astype(cd)
    dp = _scores(ct, _heads(v, n).astype(cd))
    ds = p * (dp - (p * dp).sum(-1, keepdims=True))
    if valid is not None:
        ds = np.where(valid, ds, 0)
    dq = cd(scale) * _apply(ds, _heads(k, n).astype(cd))
    dk = cd(scale) * _apply_t(ds, q.astype(cd))
    dv = _apply_t(p, ct)
    return [
        dq.astype(q.dtype),
        _group_sum(dk, kh).astype(k.dtype),
        _group_sum(dv, kh).astype(v.dtype),
    ]


# -- shapes and dtypes --------------------------------------------------------------------
def _check(q, k, v, mask):
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise user_error(ShapeError, "dot_product_attention: q, k, v need 4 dims [B, T, N, H]")
    b, t, n, h = q.shape
    _, s, kh, _ = k.shape
    if k.shape[:2] != (b, s) or k.shape[3] != h or v.shape[:3] != (b, s, kh):
        raise user_error(
            ShapeError,
            f"dot_product_attention: q {q.shape}, k {k.shape}, v {v.shape} do not fit "
            f"[B, T, N, H], [B, S, K, H], [B, S, K, Hv]. Fix: reshape to JAX's layout.",
        )
    if kh == 0 or n % kh:
        raise user_error(
            ShapeError, f"dot_product_attention: {n} query heads are not a multiple of {kh}"
        )
    if not (q.dtype == k.dtype == v.dtype) or not dtypes.is_inexact(q.dtype):
        raise user_error(
            DtypeError,
            f"dot_product_attention: q, k, v need one floating dtype, got "
            f"{q.dtype.name}, {k.dtype.name}, {v.dtype.name}. Fix: cast with .astype().",
        )
    if mask is not None:
        want = (b, n, t, s)
        if (
            mask.ndim != 4
            or mask.dtype != np.bool_
            or mask.shape[3] != s
            or any(m not in (1, w) for m, w in zip(mask.shape[:3], want[:3]))
        ):
            raise user_error(
                ShapeError,
                f"dot_product_attention: mask {mask.str_short()} is not a bool "
                f"[B|1, N|1, T|1, {s}]. Fix: broadcast it (fflow.nn does).",
            )


def _lse_dtype(q):
    return np.dtype(np.float64 if np.dtype(q.dtype) == np.float64 else np.float32)


@attention_p.def_abstract_eval
def _attention_abstract_eval(*args, scale, causal, has_mask):
    q, k, v, mask, _ = _split(args, has_mask)
    _check(q, k, v, mask)
    b, t, n, _ = q.shape
    return [ShapedArray((b, t, n, v.shape[3]), v.dtype), ShapedArray((b, n, t), _lse_dtype(q))]


@attention_jvp_p.def_abstract_eval
def _attention_jvp_abstract_eval(*args, scale, causal, has_mask):
    q, k, v, mask, (out, _lse, q_dot, k_dot, v_dot) = _split(args, has_mask)
    _check(q, k, v, mask)
    for x, d in ((q, q_dot), (k, k_dot), (v, v_dot)):
        if x.shape != d.shape:
            raise user_error(ShapeError, "attention_jvp: a tangent's shape differs from its primal")
    return ShapedArray(out.shape, out.dtype)


@attention_bwd_p.def_abstract_eval
def _attention_bwd_abstract_eval(*args, scale, causal, has_mask):
    q, k, v, mask, (out, _lse, ct) = _split(args, has_mask)
    _check(q, k, v, mask)
    if ct.shape != out.shape:
        raise user_error(ShapeError, "attention_bwd: cotangent shape differs from the output")
    return [ShapedArray(x.shape, x.dtype) for x in (q, k, v)]


def dot_product_attention(q, k, v, mask=None, *, scale, causal=False):
    """The fused primitive on [B, T, N, H] operands (no argument checking beyond shapes;
    `fflow.nn.dot_product_attention` is the public, JAX-signature entry point).

    Example:
        >>> import numpy as np
        >>> from fflow.primitives.attention import dot_product_attention
        >>> q = np.ones((1, 2, 1, 4), np.float32)
        >>> np.asarray(dot_product_attention(q, q, q, scale=0.5)).shape
        (1, 2, 1, 4)
    """
    extra = () if mask is None else (mask,)
    out, _ = attention_p.bind(q, k, v, *extra, scale=float(scale), causal=bool(causal),
                              has_mask=mask is not None)  # fmt: skip
    return out


# -- autodiff -----------------------------------------------------------------------------
def _attention_jvp(primals, tangents, *, scale, causal, has_mask):
    out, lse = attention_p.bind(*primals, scale=scale, causal=causal, has_mask=has_mask)
    lse_dot = Zero(tangent_aval(_aval(lse)))
    if all(type(t) is Zero for t in tangents[:3]):
        return [out, lse], [Zero(tangent_aval(_aval(out))), lse_dot]
    dots = [instantiate(t) for t in tangents[:3]]
    out_dot = attention_jvp_p.bind(
        *primals, out, lse, *dots, scale=scale, causal=causal, has_mask=has_mask
    )
    return [out, lse], [out_dot, lse_dot]


def _aval(x):
    return x.aval if hasattr(x, "aval") else ShapedArray(np.shape(x), np.asarray(x).dtype)


def _attention_jvp_transpose(ct, *args, scale, causal, has_mask):
    n_primal = 5 + has_mask  # q, k, v, [mask], out, lse
    if type(ct) is Zero:
        return [None] * len(args)
    grads = attention_bwd_p.bind(
        *args[:n_primal], instantiate(ct), scale=scale, causal=causal, has_mask=has_mask
    )
    return [None] * n_primal + list(grads)


jvp_rules[attention_p] = _attention_jvp
transpose_rules[attention_jvp_p] = _attention_jvp_transpose


# -- second derivatives: the same math as a composite of primitives ------------------------
def _composite(q, k, v, mask, *, scale, causal):
    """The attention output from primitives ([B, T, N, Hv], v's dtype). The probabilities
    are exp(logits - lse), not a division, so the attention rewrite never matches it."""
    b, t, n, _ = _aval(q).shape
    s = _aval(k).shape[1]
    cd = np.dtype(_compute_dtype(_aval(q), _aval(k), _aval(v)))
    out_dtype = _aval(v).dtype
    q, k, v = (lax.convert_element_type(x, cd) for x in (q, _c_heads(k, n), _c_heads(v, n)))
    shape = (b, n, t, s)
    logits = lax.dot_general(q, k, (((3,), (3,)), ((0, 2), (0, 2))))  # [B, N, T, S]
    logits = lax.mul(logits, lax.full(shape, scale, cd))
    for valid in _c_valid(mask, causal, shape):
        logits = lax.select_n(valid, lax.full(shape, BIG_NEG, cd), logits)
    m = lax.stop_gradient(lax.reduce_max(logits, (3,)))
    z = lax.reduce_sum(lax.exp(lax.sub(logits, lax.broadcast_in_dim(m, shape, (0, 1, 2)))), (3,))
    lse = lax.add(m, lax.log(z))
    p = lax.exp(lax.sub(logits, lax.broadcast_in_dim(lse, shape, (0, 1, 2))))
    out = lax.dot_general(p, v, (((3,), (1,)), ((0, 1), (0, 2))))  # [B, N, T, Hv]
    return lax.convert_element_type(lax.transpose(out, (0, 2, 1, 3)), out_dtype)


def _c_jvp(q, k, v, mask, rest, **params):
    _, (out_dot,) = jvp_flat(lambda q, k, v: [_composite(q, k, v, mask, **params)],
                             [q, k, v], list(rest[2:]))  # fmt: skip
    return [instantiate(out_dot)]


def _c_bwd(q, k, v, mask, rest, **params):
    _, vjp_fn, _ = vjp_flat(lambda q, k, v: [_composite(q, k, v, mask, **params)], [q, k, v])
    return [instantiate(g) for g in vjp_fn([rest[2]])]


def _second_order(prim, value):
    """`prim`'s JVP rule: the JVP of `value`, its math as a composite of primitives."""

    def rule(primals, tangents, *, scale, causal, has_mask):
        q, k, v, mask, rest = _split(primals, has_mask)
        dots = list(tangents[:3]) + list(tangents[3 + has_mask :])

        def fun(q, k, v, *rest):
            return value(q, k, v, mask, rest, scale=scale, causal=causal)

        outs, outs_dot = jvp_flat(fun, [q, k, v, *rest], dots)
        if prim.multiple_results:
            return outs, outs_dot
        return outs[0], outs_dot[0]

    return rule


jvp_rules[attention_jvp_p] = _second_order(attention_jvp_p, _c_jvp)
jvp_rules[attention_bwd_p] = _second_order(attention_bwd_p, _c_bwd)


def _c_heads(x, n):
    b, s, kh, h = _aval(x).shape
    if kh == n:
        return x
    x = lax.broadcast_in_dim(x, (b, s, kh, n // kh, h), (0, 1, 2, 4))
    return lax.reshape(x, (b, s, n, h))


def _c_valid(mask, causal, shape):
    out = []
    if mask is not None:
        out.append(lax.broadcast_in_dim(mask, shape, (0, 1, 2, 3)))
    if causal:
        tri = np.tril(np.ones(shape[2:], bool))
        out.append(lax.broadcast_in_dim(tri, shape, (2, 3)))
    return out


# -- batching rule (vmap): the mapped axis joins the batch axis B ---------------------------
def _merge(x, size):
    shape = np.shape(x) if not hasattr(x, "aval") else x.aval.shape
    return lax.reshape(x, (size * shape[1], *shape[2:]))


def _mask_batched(mask, bdim, size, b):
    if bdim is vm.not_mapped and _aval(mask).shape[0] == 1:
        return mask  # one mask for every batch row, mapped or not
    mask = vm.bdim_to_front(mask, bdim, size)
    shape = _aval(mask).shape
    if shape[1] != b:
        mask = lax.broadcast_in_dim(mask, (size, b, *shape[2:]), (0, 1, 2, 3, 4))
    return _merge(mask, size)


def _batch_rule(prim):
    def rule(vals, dims, *, scale, causal, has_mask):
        size = vm.batch_size(vals, dims)
        moved = []
        for i, (x, d) in enumerate(zip(vals, dims)):
            if has_mask and i == 3:
                moved.append(None)
                continue
            moved.append(_merge(vm.bdim_to_front(x, d, size), size))
        b = _aval(moved[0]).shape[0] // size
        if has_mask:
            moved[3] = _mask_batched(vals[3], dims[3], size, b)
        outs = prim.bind(*moved, scale=scale, causal=causal, has_mask=has_mask)
        single = not prim.multiple_results
        outs = [outs] if single else outs
        outs = [lax.reshape(o, (size, b, *_aval(o).shape[1:])) for o in outs]
        return (outs[0], 0) if single else (outs, [0] * len(outs))

    return rule


for _p in (attention_p, attention_jvp_p, attention_bwd_p):
    vm.batch_rules[_p] = _batch_rule(_p)


# -- SBP signatures: split the batch or the heads (every operand consistently) ------------
def _attention_sigs(in_avals, out_avals, has_mask, causal):
    def ins(kind):
        sigs = []
        for i, a in enumerate(in_avals):
            if has_mask and i == 3:  # mask [B|1, N|1, T|1, S]
                dim = {"batch": 0, "heads": 1, "rows": 2}[kind]
                sigs.append(S(dim) if a.shape[dim] > 1 else B)
            elif a.ndim == 3:  # lse [B, N, T]
                sigs.append(S({"batch": 0, "heads": 1, "rows": 2}[kind]))
            elif kind == "rows" and i in (1, 2):  # keys/values whole on every device
                sigs.append(B)
            else:
                sigs.append(S({"batch": 0, "heads": 2, "rows": 1}[kind]))
        return tuple(sigs)

    def outs(kind):
        return tuple(
            S({"batch": 0, "heads": 1, "rows": 2}[kind])
            if o.ndim == 3
            else S({"batch": 0, "heads": 2, "rows": 1}[kind])
            for o in out_avals
        )

    kinds = ["batch", "heads"]
    if not causal and len(out_avals) == 2:
        kinds.append("rows")  # query rows are independent (causal needs global row ids)
    sigs = [Sig(ins(kind), outs(kind)) for kind in kinds]
    return sigs + [Sig((B,) * len(in_avals), (B,) * len(out_avals))]


def _sbp_rule(in_avals, out_avals, *, scale, causal, has_mask):
    return _attention_sigs(in_avals, out_avals, has_mask, causal)


for _p in (attention_p, attention_jvp_p, attention_bwd_p):
    def_sbp(_p, _sbp_rule)
