"""fflow.nn layers vs NumPy references (and JAX where installed)."""

import itertools

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp
from fflow import lax, nn

KEY = fflow.random.PRNGKey(0)


def _x(*shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def test_linear_and_embedding_vs_numpy():
    lin = nn.Linear(5, 3, key=KEY)
    x = _x(2, 4, 5)
    want = x @ np.asarray(lin.weight) + np.asarray(lin.bias)
    np.testing.assert_allclose(np.asarray(lin(x)), want, rtol=1e-5, atol=1e-6)
    assert nn.Linear(5, 3, use_bias=False, key=KEY).bias is None
    emb = nn.Embedding(10, 4, key=KEY)
    ids = np.array([[1, 9], [0, 1]], np.int32)
    np.testing.assert_array_equal(np.asarray(emb(ids)), np.asarray(emb.weight)[ids])
    h = _x(3, 4)
    np.testing.assert_allclose(
        np.asarray(emb.attend(h)), h @ np.asarray(emb.weight).T, rtol=1e-5, atol=1e-6
    )
    assert abs(float(np.std(np.asarray(nn.Embedding(500, 64, key=KEY).weight))) - 0.125) < 0.01


def test_linear_wrong_input_size_names_the_fix():
    with pytest.raises(ValueError, match="last dimension is 5"):
        nn.Linear(5, 3, key=KEY)(jnp.ones((2, 4)))


def test_layernorm_rmsnorm_vs_numpy():
    x = _x(3, 6)
    ln = nn.LayerNorm(6).replace(weight=jnp.asarray(_x(6, seed=1)), bias=jnp.asarray(_x(6, seed=2)))
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    want = (x - mean) / np.sqrt(var + 1e-5) * np.asarray(ln.weight) + np.asarray(ln.bias)
    np.testing.assert_allclose(np.asarray(ln(x)), want, rtol=1e-4, atol=1e-5)
    rms = nn.RMSNorm(6)
    want = x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(np.asarray(rms(x)), want, rtol=1e-5, atol=1e-6)
    ln2 = nn.LayerNorm((2, 3), use_weight=False, use_bias=False)
    x3 = _x(4, 2, 3)
    flat = x3.reshape(4, 6)
    want = (flat - flat.mean(-1, keepdims=True)) / np.sqrt(flat.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(np.asarray(ln2(x3)).reshape(4, 6), want, rtol=1e-4, atol=1e-5)


def test_dropout():
    x = jnp.ones((200, 50))
    d = nn.Dropout(0.3)
    y = np.asarray(d(x, key=KEY))
    np.testing.assert_allclose(np.unique(y), [0.0, 1 / 0.7], rtol=1e-6)
    assert abs((y == 0).mean() - 0.3) < 0.02
    assert np.array_equal(np.asarray(d(x, inference=True)), np.asarray(x))
    assert np.array_equal(np.asarray(nn.inference_mode(d)(x)), np.asarray(x))
    with pytest.raises(ValueError, match="key"):
        d(x)


def np_conv(x, w, stride, pad, dilation, groups):
    """Direct N-d convolution, NC.../OI... layout."""
    nsp = x.ndim - 2
    x = np.pad(x, [(0, 0), (0, 0)] + list(pad))
    n, c = x.shape[:2]
    o, cg = w.shape[:2]
    k = w.shape[2:]
    out_sp = [(x.shape[2 + i] - (k[i] - 1) * dilation[i] - 1) // stride[i] + 1 for i in range(nsp)]
    out = np.zeros((n, o) + tuple(out_sp), np.float64)
    og = o // groups
    for pos in itertools.product(*[range(s) for s in out_sp]):
        for oc in range(o):
            g = oc // og
            acc = np.zeros(n)
            for tap in itertools.product(*[range(kk) for kk in k]):
                idx = tuple(pos[i] * stride[i] + tap[i] * dilation[i] for i in range(nsp))
                xs = x[(slice(None), slice(g * cg, (g + 1) * cg)) + idx]
                acc += xs @ w[(oc, slice(None)) + tap]
            out[(slice(None), oc) + pos] = acc
    return out


@pytest.mark.parametrize(
    "nsp,kernel,stride,padding,dilation,groups",
    [(1, 3, 1, 1, 1, 1), (1, 2, 2, 0, 2, 2), (2, 3, 1, 1, 1, 1), (2, (2, 3), (2, 1), 0, (1, 2), 2)],
)
def test_conv_vs_numpy(nsp, kernel, stride, padding, dilation, groups):
    cls = nn.Conv1d if nsp == 1 else nn.Conv2d
    conv = cls(4, 6, kernel, stride, padding, dilation, groups, key=KEY)
    x = _x(*((2, 4) + (7,) * nsp))
    k = conv.weight.shape[2:]
    pad = [(padding, padding)] * nsp
    st = (stride,) * nsp if isinstance(stride, int) else stride
    di = (dilation,) * nsp if isinstance(dilation, int) else dilation
    want = np_conv(x, np.asarray(conv.weight), st, pad, di, groups)
    want = want + np.asarray(conv.bias).reshape((1, -1) + (1,) * nsp)
    got = np.asarray(conv(x))
    assert got.shape == want.shape and len(k) == nsp
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(conv(x[0])), want[0], rtol=1e-4, atol=1e-5)


def np_pool(x, k, s, reducer):
    n, c, h, w = x.shape
    oh, ow = (h - k[0]) // s[0] + 1, (w - k[1]) // s[1] + 1
    out = np.zeros((n, c, oh, ow), x.dtype)
    for i in range(oh):
        for j in range(ow):
            out[:, :, i, j] = reducer(
                x[:, :, i * s[0] : i * s[0] + k[0], j * s[1] : j * s[1] + k[1]], axis=(2, 3)
            )
    return out


def test_pooling_vs_numpy_under_jit_and_grad():
    x = _x(2, 3, 6, 5)
    mp, ap = nn.MaxPool2d(2), nn.AvgPool2d((3, 2), stride=(1, 2))
    np.testing.assert_allclose(np.asarray(fflow.jit(mp)(x)), np_pool(x, (2, 2), (2, 2), np.max))
    np.testing.assert_allclose(
        np.asarray(fflow.jit(ap)(x)), np_pool(x, (3, 2), (1, 2), np.mean), rtol=1e-5, atol=1e-6
    )
    # grad of max pooling: 1 at each window's argmax (windows do not overlap here)
    g = np.asarray(fflow.jit(fflow.grad(lambda x: jnp.sum(mp(x))))(x))
    want = np.zeros_like(x)
    for n, c, i, j in itertools.product(range(2), range(3), range(3), range(2)):
        win = x[n, c, 2 * i : 2 * i + 2, 2 * j : 2 * j + 2]
        a, b = np.unravel_index(np.argmax(win), win.shape)
        want[n, c, 2 * i + a, 2 * j + b] = 1
    np.testing.assert_array_equal(g, want)
    ga = np.asarray(fflow.grad(lambda x: jnp.sum(ap(x)))(x))
    assert ga.shape == x.shape and abs(ga.sum() - np_pool(x, (3, 2), (1, 2), np.mean).size) < 1e-3
    x1 = _x(2, 3, 7)
    np.testing.assert_allclose(
        np.asarray(nn.MaxPool1d(3, stride=2)(x1)),
        np.stack([x1[..., i : i + 3].max(-1) for i in range(0, 5, 2)], -1),
    )


def test_reduce_window_matches_jax_with_dilations():
    jax = pytest.importorskip("jax")
    x = _x(1, 5, 6, 2)
    args = ((1, 2, 3, 1), (1, 1, 2, 1), "SAME")
    kw = dict(base_dilation=(1, 2, 1, 1), window_dilation=(1, 1, 2, 1))
    f = lambda x: lax.reduce_window(x, -jnp.inf, lax.max, *args, **kw)
    fj = lambda x: jax.lax.reduce_window(x, -np.inf, jax.lax.max, *args, **kw)
    np.testing.assert_array_equal(np.asarray(fflow.jit(f)(x)), np.asarray(fj(x)))
    # JAX has no VJP for max windows with dilation: check ours by finite differences
    from fflow.test_util import check_grads

    check_grads(
        fflow.jit(lambda x: jnp.sin(f(x))), (x.astype(np.float64),), order=1, modes=("rev",)
    )
    s = lambda x: lax.reduce_window(
        x, 0.0, lax.add, (1, 3, 2, 1), (1, 2, 1, 1), "VALID", (1, 2, 1, 1)
    )
    sj = lambda x: jax.lax.reduce_window(
        x, 0.0, jax.lax.add, (1, 3, 2, 1), (1, 2, 1, 1), "VALID", (1, 2, 1, 1)
    )
    np.testing.assert_allclose(np.asarray(fflow.jit(s)(x)), np.asarray(sj(x)), rtol=1e-5, atol=1e-6)


def np_attention(q_in, k_in, v_in, mha, mask):
    def proj(lin, x):
        return x @ np.asarray(lin.weight) + np.asarray(lin.bias)

    b, t, _ = q_in.shape
    s = k_in.shape[1]
    h, d = mha.num_heads, mha.qk_size
    q = proj(mha.query_proj, q_in).reshape(b, t, h, d).transpose(0, 2, 1, 3)
    k = proj(mha.key_proj, k_in).reshape(b, s, h, d).transpose(0, 2, 1, 3)
    v = proj(mha.value_proj, v_in).reshape(b, s, h, d).transpose(0, 2, 1, 3)
    logits = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d)
    logits = np.where(mask, logits, -1e30)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = (p @ v).transpose(0, 2, 1, 3).reshape(b, t, h * d)
    return proj(mha.output_proj, out)


def test_multi_head_attention_vs_numpy_with_masks():
    mha = nn.MultiHeadAttention(num_heads=2, query_size=8, key=KEY)
    x = _x(3, 5, 8)
    causal = np.tril(np.ones((5, 5), bool))[None, None]
    np.testing.assert_allclose(
        np.asarray(mha(x, causal=True)), np_attention(x, x, x, mha, causal), rtol=1e-4, atol=1e-5
    )
    lengths = np.array([5, 3, 1])
    valid = np.arange(5)[None, :] < lengths[:, None]
    got = mha(x, padding_mask=jnp.asarray(valid))
    want = np_attention(x, x, x, mha, valid[:, None, None, :])
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)
    kv = _x(3, 4, 8, seed=5)
    mask = np.random.default_rng(0).random((3, 1, 5, 4)) > 0.3
    mask[..., 0] = True
    np.testing.assert_allclose(
        np.asarray(mha(x, kv, kv, mask=mask)),
        np_attention(x, kv, kv, mha, mask),
        rtol=1e-4,
        atol=1e-5,
    )
    np.testing.assert_allclose(
        np.asarray(mha(x[0], causal=True)),
        np_attention(x, x, x, mha, causal)[0],
        rtol=1e-4,
        atol=1e-5,
    )


def test_mlp_sequential_and_initializers():
    mlp = nn.MLP(3, 2, 16, 2, activation=nn.tanh, key=KEY)
    x = _x(4, 3)
    h = x
    for lin in mlp.layers[:-1]:
        h = np.tanh(h @ np.asarray(lin.weight) + np.asarray(lin.bias))
    want = h @ np.asarray(mlp.layers[-1].weight) + np.asarray(mlp.layers[-1].bias)
    np.testing.assert_allclose(np.asarray(mlp(x)), want, rtol=1e-5, atol=1e-5)
    seq = nn.Sequential([mlp.layers[0], nn.Lambda(nn.tanh), nn.Dropout(0.5, inference=True)])
    np.testing.assert_allclose(
        np.asarray(seq(x)),
        np.tanh(x @ np.asarray(mlp.layers[0].weight) + np.asarray(mlp.layers[0].bias)),
        rtol=1e-5,
        atol=1e-6,
    )
    w = nn.Linear(400, 300, key=KEY).weight
    assert abs(float(np.std(np.asarray(w))) - 1 / np.sqrt(400)) < 0.003  # lecun_normal
