"""Less common fflow.numpy functions (fflow/numpy/more.py) against NumPy."""

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp

RNG = np.random.RandomState(0)
M = RNG.randn(3, 4)
V = RNG.randn(5)
K = RNG.randn(3)

CASES = [
    ("append", lambda m: m.append(M, V)),
    ("append_axis", lambda m: m.append(M, M, axis=0)),
    ("insert", lambda m: m.insert(V, 2, 9.0)),
    ("insert_many", lambda m: m.insert(V, np.array([1, 3, 3]), 9.0)),
    ("insert_axis", lambda m: m.insert(M, 1, 5.0, axis=1)),
    ("insert_column", lambda m: m.insert(M, 1, K, axis=1)),
    ("delete", lambda m: m.delete(V, np.array([0, 2]))),
    ("delete_axis", lambda m: m.delete(M, 1, axis=1)),
    ("resize", lambda m: m.resize(V, (2, 4))),
    ("diagflat", lambda m: m.diagflat(K)),
    ("compress", lambda m: m.compress(np.array([True, False, True]), M, axis=0)),
    ("choose", lambda m: m.choose(np.array([0, 1, 2, 1]), [M[0], M[1], M[2]])),
    ("lexsort", lambda m: m.lexsort((np.array([1, 1, 0, 2]), np.array([2, 1, 1, 1])))),
    ("isin", lambda m: m.isin(np.array([1, 2, 3, 4]), np.array([2, 4]))),
    ("digitize", lambda m: m.digitize(V, np.array([-1.0, 0, 1]))),
    ("digitize_right", lambda m: m.digitize(V, np.array([-1.0, 0, 1]), right=True)),
    ("ediff1d", lambda m: m.ediff1d(V)),
    ("convolve", lambda m: m.convolve(V, K)),
    ("convolve_same", lambda m: m.convolve(V, K, mode="same")),
    ("convolve_valid", lambda m: m.convolve(K, V, mode="valid")),
    ("correlate", lambda m: m.correlate(V, K)),
    ("correlate_full", lambda m: m.correlate(V, K, mode="full")),
    ("cov", lambda m: m.cov(M)),
    ("cov_cols", lambda m: m.cov(M, rowvar=False)),
    ("corrcoef", lambda m: m.corrcoef(M)),
    ("polyval", lambda m: m.polyval(K, V)),
    ("polyadd", lambda m: m.polyadd(K, V)),
    ("polyder", lambda m: m.polyder(V)),
    ("vander", lambda m: m.vander(K)),
    ("trapezoid", lambda m: m.trapezoid(V)),
    ("gradient", lambda m: m.gradient(V)),
    ("ldexp", lambda m: m.ldexp(V, np.array([1, 2, 3, 0, -1]))),
    ("vecdot", lambda m: np.sum(M * M, axis=-1) if m is np else m.vecdot(M, M)),
    ("unravel_index", lambda m: m.unravel_index(np.array([5, 7]), (3, 4))),
    ("tril_indices", lambda m: m.tril_indices(3)),
    ("triu_indices", lambda m: m.triu_indices(3, 1, 4)),
    ("indices", lambda m: m.indices((2, 3))),
    ("mgrid", lambda m: m.mgrid[0:3, 0:2]),
    ("ogrid", lambda m: m.ogrid[0:3, 0:2]),
    ("unstack", lambda m: tuple(M[:, i] for i in range(4)) if m is np else m.unstack(M, axis=1)),
]


@pytest.mark.parametrize("name, fn", CASES, ids=[c[0] for c in CASES])
@pytest.mark.usefixtures("x64_case")  # float64 reference on purpose
def test_matches_numpy(name, fn):
    ours, ref = fn(jnp), fn(np)
    if isinstance(ref, (tuple, list)):
        assert len(ours) == len(ref)
        pairs = zip(ours, ref)
    else:
        pairs = [(ours, ref)]
    for o, r in pairs:
        o = np.asarray(o)
        assert o.shape == np.shape(r)
        np.testing.assert_allclose(o, r, rtol=1e-10, atol=1e-12)


@pytest.mark.usefixtures("x64_case")  # float64 reference on purpose
def test_vectorize_and_apply_along_axis():
    f = jnp.vectorize(lambda a, b: a * b + 1)
    np.testing.assert_allclose(np.asarray(f(M, V[:4])), M * V[:4] + 1)
    g = jnp.vectorize(lambda a, b: jnp.dot(a, b), signature="(n),(n)->()")
    np.testing.assert_allclose(np.asarray(g(M, V[:4])), M @ V[:4])
    np.testing.assert_allclose(np.asarray(fflow.jit(g)(M, V[:4])), M @ V[:4])
    h = lambda x: x.sum() + x[0]  # noqa: E731
    for axis in (0, 1):
        np.testing.assert_allclose(
            np.asarray(jnp.apply_along_axis(h, axis, M)), np.apply_along_axis(h, axis, M)
        )
    k = lambda x: x * 2  # noqa: E731
    np.testing.assert_allclose(np.asarray(jnp.apply_along_axis(k, 0, M)), 2 * M)


@pytest.mark.usefixtures("x64_case")  # float64 reference on purpose
def test_functional_updates():
    out = jnp.fill_diagonal(M, 0.0, inplace=False)
    ref = M.copy()
    np.fill_diagonal(ref, 0.0)
    np.testing.assert_array_equal(np.asarray(out), ref)
    idx = np.array([[0], [1], [2]])
    out = jnp.put_along_axis(M, idx, 9.0, axis=1, inplace=False)
    ref = M.copy()
    np.put_along_axis(ref, idx, 9.0, axis=1)
    np.testing.assert_array_equal(np.asarray(out), ref)
    with pytest.raises(ValueError, match="inplace=False"):
        jnp.fill_diagonal(M, 0.0)


def test_convolve_grad():
    g = fflow.grad(lambda a: jnp.sum(jnp.convolve(a, K) ** 2))(V)
    eps = 1e-6
    fd = [
        (np.sum(np.convolve(V + eps * e, K) ** 2) - np.sum(np.convolve(V - eps * e, K) ** 2))
        / (2 * eps)
        for e in np.eye(5)
    ]
    np.testing.assert_allclose(np.asarray(g), fd, rtol=1e-6)
