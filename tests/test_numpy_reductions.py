"""fflow.numpy reductions and order statistics against NumPy: drawn shapes, dtypes,
axes and keepdims; jit == eager; gradients against finite differences."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fflow
import fflow.numpy as jnp
from fflow.dtypes import canonical

SETTINGS = settings(max_examples=10, deadline=None)


@st.composite
def array_and_axis(draw, dtypes=(np.float32, np.float64, np.int32, np.int8, np.bool_)):
    dtype = draw(st.sampled_from(dtypes))
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4))
    if np.dtype(dtype).kind == "b":
        x = draw(hnp.arrays(dtype, shape))
    elif np.dtype(dtype).kind in "iu":
        x = draw(hnp.arrays(dtype, shape, elements=st.integers(-3, 3)))
    else:
        x = draw(hnp.arrays(dtype, shape, elements=st.floats(-3, 3, width=32)))
    nd = len(shape)
    axis = draw(
        st.one_of(
            st.none(),
            st.integers(-nd, nd - 1),
            st.lists(st.integers(0, nd - 1), min_size=1, max_size=nd, unique=True).map(tuple),
        )
    )
    return x, axis, draw(st.booleans())


# name: the NumPy dtype rule JAX follows (None: same as NumPy's result dtype)
REDUCTIONS = ["sum", "prod", "max", "min", "mean", "var", "std", "all", "any"]


def _expected_dtype(name, x):
    d = canonical(x.dtype)  # JAX's rule: float64 inputs are float32 unless x64 is on
    if name in ("all", "any"):
        return np.dtype(np.bool_)
    if name in ("mean", "var", "std"):
        return d if d.kind == "f" else np.dtype(np.float32)
    if name in ("sum", "prod") and (d.kind == "b" or (d.kind in "iu" and d.itemsize < 4)):
        return np.dtype(np.int32)
    return d


@pytest.mark.parametrize("name", REDUCTIONS)
@SETTINGS
@given(case=array_and_axis())
def test_reductions_match_numpy(name, case):
    x, axis, keepdims = case
    out = getattr(jnp, name)(x, axis=axis, keepdims=keepdims)
    expected = getattr(np, name)(
        x.astype(np.float64) if x.dtype.kind == "f" else x, axis=axis, keepdims=keepdims
    )
    assert out.dtype == _expected_dtype(name, x)
    if out.dtype.kind in "iu":
        expected = np.asarray(expected).astype(out.dtype)  # same wraparound as int32
    assert out.shape == np.shape(expected)
    tol = 1e-5 if out.dtype == np.float32 else 1e-10
    np.testing.assert_allclose(
        np.asarray(out, np.float64), np.asarray(expected, np.float64), rtol=tol, atol=tol
    )


@pytest.mark.parametrize("name", ["argmax", "argmin", "cumsum", "cumprod"])
@SETTINGS
@given(case=array_and_axis(dtypes=(np.float32, np.int32)))
def test_axis_functions_match_numpy(name, case):
    x, axis, _ = case
    if isinstance(axis, tuple):
        axis = axis[0]
    out = getattr(jnp, name)(x, axis=axis)
    expected = getattr(np, name)(x, axis=axis)
    if not name.startswith("arg"):
        expected = expected.astype(x.dtype)  # NumPy accumulates int32 in int64
    assert out.shape == expected.shape
    if name.startswith("arg"):
        assert out.dtype == np.int32
    else:
        assert out.dtype == x.dtype
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5)


@SETTINGS
@given(
    case=array_and_axis(dtypes=(np.float32, np.float64)),
    q=st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.73, 0.9, 1.0]),
)
def test_quantiles_match_numpy(case, q):
    x, axis, keepdims = case
    for method in ("linear", "lower", "higher", "midpoint", "nearest"):
        out = jnp.quantile(x, q, axis=axis, keepdims=keepdims, method=method)
        expected = np.quantile(x, q, axis=axis, keepdims=keepdims, method=method)
        np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        np.asarray(jnp.median(x, axis=axis, keepdims=keepdims)),
        np.median(x, axis=axis, keepdims=keepdims),
        rtol=1e-5,
        atol=1e-6,  # as the quantiles: a mean of float32 subnormals keeps few significant bits
    )
    np.testing.assert_allclose(
        np.asarray(jnp.percentile(x, np.array([10, 90]), axis=axis)),
        np.percentile(x, [10, 90], axis=axis),
        rtol=1e-5,
        atol=1e-6,
    )


def test_nan_functions():
    x = np.array([[1.0, np.nan, 3.0], [np.nan, np.nan, 2.0]], np.float32)
    for name in ("nansum", "nanmean", "nanmax", "nanmin", "nanprod", "nanvar", "nanstd"):
        for axis in (None, 0, 1):
            with np.errstate(all="ignore"):
                import warnings

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    expected = getattr(np, name)(x, axis=axis)
            np.testing.assert_allclose(
                np.asarray(getattr(jnp, name)(x, axis=axis)), expected, rtol=1e-6
            )
    i = np.array([[1, 5], [3, 2]], np.int32)
    assert jnp.nanmax(i).dtype == np.int32 and int(jnp.nanmax(i)) == 5
    assert jnp.nanmean(i).dtype == np.float32


def test_where_initial_and_ddof():
    x = np.arange(12.0, dtype=np.float32).reshape(3, 4)
    mask = x % 3 != 0
    np.testing.assert_allclose(np.asarray(jnp.sum(x, where=mask)), np.sum(x, where=mask))
    np.testing.assert_allclose(
        np.asarray(jnp.max(x, axis=1, where=mask, initial=-1.0)),
        np.max(x, axis=1, where=mask, initial=-1.0),
    )
    np.testing.assert_allclose(
        np.asarray(jnp.mean(x, axis=0, where=mask)), np.mean(x, axis=0, where=mask)
    )
    np.testing.assert_allclose(np.asarray(jnp.var(x, axis=1, ddof=1)), np.var(x, axis=1, ddof=1))
    assert float(jnp.sum(x, initial=10.0)) == np.sum(x) + 10


def test_misc_statistics():
    x = np.float32([0.5, 1.5, 1.5, 3.0, -1.0])
    np.testing.assert_array_equal(
        np.asarray(jnp.bincount(np.int32([0, 1, 1, 5]))), [1, 2, 0, 0, 0, 1]
    )
    counts, edges = jnp.histogram(x, bins=4)
    ref_counts, ref_edges = np.histogram(x, bins=4)
    np.testing.assert_allclose(np.asarray(counts), ref_counts)
    np.testing.assert_allclose(np.asarray(edges), ref_edges, rtol=1e-6)
    xp, fp = np.float32([0, 1, 2]), np.float32([0, 10, 5])
    q = np.float32([-1, 0.5, 1.5, 3])
    np.testing.assert_allclose(np.asarray(jnp.interp(q, xp, fp)), np.interp(q, xp, fp))
    a, b = np.float32([[1, 2, 3]]), np.float32([[4, 5, 7]])
    np.testing.assert_allclose(np.asarray(jnp.cross(a, b)), np.cross(a, b))
    c = np.int32([-2, 0, 3])
    np.testing.assert_array_equal(
        np.asarray(jnp.select([c < 0, c > 0], [c * 10, c * 100], -1)),
        np.select([c < 0, c > 0], [c * 10, c * 100], -1),
    )
    n = np.float32([np.nan, 1, 2])
    m = np.float32([0, np.nan, 3])
    np.testing.assert_array_equal(np.asarray(jnp.fmax(n, m)), np.fmax(n, m))
    np.testing.assert_array_equal(np.asarray(jnp.fmin(n, m)), np.fmin(n, m))


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: jnp.sum(x * x, axis=1),
        lambda x: jnp.mean(x, axis=0),
        lambda x: jnp.var(x),
        lambda x: jnp.std(x, axis=1),
        lambda x: jnp.max(x, axis=1),
        lambda x: jnp.prod(x, axis=0),
        lambda x: jnp.cumsum(x, axis=1),
        lambda x: jnp.cumprod(x, axis=0),
        lambda x: jnp.median(x, axis=1),
        lambda x: jnp.quantile(x, 0.3),
        lambda x: jnp.nanmean(x),
    ],
)
@pytest.mark.usefixtures("x64_case")  # float64 reference on purpose
def test_reduction_jit_and_grad(fn):
    x = np.random.RandomState(0).rand(3, 4) + 0.5
    np.testing.assert_allclose(np.asarray(fflow.jit(fn)(x)), np.asarray(fn(x)), rtol=1e-12)
    w = np.random.RandomState(1).rand(*np.shape(fn(x)))
    g = np.asarray(fflow.grad(lambda v: jnp.sum(fn(v) * w))(x))
    eps = 1e-6
    fd = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = eps
        fd[i] = (np.sum(np.asarray(fn(x + e)) * w) - np.sum(np.asarray(fn(x - e)) * w)) / (2 * eps)
    np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-7)
