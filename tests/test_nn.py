"""fflow.nn and fflow.scipy.special against NumPy references, finite differences and
(when installed) jax.nn itself."""

import math

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp
import fflow.random as random
from fflow import nn
from fflow.experimental import enable_x64
from fflow.scipy import special

_erf = np.vectorize(math.erf)


def _np_softplus(x):
    return np.logaddexp(x, 0)


def _np_sigmoid(x):
    return 1 / (1 + np.exp(-x))


NP_REF = {
    "relu": lambda x: np.maximum(x, 0),
    "relu6": lambda x: np.clip(x, 0, 6),
    "sigmoid": _np_sigmoid,
    "softplus": _np_softplus,
    "log_sigmoid": lambda x: -_np_softplus(-x),
    "silu": lambda x: x * _np_sigmoid(x),
    "gelu": lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))),
    "elu": lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0))),
    "leaky_relu": lambda x: np.where(x >= 0, x, 0.01 * x),
    "tanh": np.tanh,
    "soft_sign": lambda x: x / (np.abs(x) + 1),
    "selu": lambda x: (
        1.0507009873554805 * np.where(x > 0, x, 1.6732632423543772 * np.expm1(np.minimum(x, 0)))
    ),
    "hard_tanh": lambda x: np.clip(x, -1, 1),
    "mish": lambda x: x * np.tanh(_np_softplus(x)),
}

X = np.linspace(-7.3, 7.1, 41).astype(np.float32)


@pytest.mark.parametrize("name", sorted(NP_REF))
def test_activation_matches_numpy(name):
    out = getattr(nn, name)(X)
    assert out.dtype == np.float32 and out.shape == X.shape
    expected = NP_REF[name](X.astype(np.float64))
    np.testing.assert_allclose(np.asarray(out), expected, rtol=2e-5, atol=2e-6)


def test_gelu_exact():
    out = nn.gelu(X, approximate=False)
    expected = 0.5 * X * (1 + _erf(X.astype(np.float64) / np.sqrt(2)))
    np.testing.assert_allclose(np.asarray(out), expected, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize(
    "name", ["sigmoid", "softplus", "log_sigmoid", "silu", "gelu", "elu", "tanh", "mish"]
)
@pytest.mark.usefixtures("x64_case")  # float64 reference on purpose
def test_activation_grad_matches_finite_differences(name):
    f = getattr(nn, name)
    x = np.linspace(-3.1, 2.9, 13).astype(np.float64)
    g = np.asarray(fflow.grad(lambda v: jnp.sum(f(v)))(x))
    eps = 1e-6
    fd = (np.asarray(f(x + eps)) - np.asarray(f(x - eps))) / (2 * eps)
    np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-7)


def test_relu_derivative_at_zero_is_zero():
    g = fflow.grad(lambda v: jnp.sum(nn.relu(v)))(jnp.array([-1.0, 0.0, 2.0]))
    assert np.asarray(g).tolist() == [0.0, 0.0, 1.0]
    assert np.isnan(np.asarray(nn.relu(jnp.array([np.nan])))[0])


def _np_softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_family(axis):
    x = np.random.RandomState(0).randn(3, 4, 5).astype(np.float32) * 3
    np.testing.assert_allclose(
        np.asarray(nn.softmax(x, axis=axis)), _np_softmax(x, axis), rtol=1e-5, atol=1e-7
    )
    np.testing.assert_allclose(
        np.asarray(nn.log_softmax(x, axis=axis)),
        np.log(_np_softmax(x.astype(np.float64), axis)),
        rtol=1e-5,
        atol=1e-5,
    )
    lse = np.log(np.sum(np.exp(x.astype(np.float64)), axis=axis))
    np.testing.assert_allclose(np.asarray(nn.logsumexp(x, axis=axis)), lse, rtol=1e-5)
    np.testing.assert_allclose(
        np.asarray(special.logsumexp(x, axis=axis, keepdims=True)),
        np.expand_dims(lse, axis),
        rtol=1e-5,
    )


def test_softmax_and_logsumexp_are_stable_for_large_inputs():
    x = jnp.array([1e4, 1e4 - 1.0, -1e4])
    assert np.isfinite(np.asarray(nn.softmax(x))).all()
    assert np.isfinite(np.asarray(nn.log_softmax(x))).all()
    np.testing.assert_allclose(float(nn.logsumexp(x)), 1e4 + np.log1p(np.exp(-1.0)), rtol=1e-6)
    for f in (
        lambda v: nn.softmax(v)[0],
        lambda v: nn.log_softmax(v)[1],
        lambda v: nn.logsumexp(v),
    ):
        g = np.asarray(fflow.grad(f)(x))
        assert np.isfinite(g).all()
    g = np.asarray(fflow.grad(lambda v: nn.logsumexp(v))(x))
    np.testing.assert_allclose(g, _np_softmax(np.asarray(x, np.float64), -1), atol=1e-6)
    assert float(nn.logsumexp(jnp.array([-np.inf, -np.inf]))) == -np.inf


def test_softmax_grad_matches_finite_differences():
    x = np.random.RandomState(1).randn(6)
    w = np.random.RandomState(2).randn(6)
    g = np.asarray(fflow.grad(lambda v: jnp.sum(nn.softmax(v) * w))(x))
    eps = 1e-6
    fd = [
        (np.sum(_np_softmax(x + eps * e, -1) * w) - np.sum(_np_softmax(x - eps * e, -1) * w))
        / (2 * eps)
        for e in np.eye(6)
    ]
    np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-8)


def test_logsumexp_with_b_and_sign():
    a = np.float32([1.0, 2.0, 3.0])
    b = np.float32([1.0, -1.0, 0.5])
    out, sign = nn.logsumexp(a, b=b, return_sign=True)
    total = np.sum(b * np.exp(a.astype(np.float64)))
    np.testing.assert_allclose(float(out), np.log(abs(total)), rtol=1e-6)
    assert float(sign) == np.sign(total)


def test_one_hot():
    x = jnp.array([0, 2, 5, -1])
    out = np.asarray(nn.one_hot(x, 3))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, np.eye(3, dtype=np.float32)[[0, 2]].tolist() + [[0] * 3] * 2)
    out0 = np.asarray(nn.one_hot(jnp.array([[1, 0]]), 2, axis=0, dtype=jnp.int32))
    assert out0.shape == (2, 1, 2) and out0.dtype == np.int32
    np.testing.assert_array_equal(out0[:, 0, :], [[0, 1], [1, 0]])
    jitted = fflow.jit(lambda v: nn.one_hot(v, 4))(jnp.array([3, 1]))
    np.testing.assert_array_equal(np.asarray(jitted), np.eye(4)[[3, 1]])


def test_standardize():
    x = np.random.RandomState(3).randn(4, 7).astype(np.float32) * 5 + 2
    out = np.asarray(nn.standardize(x, axis=-1))
    ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_special():
    x = np.float32([0.1, 0.5, 0.9])
    np.testing.assert_allclose(np.asarray(special.logit(x)), np.log(x / (1 - x)), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(special.expit(special.logit(x))), x, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(special.erf(x)), _erf(x), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(special.erfinv(special.erf(x))), x, rtol=1e-5)
    assert float(special.xlogy(0.0, 0.0)) == 0.0
    np.testing.assert_allclose(float(special.xlogy(2.0, 3.0)), 2 * np.log(3), rtol=1e-6)


@pytest.mark.parametrize(
    "name, scale",
    [
        ("glorot_uniform", 2 / (50 + 30)),
        ("glorot_normal", 2 / (50 + 30)),
        ("he_uniform", 2 / 50),
        ("he_normal", 2 / 50),
        ("lecun_normal", 1 / 50),
        ("lecun_uniform", 1 / 50),
    ],
)
def test_initializer_variance(name, scale):
    init = getattr(nn.initializers, name)()
    w = np.asarray(init(random.PRNGKey(0), (50, 30)))
    assert w.shape == (50, 30) and w.dtype == np.float32
    assert abs(w.var() / scale - 1) < 0.1
    assert abs(w.mean()) < 0.02


def test_simple_initializers():
    key = random.PRNGKey(0)
    assert np.asarray(nn.initializers.zeros(key, (2, 3))).sum() == 0
    assert np.asarray(nn.initializers.ones(key, (2, 3), jnp.float64)).dtype == np.float32
    with enable_x64():  # float64 needs x64, as in JAX
        assert np.asarray(nn.initializers.ones(key, (2, 3), jnp.float64)).dtype == np.float64
    w = np.asarray(nn.initializers.normal(0.5)(key, (4000,)))
    assert abs(w.std() - 0.5) < 0.03
    q = np.asarray(nn.initializers.orthogonal()(key, (6, 4)))
    np.testing.assert_allclose(q.T @ q, np.eye(4), atol=1e-5)


@pytest.mark.parametrize(
    "name",
    sorted(NP_REF) + ["gelu_exact", "softmax", "log_softmax", "logsumexp", "standardize"],
)
def test_same_as_jax(name):
    jax = pytest.importorskip("jax")
    x = np.random.RandomState(4).randn(3, 5).astype(np.float32) * 4
    if name == "gelu_exact":
        ours, theirs = nn.gelu(x, approximate=False), jax.nn.gelu(x, approximate=False)
    elif name == "logsumexp":
        ours, theirs = nn.logsumexp(x, axis=1), jax.nn.logsumexp(x, axis=1)
    else:
        ours, theirs = getattr(nn, name)(x), getattr(jax.nn, name)(x)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["glorot_normal", "he_uniform", "lecun_normal", "orthogonal"])
def test_initializers_same_as_jax(name):
    jax = pytest.importorskip("jax")
    ours = getattr(nn.initializers, name)()(random.PRNGKey(1), (8, 5))
    theirs = getattr(jax.nn.initializers, name)()(jax.random.PRNGKey(1), (8, 5))
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-5, atol=1e-6)


def _np_attention(q, k, v, mask=None):
    logits = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
    if mask is not None:
        logits = np.where(mask, logits, -1e30)
    return np.einsum("bnts,bsnh->btnh", _np_softmax(logits, -1), v)


def test_dot_product_attention():
    rng = np.random.RandomState(5)
    q, k, v = (rng.randn(2, s, 4, 8) for s in (5, 6, 6))
    np.testing.assert_allclose(
        np.asarray(nn.dot_product_attention(q, k, v)),
        _np_attention(q, k, v),
        rtol=1e-5,
        atol=1e-6,  # float32 (the inputs are canonicalised), near-zero outputs
    )
    causal = np.tril(np.ones((5, 5), bool))
    np.testing.assert_allclose(
        np.asarray(nn.dot_product_attention(q, k[:, :5], v[:, :5], is_causal=True)),
        _np_attention(q, k[:, :5], v[:, :5], causal),
        rtol=1e-5,
        atol=1e-6,
    )
    # grouped-query attention: two key/value heads serve four query heads
    k2, v2 = k[:, :, :2], v[:, :, :2]
    ref = _np_attention(q, np.repeat(k2, 2, axis=2), np.repeat(v2, 2, axis=2))
    np.testing.assert_allclose(
        np.asarray(nn.dot_product_attention(q, k2, v2)), ref, rtol=1e-5, atol=1e-6
    )
    g = fflow.grad(lambda qq: jnp.sum(nn.dot_product_attention(qq, k, v)))(q)
    assert np.isfinite(np.asarray(g)).all()


def test_small_helpers():
    x = np.float32([1e-5, 0.5, 1.0, 30.0])
    np.testing.assert_allclose(
        np.asarray(nn.log1mexp(x)), np.log1p(-np.exp(-x.astype(np.float64))), rtol=1e-5
    )
    y = np.random.RandomState(0).randn(3, 4)
    np.testing.assert_allclose(
        np.asarray(nn.logmeanexp(y, axis=1)), np.log(np.mean(np.exp(y), axis=1)), rtol=1e-6
    )
    np.testing.assert_array_equal(
        np.asarray(nn.sparse_sigmoid(np.float32([-2, 0, 3]))), [0, 0.5, 1]
    )


@pytest.mark.usefixtures("x64_case")  # float64 reference on purpose
def test_special_gamma_functions_match_scipy():
    sp = pytest.importorskip("scipy.special")
    x = np.float64([0.3, 0.7, 1.5, 3.0, 7.25])
    np.testing.assert_allclose(np.asarray(special.gammaln(x)), sp.gammaln(x), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(special.digamma(x)), sp.digamma(x), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(special.polygamma(1, x)), sp.polygamma(1, x), rtol=1e-12)
    np.testing.assert_allclose(
        np.asarray(special.gamma(np.float64([-1.5, 0.5, 4]))), sp.gamma([-1.5, 0.5, 4])
    )
    np.testing.assert_allclose(np.asarray(special.betaln(x, 2.0)), sp.betaln(x, 2.0), rtol=1e-12)
    # derivatives chain: lgamma' = digamma, digamma' = polygamma(1)
    g = fflow.grad(lambda v: jnp.sum(special.gammaln(v)))(x)
    np.testing.assert_allclose(np.asarray(g), sp.digamma(x), rtol=1e-12)
    h = fflow.grad(lambda v: jnp.sum(special.digamma(v)))(x)
    np.testing.assert_allclose(np.asarray(h), sp.polygamma(1, x), rtol=1e-12)


@pytest.mark.usefixtures("x64_case")  # float64 reference on purpose
def test_stats_match_scipy():
    st = pytest.importorskip("scipy.stats")
    from fflow.scipy import stats

    x = np.float64([0.2, 0.7, 1.5, 3.0])
    k = np.float64([0, 1, 3, 2])
    checks = [
        (stats.norm.logpdf(x, 1.0, 2.0), st.norm.logpdf(x, 1.0, 2.0)),
        (stats.norm.cdf(x, 1.0, 2.0), st.norm.cdf(x, 1.0, 2.0)),
        (stats.norm.ppf(np.float64([0.1, 0.5, 0.9])), st.norm.ppf([0.1, 0.5, 0.9])),
        (stats.expon.logpdf(x, 0.5, 2.0), st.expon.logpdf(x, 0.5, 2.0)),
        (stats.laplace.logpdf(x, 0.5, 2.0), st.laplace.logpdf(x, 0.5, 2.0)),
        (stats.uniform.logpdf(x, 0.5, 2.0), st.uniform.logpdf(x, 0.5, 2.0)),
        (stats.bernoulli.logpmf(np.float64([0, 1]), 0.3), st.bernoulli.logpmf([0, 1], 0.3)),
        (stats.poisson.logpmf(k, 2.5), st.poisson.logpmf(k, 2.5)),
        (stats.gamma.logpdf(x, 2.0, scale=1.5), st.gamma.logpdf(x, 2.0, scale=1.5)),
        (stats.beta.logpdf(np.float64([0.1, 0.9]), 2.0, 3.0), st.beta.logpdf([0.1, 0.9], 2.0, 3.0)),
        (stats.t.logpdf(x, 4.0), st.t.logpdf(x, 4.0)),
    ]
    for ours, ref in checks:
        np.testing.assert_allclose(np.asarray(ours), ref, rtol=1e-10)
    cov = np.array([[2.0, 0.3], [0.3, 1.0]])
    pts = np.array([[0.1, 0.2], [1.0, -1.0]])
    np.testing.assert_allclose(
        np.asarray(stats.multivariate_normal.logpdf(pts, np.array([0.0, 0.5]), cov)),
        st.multivariate_normal.logpdf(pts, [0.0, 0.5], cov),
        rtol=1e-10,
    )
    g = fflow.grad(lambda m: jnp.sum(stats.norm.logpdf(x, m, 2.0)))(1.0)
    np.testing.assert_allclose(float(g), np.sum((x - 1.0) / 4.0), rtol=1e-6)  # f32 mean
