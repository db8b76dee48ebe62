"""fflow.random: Threefry known answers, statistics, determinism, jit == eager, and
(when jax is installed) the very same numbers as jax.random."""

import math

import numpy as np
import pytest
from fflow.primitives.random_bits import threefry2x32

import fflow
import fflow.numpy as jnp
import fflow.random as random
from fflow.experimental import enable_x64


def test_threefry_known_answers():
    # Random123's known-answer vectors for threefry2x32_20
    cases = [
        ((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
        ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
        ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
    ]
    for (k0, k1), (x0, x1), expected in cases:
        y0, y1 = threefry2x32(k0, k1, x0, x1)
        assert (int(y0), int(y1)) == expected


def test_keys_and_split_follow_the_counter_definition():
    key = random.PRNGKey(42)
    assert key.dtype == np.uint32 and key.tolist() == [0, 42]
    keys = np.asarray(random.split(key, 4))
    for i in range(4):
        y0, y1 = threefry2x32(0, 42, 0, i)
        assert keys[i].tolist() == [int(y0), int(y1)]
    y0, y1 = threefry2x32(0, 42, 0, 7)
    assert np.asarray(random.fold_in(key, 7)).tolist() == [int(y0), int(y1)]
    bits = np.asarray(random.bits(key, (3,)))
    for i in range(3):
        y0, y1 = threefry2x32(0, 42, 0, i)
        assert int(bits[i]) == int(y0 ^ y1)


def test_determinism_and_split_independence():
    key = random.PRNGKey(0)
    a = np.asarray(random.normal(key, (1000,)))
    b = np.asarray(random.normal(key, (1000,)))
    np.testing.assert_array_equal(a, b)
    k1, k2 = random.split(key)
    x = np.asarray(random.normal(k1, (5000,)))
    y = np.asarray(random.normal(k2, (5000,)))
    assert not np.array_equal(x, y)
    assert abs(np.corrcoef(x, y)[0, 1]) < 0.05
    assert len({tuple(np.asarray(k).tolist()) for k in random.split(key, 100)}) == 100


def _ks_stat(samples, cdf):
    x = np.sort(samples)
    n = len(x)
    c = cdf(x)
    return max(np.max(np.arange(1, n + 1) / n - c), np.max(c - np.arange(n) / n))


def test_uniform_statistics():
    x = np.asarray(random.uniform(random.PRNGKey(1), (20000,), minval=-2.0, maxval=3.0))
    assert x.dtype == np.float32 and x.min() >= -2 and x.max() < 3
    assert abs(x.mean() - 0.5) < 0.05 and abs(x.var() - 25 / 12) < 0.1
    assert _ks_stat(x, lambda v: (v + 2) / 5) < 1.63 / math.sqrt(len(x))  # 1% level


def test_normal_statistics():
    x = np.asarray(random.normal(random.PRNGKey(2), (20000,)), np.float64)
    assert abs(x.mean()) < 0.03 and abs(x.std() - 1) < 0.03
    cdf = np.vectorize(lambda v: 0.5 * (1 + math.erf(v / math.sqrt(2))))
    assert _ks_stat(x, cdf) < 1.63 / math.sqrt(len(x))
    assert random.normal(random.PRNGKey(2), (10,), dtype=np.float64).dtype == np.float32
    with enable_x64():  # as in JAX, float64 needs x64
        x64 = random.normal(random.PRNGKey(2), (10,), dtype=np.float64)
        assert x64.dtype == np.float64


def test_discrete_distributions():
    key = random.PRNGKey(3)
    r = np.asarray(random.randint(key, (10000,), 3, 10))
    assert r.dtype == np.int32 and r.min() == 3 and r.max() == 9
    counts = np.bincount(r - 3, minlength=7)
    assert counts.min() > 10000 / 7 * 0.85
    b = np.asarray(random.bernoulli(key, 0.3, (10000,)))
    assert b.dtype == np.bool_ and abs(b.mean() - 0.3) < 0.02
    p = np.asarray(random.permutation(key, 50))
    assert sorted(p.tolist()) == list(range(50)) and p.tolist() != list(range(50))
    logits = jnp.log(jnp.array([0.1, 0.6, 0.3]))
    c = np.asarray(random.categorical(key, logits, shape=(20000,)))
    np.testing.assert_allclose(np.bincount(c, minlength=3) / 20000, [0.1, 0.6, 0.3], atol=0.02)
    ch = np.asarray(random.choice(key, 10, (5,), replace=False))
    assert len(set(ch.tolist())) == 5
    t = np.asarray(random.truncated_normal(key, -1.0, 0.5, (5000,)))
    assert t.min() > -1 and t.max() < 0.5


def test_jit_matches_eager():
    key = random.PRNGKey(5)

    def draw(k):
        k1, k2, k3 = random.split(k, 3)
        return (
            random.uniform(k1, (4, 3)),
            random.normal(k2, (7,)),
            random.randint(k3, (5,), 0, 100),
            random.fold_in(k, 3),
            random.permutation(k1, 6),
        )

    eager = draw(key)
    staged = fflow.jit(draw)(key)
    for a, b in zip(eager, staged):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_grad_through_sampling_parameters():
    key = random.PRNGKey(0)
    g = fflow.grad(lambda lo: jnp.sum(random.uniform(key, (10,), minval=lo, maxval=2.0)))(0.5)
    u = np.asarray(random.uniform(key, (10,)))
    np.testing.assert_allclose(float(g), np.sum(1 - u), rtol=1e-5)


def test_bad_key_names_the_fix():
    with pytest.raises(Exception, match="PRNGKey"):
        random.normal(jnp.zeros(2), (3,))


@pytest.mark.parametrize(
    "name, fn",
    [
        ("split", lambda r, k: r.split(k, 5)),
        ("fold_in", lambda r, k: r.fold_in(k, 123)),
        ("bits", lambda r, k: r.bits(k, (7,))),
        ("uniform", lambda r, k: r.uniform(k, (100,), minval=-2.0, maxval=5.0)),
        ("uniform16", lambda r, k: r.uniform(k, (10,), dtype=np.float16)),
        ("normal", lambda r, k: r.normal(k, (200,))),
        ("bernoulli", lambda r, k: r.bernoulli(k, 0.3, (20,))),
        ("randint", lambda r, k: r.randint(k, (20,), -5, 1000)),
        ("randint_u8", lambda r, k: r.randint(k, (20,), 0, 256, np.uint8)),
        ("permutation", lambda r, k: r.permutation(k, 10)),
        (
            "categorical",
            lambda r, k: r.categorical(k, np.float32([[0.1, 0.5, 2.0]] * 2), shape=(5, 2)),
        ),
        ("truncated_normal", lambda r, k: r.truncated_normal(k, -1.0, 2.0, (10,))),
        ("gumbel", lambda r, k: r.gumbel(k, (10,))),
        ("choice", lambda r, k: r.choice(k, 10, (4,), replace=False)),
        ("exponential", lambda r, k: r.exponential(k, (5,))),
    ],
)
def test_same_numbers_as_jax(name, fn):
    jax = pytest.importorskip("jax")
    ours = np.asarray(fn(random, random.PRNGKey(3)))
    theirs = np.asarray(fn(jax.random, jax.random.PRNGKey(3)))
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    if ours.dtype.kind in "fV":
        np.testing.assert_allclose(
            ours.astype(np.float64), theirs.astype(np.float64), rtol=2e-6, atol=2e-6
        )
    else:
        np.testing.assert_array_equal(ours, theirs)


def test_vmap_over_keys_matches_a_loop():
    keys = random.split(random.PRNGKey(0), 3)
    batched = fflow.vmap(lambda k: random.normal(k, (2,)))(keys)
    looped = np.stack([np.asarray(random.normal(k, (2,))) for k in keys])
    np.testing.assert_array_equal(np.asarray(batched), looped)
    folded = fflow.vmap(lambda i: random.fold_in(random.PRNGKey(1), i))(
        np.arange(3, dtype=np.uint32)
    )
    expected = np.stack([np.asarray(random.fold_in(random.PRNGKey(1), i)) for i in range(3)])
    np.testing.assert_array_equal(np.asarray(folded), expected)
    perms = fflow.jit(fflow.vmap(lambda k: random.permutation(k, 5)))(keys)
    expected = np.stack([np.asarray(random.permutation(k, 5)) for k in keys])
    np.testing.assert_array_equal(np.asarray(perms), expected)


def test_more_distributions_statistics():
    key = random.PRNGKey(11)
    n = 20000
    x = np.asarray(random.lognormal(key, 0.5, (n,)), np.float64)
    assert abs(np.log(x).std() - 0.5) < 0.02
    x = np.asarray(random.exponential(key, (n,)), np.float64)
    assert abs(x.mean() - 1) < 0.03
    x = np.asarray(random.geometric(key, 0.25, (n,)))
    assert x.min() >= 1 and abs(x.mean() - 4) < 0.15
    x = np.asarray(random.rayleigh(key, 2.0, (n,)), np.float64)
    assert abs(x.mean() - 2 * np.sqrt(np.pi / 2)) < 0.05
    cov = np.array([[2.0, 0.6], [0.6, 1.0]])
    x = np.asarray(random.multivariate_normal(key, np.array([1.0, -1.0]), cov, (n,)), np.float64)
    np.testing.assert_allclose(x.mean(0), [1, -1], atol=0.05)
    np.testing.assert_allclose(np.cov(x.T), cov, atol=0.06)
    q = np.asarray(random.orthogonal(key, 4), np.float64)
    np.testing.assert_allclose(q @ q.T, np.eye(4), atol=1e-5)
    x = np.asarray(random.maxwell(key, (n,)), np.float64)
    assert abs(x.mean() - 2 * np.sqrt(2 / np.pi)) < 0.03


@pytest.mark.parametrize(
    "name, fn",
    [
        ("cauchy", lambda r, k: r.cauchy(k, (5,))),
        ("lognormal", lambda r, k: r.lognormal(k, 0.5, (5,))),
        ("rayleigh", lambda r, k: r.rayleigh(k, 2.0, (5,))),
        ("pareto", lambda r, k: r.pareto(k, 3.0, (5,))),
        ("weibull_min", lambda r, k: r.weibull_min(k, 2.0, 1.5, (5,))),
        ("geometric", lambda r, k: r.geometric(k, 0.3, (5,))),
        (
            "multivariate_normal",
            lambda r, k: r.multivariate_normal(k, np.zeros(3), np.eye(3) * 2 + 0.5, (4,)),
        ),
    ],
)
def test_more_distributions_same_as_jax(name, fn):
    jax = pytest.importorskip("jax")
    ours = np.asarray(fn(random, random.PRNGKey(7)))
    theirs = np.asarray(fn(jax.random, jax.random.PRNGKey(7)))
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=2e-5, atol=2e-5)


def test_gamma_family_statistics():
    key = random.PRNGKey(3)
    for a in (0.3, 1.0, 4.5):
        x = np.asarray(random.gamma(key, a, (4000,)), np.float64)
        assert x.min() > 0
        assert abs(x.mean() - a) < 0.1 * max(a, 1) and abs(x.var() - a) < 0.25 * max(a, 1)
    b = np.asarray(random.beta(key, 2.0, 5.0, (4000,)), np.float64)
    assert abs(b.mean() - 2 / 7) < 0.01
    d = np.asarray(random.dirichlet(key, np.array([1.0, 2.0, 3.0]), (2000,)), np.float64)
    np.testing.assert_allclose(d.sum(-1), 1, rtol=1e-5)
    np.testing.assert_allclose(d.mean(0), [1 / 6, 2 / 6, 3 / 6], atol=0.015)
    c = np.asarray(random.chisquare(key, 3.0, (4000,)), np.float64)
    assert abs(c.mean() - 3) < 0.15
    staged = fflow.jit(lambda k: random.gamma(k, 0.5, (7,)))(key)
    np.testing.assert_allclose(
        np.asarray(staged), np.asarray(random.gamma(key, 0.5, (7,))), rtol=1e-6
    )


@pytest.mark.parametrize(
    "name, fn",
    [
        ("gamma", lambda r, k: r.gamma(k, 2.5, (6,))),
        ("beta", lambda r, k: r.beta(k, 2.0, 3.0, (5,))),
        ("dirichlet", lambda r, k: r.dirichlet(k, np.array([1.0, 2.0, 3.0], np.float32), (2,))),
        ("t", lambda r, k: r.t(k, 5.0, (4,))),
    ],
)
def test_gamma_family_same_as_jax(name, fn):
    jax = pytest.importorskip("jax")
    ours = np.asarray(fn(random, random.PRNGKey(7)))
    theirs = np.asarray(fn(jax.random, jax.random.PRNGKey(7)))
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=2e-5, atol=2e-6)


def test_poisson():
    key = random.PRNGKey(0)
    for lam in (0.7, 4.0, 30.0):
        x = np.asarray(random.poisson(key, lam, (5000,)))
        assert x.dtype == np.int32 and x.min() >= 0
        assert abs(x.mean() - lam) < 0.06 * lam + 0.03 and abs(x.var() - lam) < 0.12 * lam + 0.05
    lam = np.float32([0.0, 2.0, 15.0, 40.0])
    np.testing.assert_array_equal(
        np.asarray(fflow.jit(lambda k: random.poisson(k, lam))(key)),
        np.asarray(random.poisson(key, lam)),
    )
    assert int(random.poisson(key, 0.0)) == 0


def test_poisson_same_as_jax():
    jax = pytest.importorskip("jax")
    lam = np.float32([0.0, 0.5, 3.0, 15.0, 40.0])
    ours = np.asarray(random.poisson(random.PRNGKey(4), lam))
    theirs = np.asarray(jax.random.poisson(jax.random.PRNGKey(4), lam))
    np.testing.assert_array_equal(ours, theirs)
