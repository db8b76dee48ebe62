"""Regression tests for JAX-compatibility fixes (expected values recorded from JAX
0.10.2; no JAX needed)."""

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp
from fflow import lax


def test_weak_types_follow_jax():
    i = jnp.arange(3)
    assert (i + 1.5).weak_type and (i + 1.5).dtype == np.float32
    assert not (i * 2).weak_type
    assert (jnp.array(1.5) * 2).weak_type
    assert not (jnp.ones(2) + 1).weak_type
    assert fflow.grad(lambda x: x**3)(2.0).weak_type  # grad of a Python float
    assert not fflow.grad(lambda x: x**3)(jnp.float32(2.0)).weak_type
    assert fflow.jit(lambda x, y: x * y + 1)(2.0, 3.0).weak_type
    assert jnp.zeros_like(jnp.array(3.0)).weak_type
    # weak f32 meets f16: f16 (the reason weak types matter for values)
    assert (jnp.ones(2, jnp.float16) * (jnp.arange(2) + 0.5)).dtype == np.float16


def test_lax_unary_of_python_scalar_is_float32():
    r = lax.exp(1.0)
    assert r.dtype == np.float32 and r.weak_type
    np.testing.assert_allclose(float(r), 2.7182817, rtol=1e-6)
    assert lax.add(1, 2).dtype == np.int32


def test_repr_matches_jax():
    assert repr(jnp.array(3)) == "Array(3, dtype=int32, weak_type=True)"
    assert repr(jnp.array([])) == "Array([], shape=(0,), dtype=float32)"
    assert repr(jnp.arange(3, dtype=jnp.int8)) == "Array([0, 1, 2], dtype=int8)"


def test_shape_errors_are_type_and_value_errors():
    for fn in (
        lambda: jnp.ones(3) + jnp.ones(4),
        lambda: jnp.ones(6).reshape(4, 2),
        lambda: jnp.ones((2, 3)) @ jnp.ones((2, 3)),
    ):
        with pytest.raises(TypeError):
            fn()
        with pytest.raises(ValueError):
            fn()


def test_right_shift_operator():
    a = jnp.array([5, -7, 12, 0])
    assert (a >> 1).tolist() == [2, -4, 6, 0]
    assert (1 << jnp.array([1, 2])).tolist() == [2, 4]
    assert (16 >> jnp.array([1, 2])).tolist() == [8, 4]


def test_top_k_reduce_window_reduce_conv():
    x = jnp.array([3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 9.0])
    v, i = lax.top_k(x, 3)
    assert v.tolist() == [9.0, 9.0, 5.0] and i.tolist() == [5, 7, 4]
    pool = lax.reduce_window(jnp.arange(8.0), -jnp.inf, lax.max, (2,), (2,), "VALID")
    assert pool.tolist() == [1.0, 3.0, 5.0, 7.0]
    m = jnp.arange(12.0).reshape(3, 4)
    assert lax.reduce(m, 0.0, lax.add, (1,)).tolist() == [6.0, 22.0, 38.0]
    assert lax.reduce(m, 1.0, lambda a, b: a * b, (0,)).tolist() == [0.0, 45.0, 120.0, 231.0]
    # JAX: conv_general_dilated(arange(10) (1,1,10), [1,0,-1], (1,), "SAME")
    y = lax.conv_general_dilated(
        jnp.arange(10.0).reshape(1, 1, 10),
        jnp.array([1.0, 0.0, -1.0]).reshape(1, 1, 3),
        (1,),
        "SAME",
    )
    assert y.ravel().tolist() == [-1.0, -2.0, -2.0, -2.0, -2.0, -2.0, -2.0, -2.0, -2.0, 8.0]
    assert str(lax.Precision.HIGHEST) == "HIGHEST"


def test_conv_matches_loop_reference_with_layouts_and_grad():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 5, 6, 3)).astype(np.float32)  # NHWC
    w = rng.normal(size=(3, 2, 3, 4)).astype(np.float32)  # HWIO
    out = lax.conv_general_dilated(
        x, w, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )
    ref = np.zeros((2, 3, 5, 4), np.float32)
    for a in range(3):
        for b in range(5):
            ref[:, a, b, :] = np.einsum("nhwc,hwco->no", x[:, a : a + 3, b : b + 2, :], w)
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-5)
    g = fflow.grad(
        lambda w: jnp.sum(
            lax.conv_general_dilated(
                x, w, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")
            )
        )
    )(w)
    ref_g = np.zeros_like(w)
    for a in range(3):
        for b in range(5):
            ref_g += x[:, a : a + 3, b : b + 2, :].sum(0)[..., None]
    np.testing.assert_allclose(np.asarray(g), ref_g, rtol=1e-4, atol=1e-4)


def test_segment_ops():
    d = jnp.arange(6.0)
    ids = jnp.array([0, 0, 1, 2, 2, 2])
    assert fflow.ops.segment_sum(d, ids, num_segments=4).tolist() == [1.0, 2.0, 12.0, 0.0]
    assert fflow.ops.segment_max(d, ids).tolist() == [1.0, 2.0, 5.0]
    assert fflow.ops.segment_min(jnp.arange(6), ids, 3).tolist() == [0, 2, 3]
    assert fflow.ops.segment_prod(d, ids, 3).tolist() == [0.0, 2.0, 60.0]
    g = fflow.grad(lambda d: fflow.ops.segment_sum(d**2, ids, 3).sum())(d)
    assert g.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]


def test_tree_paths_and_partial():
    from typing import NamedTuple

    class P(NamedTuple):
        w: object
        b: object

    tu = fflow.tree_util
    t = {"a": [1.0, 2], "b": (3, None), "p": P(5, 6)}
    got = [(tu.keystr(p), v) for p, v in tu.tree_flatten_with_path(t)[0]]
    assert got == [
        ("['a'][0]", 1.0),
        ("['a'][1]", 2),
        ("['b'][0]", 3),
        ("['p'].w", 5),
        ("['p'].b", 6),
    ]
    assert tu.tree_map_with_path(lambda p, v: len(p), t) == {
        "a": [2, 2],
        "b": (2, None),
        "p": P(2, 2),
    }
    f = tu.Partial(lambda a, b: a * b, 3.0)
    assert tu.tree_leaves(f) == [3.0]
    assert float(fflow.jit(lambda f, x: f(x))(f, 4.0)) == 12.0


def test_complex_parts():
    z = jnp.array([1 + 2j, -1j, 3.0])
    assert jnp.real(z).tolist() == [1.0, 0.0, 3.0] and jnp.real(z).dtype == np.float32
    assert jnp.imag(z).tolist() == [2.0, -1.0, 0.0]
    assert z.conj().tolist() == [1 - 2j, 1j, 3 + 0j]
    np.testing.assert_allclose(np.asarray(jnp.angle(z)), [1.1071488, -1.5707964, 0.0], rtol=1e-6)
    assert fflow.eval_shape(jnp.abs, z).dtype == np.float32
    assert fflow.jit(jnp.abs)(z).tolist() == [np.float32(np.sqrt(5)), 1.0, 3.0]
    # d/dx [re(x (1+i)) * im(x (2+3i))] = d/dx [3 x^2] = 6x
    assert float(fflow.grad(lambda x: jnp.real(x * (1 + 1j)) * jnp.imag(x * (2 + 3j)))(1.5)) == 9.0


def test_narrow_randint_piecewise_unique_average():
    k = fflow.random.PRNGKey(123)
    # JAX 0.10: narrow ints are drawn at 32 bits and cast
    assert fflow.random.randint(k, (6,), -5, 5, dtype=jnp.int8).tolist() == [-4, 0, -5, -2, 2, 3]
    x = jnp.array([-2.0, -1.0, 0.0, 1.0, 2.0])
    out = jnp.piecewise(x, [x < 0, x > 1], [lambda v: -v, 7.0, lambda v: v * 10])
    assert out.tolist() == [2.0, 1.0, 0.0, 10.0, 7.0]
    u = jnp.unique(jnp.array([3, 1, 3]), size=4, return_index=True, return_counts=True)
    assert [a.tolist() for a in u] == [[1, 3, 1, 1], [1, 0, 1, 1], [1, 2, 0, 0]]
    m = jnp.arange(12.0).reshape(3, 4)
    assert jnp.average(m, axis=1, weights=jnp.array([1.0, 2.0, 3.0, 4.0])).tolist() == [
        2.0,
        6.0,
        10.0,
    ]
    assert float(jnp.max(jnp.zeros((0,)), initial=-1.0)) == -1.0
    assert m.at[jnp.array([1, 7])].get(mode="fill", fill_value=-1.0).shape == (2, 4)


def test_float_to_int_casts_saturate_like_jax():
    x = jnp.array([-2.3, 300.7, 1e10, -1e10, np.nan, np.inf, -np.inf, 2.9])
    # recorded from JAX 0.10.2
    assert x.astype(jnp.uint8).tolist() == [0, 255, 255, 0, 0, 255, 0, 2]
    assert x.astype(jnp.int8).tolist() == [-2, 127, 127, -128, 0, 127, -128, 2]
    big = [-2, 300, 2147483647, -2147483648, 0, 2147483647, -2147483648, 2]
    assert x.astype(jnp.int32).tolist() == big
    assert fflow.jit(lambda x: x.astype(jnp.int32))(x).tolist() == big


def test_grad_of_abs_of_complex():
    # recorded from JAX: d/dx |x (1+i)|^2 = 4x, d/dx |x (3+4i)| = 5 sign(x), 0 at 0
    assert float(fflow.grad(lambda x: jnp.abs(x * (1 + 1j)) ** 2)(1.5)) == 6.0
    g = fflow.vmap(fflow.grad(lambda x: jnp.abs(x * (3 + 4j))))(jnp.array([1.0, -1.0, 0.0]))
    assert g.tolist() == [5.0, -5.0, 0.0]


def test_fori_loop_index_of_python_bounds_is_weak():
    r = lax.fori_loop(0, 10, lambda i, a: a + i, 0)
    assert r.tolist() == 45 and r.dtype == np.int32 and r.weak_type  # as JAX
    r = lax.fori_loop(0, 3, lambda i, a: a + i, jnp.int32(1))
    assert r.tolist() == 4 and not r.weak_type
    # a weak f32 carry meets f16 later: f16 (why weak types matter)
    assert (
        lax.fori_loop(0, 2, lambda i, a: a * 2.0, 1.0) * jnp.ones(1, jnp.float16)
    ).dtype == np.float16


def test_shift_right_logical_of_signed_ints_and_cumlogsumexp():
    # recorded from JAX
    assert lax.shift_right_logical(jnp.array([-8, 8]), 1).tolist() == [2147483644, 4]
    assert lax.shift_right_logical(
        jnp.array([-8], jnp.int8), jnp.array([1], jnp.int8)
    ).tolist() == [124]
    np.testing.assert_allclose(
        np.asarray(lax.cumlogsumexp(jnp.arange(3.0))), [0.0, 1.3132617, 2.4076061], rtol=1e-6
    )
    assert jnp.where(jnp.arange(3) > 0, jnp.arange(3), 0.5).weak_type  # JAX: weak f32


def test_abs_derivative_at_zero_is_one_and_logaddexp_splits_ties():
    # JAX: d|x|/dx = select(x >= 0, 1, -1); logaddexp's derivative at x == y is 1/2
    np.testing.assert_array_equal(
        fflow.vmap(fflow.grad(jnp.abs))(jnp.array([-2.0, 0.0, 3.0])), [-1, 1, 1]
    )
    assert float(fflow.grad(fflow.nn.softplus)(0.0)) == 0.5
    assert float(fflow.grad(fflow.nn.log_sigmoid)(0.0)) == 0.5
    gx, gy = fflow.grad(jnp.logaddexp, argnums=(0, 1))(1.0, 1.0)
    assert float(gx) == float(gy) == 0.5
    x, y = 0.3, -1.2  # away from the tie: softmax weights (NumPy)
    gx, gy = fflow.grad(jnp.logaddexp, argnums=(0, 1))(x, y)
    np.testing.assert_allclose([gx, gy], np.exp([x, y]) / np.exp([x, y]).sum(), rtol=1e-6)
    inf = np.inf
    np.testing.assert_array_equal(
        jnp.logaddexp(jnp.array([inf, -inf, 1.0, np.nan]), jnp.array([inf, -inf, -inf, 1.0])),
        np.logaddexp([inf, -inf, 1.0, np.nan], [inf, -inf, -inf, 1.0]),
    )


def test_bitcast_convert_type_and_population_count_match_numpy():
    x = np.array([1.0, -2.5, np.inf], np.float32)
    for f in (
        lambda v: lax.bitcast_convert_type(v, jnp.int32),
        fflow.jit(lambda v: lax.bitcast_convert_type(v, jnp.int32)),
    ):
        np.testing.assert_array_equal(f(x), x.view(np.int32))
    assert lax.bitcast_convert_type(jnp.float32(1.0), jnp.int32).shape == ()
    u = np.array([0, 1, 255, 2**32 - 1], np.uint32)
    np.testing.assert_array_equal(
        fflow.vmap(lax.population_count)(u), [bin(int(v)).count("1") for v in u]
    )
    # two's-complement bits of signed ints (recorded from JAX: 8, 4, 1, 32, 16)
    for v, dt, want in [(-1, np.int8, 8), (-16, np.int8, 4), (16, np.int8, 1),
                        (-1, np.int32, 32), (-1, np.int16, 16)]:  # fmt: skip
        assert lax.population_count(np.array([v], dt)).tolist() == [want]
        assert fflow.jit(lax.population_count)(np.array([v], dt)).tolist() == [want]
    with pytest.raises(Exception, match="same width|one width"):
        lax.bitcast_convert_type(jnp.ones(2), jnp.int16)


@pytest.mark.parametrize("shape", [(4, 4), (3, 5), (5, 3)])
def test_scipy_linalg_lu_matches_scipy(shape):
    sl = pytest.importorskip("scipy.linalg")
    import fflow.scipy.linalg as fl

    a = np.random.default_rng(sum(shape)).normal(size=shape).astype(np.float32)
    for got, want in zip(fl.lu(a), sl.lu(a)):
        np.testing.assert_allclose(got, want, atol=1e-5)
    lu, piv = fflow.jit(fl.lu_factor)(a)
    lu2, piv2 = sl.lu_factor(a) if shape[0] == shape[1] else (None, None)
    if lu2 is not None:
        np.testing.assert_allclose(lu, lu2, atol=1e-5)
        np.testing.assert_array_equal(piv, piv2)
    batch = np.stack([a, a[::-1]])
    p, l, u = fflow.vmap(fl.lu)(batch)
    np.testing.assert_allclose(p @ l @ u, batch, atol=1e-5)


def test_logaddexp_second_derivatives_are_smooth():
    # d2/dx2 logaddexp(x, 0) = s(x)(1 - s(x)), s the logistic (JAX: 0.25 at the tie)
    xs = np.array([0.0, 0.5, -1.0, 30.0])
    s = 1 / (1 + np.exp(-xs))
    g2 = fflow.vmap(fflow.grad(fflow.grad(lambda x: jnp.logaddexp(x, 0.0))))(jnp.asarray(xs))
    np.testing.assert_allclose(g2, s * (1 - s), rtol=1e-5, atol=1e-12)
    h = fflow.hessian(lambda v: jnp.logaddexp(v[0], v[1]))(jnp.array([0.7, 0.7]))
    np.testing.assert_allclose(h, [[0.25, -0.25], [-0.25, 0.25]], rtol=1e-6)
    np.testing.assert_allclose(fflow.hessian(fflow.nn.log_sigmoid)(0.0), -0.25, rtol=1e-6)
    g = fflow.grad(jnp.logaddexp, argnums=(0, 1))(100.0, -100.0)  # far apart: no overflow
    assert [float(v) for v in g] == [1.0, 0.0]
