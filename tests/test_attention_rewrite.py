"""Hand-written attention rewritten to the fused primitive (transforms/attention_rewrite.py).

Each spelling is checked three ways: its programs (jit, jit(grad)) hold
`dot_product_attention`; its values and the gradients of q, k and v equal the same
function with the rewrite off and a float64 NumPy reference. The cases the rewrite must
leave alone (extra readers, a traced or non-uniform scale, a bias instead of a mask...)
keep the hand-written equations and their values.
"""

import contextlib

import numpy as np
import pytest
from fflow.transforms.attention_rewrite import rewrites_of

import fflow
import fflow.numpy as jnp
from fflow import nn

B, N, T, S, H = 2, 3, 5, 7, 8
SCALE = H**-0.5


@contextlib.contextmanager
def rewrite(on):
    old = fflow.config.attention_rewrite
    fflow.config.update("attention_rewrite", on)
    try:
        yield
    finally:
        fflow.config.update("attention_rewrite", old)


def reference(q, k, v, valid, scale, ct):
    """float64 attention on [..., T, H] operands and the gradients of sum(out * ct)."""
    q, k, v, ct = (np.asarray(x, np.float64) for x in (q, k, v, ct))
    sw = lambda a: np.swapaxes(a, -1, -2)  # noqa: E731
    s = q @ sw(k) * scale
    valid = np.ones(s.shape, bool) if valid is None else np.broadcast_to(valid, s.shape)
    s = np.where(valid, s, -1e30)  # a fully masked row averages every value
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = p @ v
    dp = ct @ sw(v)
    ds = np.where(valid, p * (dp - (dp * p).sum(-1, keepdims=True)), 0.0)
    return out, ds @ k * scale, sw(ds) @ q * scale, sw(p) @ ct


def programs(fn, args):
    def loss(*a):
        return sum(jnp.sum(x**2) for x in fflow.tree_util.tree_leaves(fn(*a)))

    return (str(fflow.make_jaxpr(fn)(*args)),
            str(fflow.make_jaxpr(fflow.grad(loss, argnums=(0, 1, 2)))(*args)))  # fmt: skip


def results(fn, args, ct, wrap=lambda f: f):
    """jit(f), jit(grad(f)) and grad(jit(f)) with fresh jit caches."""

    def loss(*a):
        return jnp.sum(wrap(fn)(*a) * ct)

    out = np.asarray(fflow.jit(wrap(fn))(*args), np.float64)
    g1 = fflow.jit(fflow.grad(loss, argnums=(0, 1, 2)))(*args)
    g2 = fflow.grad(fflow.jit(loss), argnums=(0, 1, 2))(*args)
    return out, [np.asarray(g, np.float64) for g in g1], [np.asarray(g, np.float64) for g in g2]


def check(fn, args, to_ref, valid, scale, causal=None, tol=2e-5, wrap=lambda f: f):
    """Rewritten (forward and backward), equal to the rewrite off and to float64."""
    rng = np.random.default_rng(3)
    fwd, bwd = programs(wrap(fn), args)
    assert "dot_product_attention" in fwd and "softmax" not in fwd, fwd
    assert "attention_bwd" in bwd and "exp" not in bwd, bwd
    if causal is not None:
        assert f"causal={causal}" in fwd
    out_shape = fflow.eval_shape(wrap(fn), *args).shape
    ct = rng.normal(size=out_shape).astype(np.float32)
    with rewrite(True):
        got = results(fn, args, ct, wrap)
    with rewrite(False):
        plain = results(fn, args, ct, wrap)
    r_out, *r_grads = reference(*(to_ref(a) for a in args[:3]), valid, scale, to_ref(ct))
    scale_of = lambda a: max(1.0, float(np.abs(a).max()))  # noqa: E731
    np.testing.assert_allclose(to_ref(got[0]), r_out, atol=tol * scale_of(r_out))
    np.testing.assert_allclose(got[0], plain[0], atol=tol * scale_of(r_out))
    for gs, ps in ((got[1], plain[1]), (got[2], plain[2])):
        for g, p, r in zip(gs, ps, r_grads):
            np.testing.assert_allclose(to_ref(g), r, atol=tol * scale_of(r))
            np.testing.assert_allclose(g, p, atol=tol * scale_of(r))


def operands(shape, seed=0, kv_len=S):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=shape).astype(np.float32)
    kv_shape = list(shape)
    kv_shape[-2 if len(shape) != 4 or shape[1] == N else 1] = kv_len
    k, v = (rng.normal(size=kv_shape).astype(np.float32) for _ in range(2))
    return q, k, v


ident = lambda a: np.asarray(a, np.float64)  # noqa: E731
heads_first = lambda a: np.transpose(np.asarray(a, np.float64), (0, 2, 1, 3))  # noqa: E731
tri = np.tril(np.ones((T, T), bool))


# -- the spellings ---------------------------------------------------------------------------
def test_matmul_swapaxes_divide_nn_softmax():
    def f(q, k, v):
        return nn.softmax(q @ jnp.swapaxes(k, -1, -2) / np.sqrt(H), axis=-1) @ v

    check(f, operands((B, N, T, H)), ident, None, SCALE, causal=False)


def test_einsum_scaled_q_hand_softmax_causal_minus_inf():
    def f(q, k, v):
        s = jnp.einsum("bhqd,bhkd->bhqk", q * H**-0.5, k)
        s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -jnp.inf)
        e = jnp.exp(s - jnp.max(s, axis=-1, keepdims=True))
        p = e / jnp.sum(e, axis=-1, keepdims=True)
        return jnp.einsum("bhqk,bhkd->bhqd", p, v)

    check(f, operands((B, N, T, H), 1, kv_len=T), ident, tri, SCALE, causal=True)


def test_einsum_seq_major_padding_mask_as_argument():
    # [B, T, N, H] operands; einsum puts v first in the second product (probs as rhs)
    pad = np.ones((B, S), bool)
    pad[0, 4:] = False
    pad[1, :] = False  # every key padded: each row averages all values, as the primitive

    def f(q, k, v, pad):
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * SCALE
        s = jnp.where(pad[:, None, None, :], s, -1e9)
        return jnp.einsum("bhqk,bkhd->bqhd", nn.softmax(s, axis=-1), v)

    q, k, v = operands((B, T, N, H), 2)
    check(f, (q, k, v, pad), heads_first, pad[:, None, None, :], SCALE, causal=False)


def test_no_head_axis_scaled_k_additive_constant_mask():
    add = np.triu(np.full((T, T), -np.inf, np.float32), 1)

    def f(q, k, v):
        s = q @ jnp.transpose(k * SCALE, (0, 2, 1)) + add
        return nn.softmax(s, axis=-1) @ v

    check(f, operands((B, T, H), 3, kv_len=T), ident, tri, SCALE, causal=True)


def test_no_head_axis_padding_mask_per_batch_row():
    pad = np.ones((B, S), bool)
    pad[1, 3:] = False

    def f(q, k, v, pad):
        s = jnp.einsum("bqd,bkd->bqk", q, k) / np.sqrt(H)
        return nn.softmax(jnp.where(pad[:, None, :], s, -1e9), axis=-1) @ v

    q, k, v = operands((B, T, H), 14)
    check(f, (q, k, v, pad), ident, pad[:, None, :], SCALE, causal=False)


@pytest.mark.parametrize(
    "batch, mask_shape",
    [((2, 3), (2, 1, 1, S)), ((2, 3), (1, 3, T, 1)), ((2, 2, 3), (2, 1, 3, T, S)),
     ((2, 2, 3), (1, 2, 1, 1, S))],
)  # fmt: skip
def test_masks_broadcast_along_any_axes(batch, mask_shape):
    # the primitive takes [B|1, N|1, T|1, S]: a mask constant along some of the
    # scores' axes (several batch axes merged into B) is laid out to it
    rng = np.random.default_rng(len(batch) + sum(mask_shape))
    mask = rng.random(mask_shape) > 0.35

    def f(q, k, v, mask):
        s = q @ jnp.swapaxes(k, -1, -2) * SCALE
        return nn.softmax(jnp.where(mask, s, -1e9), axis=-1) @ v

    q, k, v = (rng.normal(size=(*batch, n, H)).astype(np.float32) for n in (T, S, S))
    check(f, (q, k, v, mask), ident, mask, SCALE, causal=False)


def test_two_dims_negated_runtime_mask_finfo_min():
    blocked = np.random.default_rng(4).random((T, S)) > 0.6

    def f(q, k, v, blocked):
        s = (q @ k.T) * 0.3
        return nn.softmax(jnp.where(blocked, jnp.finfo(jnp.float32).min, s), axis=-1) @ v

    q, k, v = operands((T, H), 4)
    check(f, (q, k, v, blocked), ident, ~blocked, 0.3, causal=False)


def test_no_scale_and_a_softmax_over_axis_3():
    def f(q, k, v):
        return jnp.einsum("bhqk,bhkd->bhqd", nn.softmax(q @ jnp.swapaxes(k, 2, 3), axis=3), v)

    check(f, operands((B, N, T, H), 13), ident, None, 1.0, causal=False)


def test_vmap_of_attention_adds_a_batch_axis():
    def f(q, k, v):
        return nn.softmax(q @ jnp.swapaxes(k, -1, -2) * SCALE, axis=-1) @ v

    q, k, v = operands((B, N, T, H), 5)
    q, k, v = (x.reshape(2, 1, N, *x.shape[2:]) for x in (q, k, v))
    check(f, (q, k, v), ident, None, SCALE, wrap=fflow.vmap)


def test_amp_bf16_causal():
    def f(q, k, v):
        s = q @ jnp.swapaxes(k, -1, -2) / np.sqrt(H)
        s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -1e9)
        return nn.softmax(s, axis=-1) @ v

    amp = lambda g: fflow.amp(g, "bf16")  # noqa: E731
    check(f, operands((B, N, T, H), 6, kv_len=T), ident, tri, SCALE, causal=True, tol=4e-2,
          wrap=amp)  # fmt: skip


# -- what must stay as written ---------------------------------------------------------------
def left_alone(fn, args, reason):
    fwd, bwd = programs(fn, args)
    assert "dot_product_attention" not in fwd and "attention_bwd" not in bwd, fwd
    notes = rewrites_of(fflow.jit(fn).lower(*args).entry.program)
    assert reason is None or any(reason in line for line in notes), notes
    with rewrite(False):
        plain = fflow.tree_util.tree_leaves(fflow.jit(fn)(*args))
    for got, want in zip(fflow.tree_util.tree_leaves(fflow.jit(fn)(*args)), plain):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def probs(q, k, scale=SCALE):
    return nn.softmax(q @ jnp.swapaxes(k, -1, -2) * scale, axis=-1)


def test_probabilities_returned_too():
    fwd, _ = programs(lambda q, k, v: (probs(q, k) @ v) * 1.0, operands((B, N, T, H)))
    assert "dot_product_attention" in fwd
    left_alone(lambda q, k, v: ((p := probs(q, k)) @ v, p), operands((B, N, T, H)),
               "other readers")  # fmt: skip


def test_dropout_between_softmax_and_v():
    keep = np.random.default_rng(1).random((B, N, T, S)) > 0.1
    left_alone(lambda q, k, v: (probs(q, k) * keep / 0.9) @ v, operands((B, N, T, H)), None)


def test_scores_read_before_the_product_in_a_training_step():
    def loss(q, k, v):
        p = probs(q, k)
        return jnp.sum(p**2) + jnp.sum(p @ v)

    args = operands((B, N, T, H))
    _, bwd = programs(lambda q, k, v: loss(q, k, v), args)
    assert "attention_bwd" not in bwd
    g = fflow.jit(fflow.grad(loss, argnums=(0, 1, 2)))(*args)
    with rewrite(False):
        g0 = fflow.jit(fflow.grad(loss, argnums=(0, 1, 2)))(*args)
    for a, b in zip(g, g0):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_traced_scale():
    def f(q, k, v, temperature):
        return probs(q, k, 1.0 / temperature) @ v

    left_alone(f, (*operands((B, N, T, H)), np.float32(2.0)), "traced or non-uniform")


def test_scores_divided_by_zero():
    with np.errstate(all="ignore"):
        left_alone(lambda q, k, v: nn.softmax(q @ jnp.swapaxes(k, -1, -2) / 0.0) @ v,
                   operands((B, N, T, H)), "scaled by 0")  # fmt: skip


def test_per_head_scale():
    per_head = np.linspace(0.1, 0.3, N, dtype=np.float32)[:, None, None]
    left_alone(lambda q, k, v: probs(q, k, per_head) @ v, operands((B, N, T, H)),
               "traced or non-uniform")  # fmt: skip


def test_fill_that_is_not_a_mask():
    mask = np.random.default_rng(2).random((T, S)) > 0.5
    left_alone(lambda q, k, v: nn.softmax(jnp.where(mask, q @ jnp.swapaxes(k, -1, -2), 0.0))
               @ v, operands((B, N, T, H)), "is not a mask")  # fmt: skip


def test_fill_broadcast_along_rows():
    fill = np.linspace(-1e9, -2e9, T, dtype=np.float32)[:, None]
    mask = np.random.default_rng(2).random((T, S)) > 0.5
    left_alone(lambda q, k, v: nn.softmax(jnp.where(mask, q @ jnp.swapaxes(k, -1, -2), fill))
               @ v, operands((B, N, T, H)), "not a constant scalar")  # fmt: skip


def test_additive_bias():
    bias = np.random.default_rng(2).normal(size=(T, S)).astype(np.float32)
    left_alone(lambda q, k, v: nn.softmax(q @ jnp.swapaxes(k, -1, -2) + bias) @ v,
               operands((B, N, T, H)), "0/-inf mask")  # fmt: skip


def test_minus_inf_with_a_runtime_mask():
    def f(q, k, v, m):
        return nn.softmax(jnp.where(m, q @ jnp.swapaxes(k, -1, -2), -jnp.inf)) @ v

    m = np.ones((T, S), bool)
    left_alone(f, (*operands((B, N, T, H)), m), "not a constant")


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # its NaN row, by hand
def test_constant_mask_with_an_empty_row():
    m = np.ones((T, S), bool)
    m[2] = False  # hand-written: NaN row; the primitive would give the mean
    left_alone(lambda q, k, v: nn.softmax(jnp.where(m, q @ jnp.swapaxes(k, -1, -2), -jnp.inf))
               @ v, operands((B, N, T, H)), "no key")  # fmt: skip


def test_switch_and_explain():
    def f(q, k, v):
        return probs(q, k) @ v

    args = operands((B, N, T, H))
    with rewrite(False):
        assert "dot_product_attention" not in str(fflow.make_jaxpr(f)(*args))
    report = str(fflow.explain(f)(*args))
    assert "attention: rewritten" in report and "test_attention_rewrite.py" in report, report


def test_second_derivatives_keep_working():
    def f(q, k, v):
        return jnp.sum(jnp.tanh(probs(q, k) @ v))

    q, k, v = (x[0, 0, :3, :2] for x in operands((B, N, T, H), 7))
    h = fflow.jit(fflow.hessian(f))(q, k, v)
    with rewrite(False):
        h0 = fflow.jit(fflow.hessian(f))(q, k, v)
    np.testing.assert_allclose(np.asarray(h), np.asarray(h0), rtol=1e-5, atol=1e-6)
    h1 = fflow.hessian(fflow.jit(f))(q, k, v)
    np.testing.assert_allclose(np.asarray(h1), np.asarray(h0), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_fused_primitive_second_derivatives(causal):
    # forward-over-reverse through attention_jvp/attention_bwd (grouped heads, a mask)
    # against the composite path of nn.dot_product_attention (taken with a bias)
    rng = np.random.default_rng(8)
    q = rng.normal(size=(1, 4, 4, 3))
    k, v = rng.normal(size=(2, 1, 4, 2, 3))
    mask = rng.random((1, 1, 4, 4)) > 0.3
    mask[..., 0] = True
    dirs = [rng.normal(size=x.shape) for x in (q, k, v)]

    def loss(fused):
        def f(q, k, v):
            bias = None if fused else jnp.zeros((4, 4))
            out = nn.dot_product_attention(q, k, v, bias=bias, mask=mask, is_causal=causal)
            return jnp.sum(jnp.sin(out))

        return f

    got = fflow.jvp(fflow.grad(loss(True), argnums=(0, 1, 2)), (q, k, v), tuple(dirs))[1]
    want = fflow.jvp(fflow.grad(loss(False), argnums=(0, 1, 2)), (q, k, v), tuple(dirs))[1]
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-4, atol=2e-5)


def seq_major_causal(q, k, v):
    """Causal attention written by hand on seq-major [b, t, heads, h] operands, made
    head-major by hand (as after a projection) and back."""
    t, h = q.shape[1], q.shape[3]
    q, k, v = (jnp.transpose(a, (0, 2, 1, 3)) for a in (q, k, v))
    s = q @ jnp.swapaxes(k, -1, -2) / np.sqrt(h)
    s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -1e9)
    return jnp.transpose(nn.softmax(s, axis=-1) @ v, (0, 2, 1, 3))


def test_cuda_launch_plan_of_a_hand_written_training_step():
    # seq-major operands made head-major by hand (as after a projection): the rewrite's
    # layout cancels those transposes and their backward ones; one kernel per direction
    from fflow.lowering import cuda_backend

    b, n, t, h = 2, 4, 64, 16

    def fwd_bwd(q, k, v, ct):
        return fflow.vjp(seq_major_causal, q, k, v)[1](ct)

    q = np.ones((b, t, n, h), np.float32)
    for on in (True, False):
        with rewrite(on):
            prog = cuda_backend._optimize(fflow.make_jaxpr(fwd_bwd)(q, q, q, q))
        text = cuda_backend.plan_text(cuda_backend.Plan(prog))
        launches = [ln for ln in text.splitlines() if ln[:3].strip().isdigit()]
        if on:
            assert len(launches) == 2, text
            assert "attn_fwd" in launches[0] and "attn_bwd" in launches[1], text
            assert f"[{b},{n},{t},{t}]" not in text  # no scores tensor in HBM
        else:
            assert len(launches) > 2 and f"f32[{b},{n},{t},{t}]" in text


@pytest.mark.parametrize("causal, masked", [(False, False), (True, True)])
def test_cpu_kernels_with_and_without_the_saved_probabilities(causal, masked):
    # lowering/cpu_attention.py: the backward reads the forward's P while its lse lives,
    # and recomputes P from lse for any other lse (here: a copy); both against the
    # primitive's NumPy reference (einsum loops)
    from fflow.lowering import cpu_attention, native
    from fflow.primitives.attention import attention_bwd_p, attention_p

    assert cpu_attention._rows(np.dtype(np.float32)) is not None or not native.enabled()
    rng = np.random.default_rng(9)
    q, ct = (rng.normal(size=(2, 6, 4, 8)).astype(np.float32) for _ in range(2))
    k, v = (rng.normal(size=(2, 9, 2, 8)).astype(np.float32) for _ in range(2))
    mask = None
    if masked:
        mask = rng.random((2, 1, 6, 9)) > 0.4
        mask[0, 0, 2] = False  # a fully masked row: the mean of every value
    extra = () if mask is None else (mask,)
    kw = dict(scale=0.3, causal=causal, has_mask=masked)
    out, lse = cpu_attention.forward(q, k, v, *extra, **kw)
    want_out, want_lse = attention_p.impl(q, k, v, *extra, **kw)
    np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-5)
    want = attention_bwd_p.impl(q, k, v, *extra, want_out, want_lse, ct, **kw)
    for lse_in in (lse, lse.copy()):  # the saved P, then recomputed
        got = cpu_attention.backward(q, k, v, *extra, out, lse_in, ct, **kw)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_grouped_query_heads_repeated_by_hand():
    # k and v have 1 head each per 3 query heads, repeated with jnp.repeat: the
    # primitive gets the 1-head k/v (grouped-query attention), no repeated copy
    kv_heads = 1

    def f(q, k, v):
        k, v = (jnp.repeat(a, N // kv_heads, axis=1) for a in (k, v))
        return nn.softmax(q @ jnp.swapaxes(k, -1, -2) * SCALE, axis=-1) @ v

    rng = np.random.default_rng(10)
    q = rng.normal(size=(B, N, T, H)).astype(np.float32)
    k, v = (rng.normal(size=(B, kv_heads, S, H)).astype(np.float32) for _ in range(2))
    fwd, bwd = programs(f, (q, k, v))
    assert f"f32[{B},{S},{kv_heads},{H}] = transpose" in fwd, fwd  # k, v: one head each
    assert f"[{B},{N},{S},{H}]" not in fwd, fwd  # no repeated copy
    assert "attention_bwd" in bwd
    rep = lambda a: np.repeat(ident(a), N // kv_heads, axis=1)  # noqa: E731
    ct = rng.normal(size=(B, N, T, H)).astype(np.float32)
    got = results(f, (q, k, v), ct)
    with rewrite(False):
        plain = results(f, (q, k, v), ct)
    r_out, r_dq, r_dk, r_dv = reference(q, rep(k), rep(v), None, SCALE, ct)
    fold = lambda g: g.reshape(B, kv_heads, N // kv_heads, S, H).sum(2)  # noqa: E731
    np.testing.assert_allclose(got[0], r_out, atol=2e-5)
    np.testing.assert_allclose(got[0], plain[0], atol=2e-5)
    for gs in (got[1], got[2], plain[1]):
        for g, r in zip(gs, (r_dq, fold(r_dk), fold(r_dv))):
            np.testing.assert_allclose(g, r, atol=1e-4)


def test_inside_scan_and_checkpoint_bodies():
    # a scan over layers (forward: the program pass rewrites the body; grad: the
    # autodiff hook sees the body's equations) and a rematerialised attention
    def layers(x):
        def body(h, _):
            return probs(h, h) @ h + h, None

        return fflow.lax.scan(body, x, None, length=2)[0]

    def remat(x):
        return fflow.checkpoint(lambda h: probs(h, h) @ h)(x)

    x = operands((B, N, T, H), 11)[0]
    for f in (layers, remat):
        loss = lambda x, f=f: jnp.sum(jnp.sin(f(x)))  # noqa: E731
        assert "dot_product_attention" in str(fflow.make_jaxpr(f)(x))
        assert "attention_bwd" in str(fflow.make_jaxpr(fflow.grad(loss))(x))
        got = [np.asarray(fflow.jit(f)(x)), np.asarray(fflow.jit(fflow.grad(loss))(x))]
        with rewrite(False):
            want = [np.asarray(fflow.jit(f)(x)), np.asarray(fflow.jit(fflow.grad(loss))(x))]
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def test_probabilities_as_aux_of_a_jitted_gradient():
    # the autodiff hook rewrites at the @ v; the probabilities returned through
    # has_aux (which it cannot see) are still the hand-written values
    def loss(q, k, v):
        p = probs(q, k)
        return jnp.sum(jnp.sin(p @ v)), p

    args = operands((B, N, T, H), 12)
    step = fflow.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)
    got = fflow.tree_util.tree_leaves(fflow.jit(step)(*args))
    with rewrite(False):
        want = fflow.tree_util.tree_leaves(fflow.jit(step)(*args))
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)


def test_data_parallel_shard_of_a_hand_written_attention():
    # the autodiff hook inside shard's trace: the sharded training step differentiates
    # the primitive (batch split S(0) on 2 simulated devices), values as unsharded
    from fflow.sbp import B as BCAST
    from fflow.sbp import S as SPLIT

    def loss(w, x):
        return jnp.sum(jnp.sin(probs(x @ w, x) @ x))

    rng = np.random.default_rng(15)
    w, x = rng.normal(size=(H, H)).astype(np.float32), rng.normal(size=(4, T, H)).astype(np.float32)
    pl = fflow.placement("cpu", [0, 1])
    step = fflow.shard(fflow.value_and_grad(loss), pl, in_sbp=(BCAST, SPLIT(0)), out_sbp=BCAST)
    assert "attention_bwd" in str(fflow.make_jaxpr(step)(w, x))
    value, grad = fflow.jit(step)(w, x)
    with rewrite(False):
        want_value, want_grad = fflow.value_and_grad(loss)(w, x)
    np.testing.assert_allclose(float(value), float(want_value), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(want_grad), rtol=1e-4, atol=1e-5)


def test_eager_grad_and_vmap_are_not_rewritten(caplog):
    # eager transforms run primitives one by one: the hook stays out (the fused
    # primitive's reference is slower there, and the hook would keep intermediates)
    def loss(q, k, v):
        return jnp.sum(probs(q, k) @ v)

    args = operands((B, N, T, H), 16)
    per_example = fflow.vmap(fflow.grad(loss), in_axes=(0, 0, 0))
    with caplog.at_level("DEBUG", logger="fflow.rewrite"):
        eager = per_example(*args)
        assert not caplog.records
        staged = fflow.jit(per_example)(*args)
        assert any("dot_product_attention" in r.getMessage() for r in caplog.records)
    np.testing.assert_allclose(np.asarray(staged), np.asarray(eager), rtol=1e-4, atol=1e-5)


def test_forward_mode_keeps_the_hand_written_equations():
    # jvp inside jit: the fused primitive's tangent map runs its NumPy reference (slower
    # than the hand-written products), so forward mode is not rewritten
    def f(q, k, v):
        return probs(q, k) @ v

    args = operands((B, N, T, H), 17)
    prog = str(fflow.make_jaxpr(lambda q, k, v: fflow.jvp(f, (q, k, v), (q, k, v))[1])(*args))
    assert "attention_jvp" not in prog and "exp" in prog


def test_cuda_shim_runs_a_rewritten_training_step():
    # the CUDA backend end to end (NVRTC cubin, kernels on the host shim): the jitted
    # step of a hand-written causal attention runs attn_fwd/attn_bwd and matches the
    # same function evaluated eagerly (op by op, not rewritten)
    from cuda_harness import run_cases

    b, n, t, h = 1, 2, 8, 8

    def loss(q, k, v):
        return jnp.sum(jnp.sin(seq_major_causal(q, k, v)))

    rng = np.random.default_rng(18)
    args = [rng.normal(size=(b, t, n, h)).astype(np.float32) for _ in range(3)]
    step = fflow.value_and_grad(loss, argnums=(0, 1, 2))
    ((_, exe, _, _),) = run_cases([("hand-written causal attention step", step, args)])
    names = [k.name for k in exe.plan.kernels]
    assert sum("attn_fwd" in x for x in names) == 1 and sum("attn_bwd" in x for x in names) == 1


def test_cuda_plan_of_a_hand_written_block_equals_the_fused_one():
    # an amp bf16 training step of a small attention block: written by hand, its CUDA
    # launch plan is the one nn.dot_product_attention gives (same launches and GEMMs)
    from fflow.lowering import cuda_backend

    b, t, d, heads = 2, 16, 32, 2

    def hand(q, k, v):  # [b, heads, t, d/heads]
        s = q @ jnp.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
        return nn.softmax(jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -1e9), axis=-1) @ v

    def fused(q, k, v):
        tr = lambda a: jnp.transpose(a, (0, 2, 1, 3))  # noqa: E731
        return tr(nn.dot_product_attention(tr(q), tr(k), tr(v), is_causal=True))

    def loss(attn):
        def f(w, x):
            qkv = (x @ w["qkv"]).reshape(b, t, 3, heads, d // heads)
            q, k, v = (jnp.transpose(qkv[:, :, i], (0, 2, 1, 3)) for i in range(3))
            o = jnp.transpose(attn(q, k, v), (0, 2, 1, 3)).reshape(b, t, d)
            return jnp.mean(jnp.square(x + o @ w["proj"]))

        return fflow.value_and_grad(fflow.amp(f, "bf16"))

    rng = np.random.default_rng(19)
    w = {"qkv": rng.normal(size=(d, 3 * d)).astype(np.float32),
         "proj": rng.normal(size=(d, d)).astype(np.float32)}  # fmt: skip
    x = rng.normal(size=(b, t, d)).astype(np.float32)

    def launches(attn):
        plan = cuda_backend.Plan(cuda_backend._optimize(fflow.make_jaxpr(loss(attn))(w, x)))
        text = cuda_backend.plan_text(plan)
        return [ln.split()[1:3] for ln in text.splitlines() if ln[:3].strip().isdigit()]

    got, want = launches(hand), launches(fused)
    assert [kind for kind, _ in got] == [kind for kind, _ in want], (got, want)
    assert sum("attn_fwd" in name for _, name in got) == 1
    assert sum("attn_bwd" in name for _, name in got) == 1
