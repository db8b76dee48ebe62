"""fflow.numpy elementwise functions against NumPy (hypothesis-drawn shapes and
dtypes, broadcasting), JAX's type promotion, jit == eager, grad vs finite differences."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fflow
import fflow.numpy as jnp
from fflow.experimental import enable_x64

SETTINGS = settings(max_examples=8, deadline=None)

FLOATS = [np.float32, np.float64, np.float16]
INTS = [np.int32, np.int8, np.uint8, np.int16]


def _tol(dtype):
    return {np.float16: 3e-3, np.float32: 2e-5, np.float64: 1e-12}.get(np.dtype(dtype).type, 0)


def _draw_array(draw, dtype, shape, lo=-5, hi=5):
    if np.dtype(dtype).kind == "b":
        return draw(hnp.arrays(np.bool_, shape))
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        elems = st.integers(max(lo, info.min), min(hi, info.max))
        return draw(hnp.arrays(dtype, shape, elements=elems))
    width = np.dtype(dtype).itemsize * 8
    lo, hi = float(np.asarray(lo, dtype)), float(np.asarray(hi, dtype))
    elems = st.floats(lo, hi, width=width)
    return draw(hnp.arrays(dtype, shape, elements=elems))


def _check(out, expected, dtype=None):
    out_np = np.asarray(out)
    expected = np.asarray(expected)
    assert out_np.shape == expected.shape
    if dtype is not None:
        assert out_np.dtype == np.dtype(dtype), (out_np.dtype, dtype)
    if expected.dtype.kind in "fc":
        tol = _tol(out_np.dtype) or 1e-6
        np.testing.assert_allclose(
            out_np.astype(np.float64), expected.astype(np.float64), rtol=tol, atol=tol
        )
    else:
        np.testing.assert_array_equal(out_np, expected)


UNARY = {
    # name: (numpy function, domain (lo, hi))
    "exp": (np.exp, (-5, 5)),
    "expm1": (np.expm1, (-5, 5)),
    "log": (np.log, (0.1, 10)),
    "log1p": (np.log1p, (-0.9, 10)),
    "log2": (np.log2, (0.1, 10)),
    "log10": (np.log10, (0.1, 10)),
    "sqrt": (np.sqrt, (0, 10)),
    "cbrt": (np.cbrt, (-5, 5)),
    "square": (np.square, (-5, 5)),
    "abs": (np.abs, (-5, 5)),
    "sign": (np.sign, (-5, 5)),
    "sin": (np.sin, (-5, 5)),
    "cos": (np.cos, (-5, 5)),
    "tan": (np.tan, (-1.4, 1.4)),
    "arcsin": (np.arcsin, (-0.99, 0.99)),
    "arccos": (np.arccos, (-0.99, 0.99)),
    "arctan": (np.arctan, (-5, 5)),
    "sinh": (np.sinh, (-3, 3)),
    "cosh": (np.cosh, (-3, 3)),
    "tanh": (np.tanh, (-5, 5)),
    "arcsinh": (np.arcsinh, (-5, 5)),
    "arccosh": (np.arccosh, (1.01, 5)),
    "arctanh": (np.arctanh, (-0.9, 0.9)),
    "floor": (np.floor, (-5, 5)),
    "ceil": (np.ceil, (-5, 5)),
    "round": (np.round, (-5, 5)),
    "rint": (np.rint, (-5, 5)),
    "trunc": (np.trunc, (-5, 5)),
    "negative": (np.negative, (-5, 5)),
    "reciprocal": (np.reciprocal, (0.5, 5)),
    "exp2": (np.exp2, (-5, 5)),
    "isfinite": (np.isfinite, (-5, 5)),
    "isnan": (np.isnan, (-5, 5)),
    "isinf": (np.isinf, (-5, 5)),
    "signbit": (np.signbit, (-5, 5)),
    "deg2rad": (np.deg2rad, (-5, 5)),
}


@pytest.mark.parametrize("name", sorted(UNARY))
@SETTINGS
@given(data=st.data())
@pytest.mark.usefixtures("x64_case")  # float64 reference on purpose
def test_unary_matches_numpy(name, data):
    np_fn, (lo, hi) = UNARY[name]
    dtype = data.draw(st.sampled_from(FLOATS))
    shape = data.draw(hnp.array_shapes(min_dims=0, max_dims=3, max_side=4))
    x = _draw_array(data.draw, dtype, shape, lo, hi)
    _check(getattr(jnp, name)(x), np_fn(x), np_fn(x).dtype)


@pytest.mark.parametrize("name", ["exp", "sqrt", "sin", "log1p", "reciprocal", "rint"])
def test_unary_promotes_ints_to_float32(name):
    x = np.array([1, 2, 3], np.int32)
    out = getattr(jnp, name)(x)
    assert out.dtype == np.float32
    np.testing.assert_allclose(np.asarray(out), UNARY[name][0](x.astype(np.float32)), rtol=1e-6)


BINARY = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "equal": np.equal,
    "not_equal": np.not_equal,
    "less": np.less,
    "less_equal": np.less_equal,
    "greater": np.greater,
    "greater_equal": np.greater_equal,
    "floor_divide": np.floor_divide,
    "remainder": np.remainder,
    "mod": np.mod,
    "fmod": np.fmod,
}


@pytest.mark.parametrize("name", sorted(BINARY))
@SETTINGS
@given(data=st.data())
@pytest.mark.usefixtures("x64_case")  # float64 reference on purpose
def test_binary_broadcasting_matches_numpy(name, data):
    dtype = data.draw(st.sampled_from(FLOATS[:2] + INTS))
    shapes = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=4))
    x = _draw_array(data.draw, dtype, shapes.input_shapes[0])
    y = _draw_array(data.draw, dtype, shapes.input_shapes[1])
    if name in ("floor_divide", "remainder", "mod", "fmod"):
        y = np.where(y == 0, np.asarray(3, dtype), y)
    expected = BINARY[name](x, y)
    _check(getattr(jnp, name)(x, y), expected, expected.dtype)
    # operators go through the same functions
    if name == "add":
        _check(jnp.asarray(x) + jnp.asarray(y), expected)


@SETTINGS
@given(data=st.data())
def test_true_divide_and_power(data):
    dtype = data.draw(st.sampled_from(FLOATS[:2]))
    shapes = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=4))
    x = _draw_array(data.draw, dtype, shapes.input_shapes[0], 0.5, 3)
    y = _draw_array(data.draw, dtype, shapes.input_shapes[1], -2, 2)
    _check(jnp.divide(x, y + np.asarray(3, dtype)), np.divide(x, y + np.asarray(3, dtype)))
    _check(jnp.power(x, y), np.power(x, y))
    _check(jnp.arctan2(y, x), np.arctan2(y, x))
    _check(jnp.logaddexp(x, y), np.logaddexp(x, y))
    _check(jnp.hypot(x, y), np.hypot(x, y))


def test_integer_division_semantics():
    x = np.array([-7, 7, -7, 7, 0], np.int32)
    y = np.array([2, 2, -2, -2, 3], np.int32)
    _check(jnp.floor_divide(x, y), np.floor_divide(x, y), np.int32)
    _check(jnp.remainder(x, y), np.remainder(x, y), np.int32)
    _check(jnp.fmod(x, y), np.fmod(x, y), np.int32)
    _check(jnp.true_divide(x, y), np.true_divide(x, y).astype(np.float32), np.float32)
    _check(
        jnp.power(np.int32([2, 3, -2, 1, -1]), np.int32([10, 3, 3, -3, -3])), [1024, 27, -8, 1, -1]
    )
    _check(jnp.power(np.int32([2, 5]), np.int32([-1, -2])), [0, 0])
    _check(jnp.right_shift(np.int32([-8, 8]), 1), [-4, 4], np.int32)
    _check(jnp.left_shift(np.uint8([1, 3]), 2), [4, 12], np.uint8)
    _check(jnp.gcd(np.int32([12, -18, 0, 7]), np.int32([18, 12, 5, 0])), [6, 6, 5, 7])
    _check(jnp.lcm(np.int32([4, -6, 0]), np.int32([6, 4, 3])), [12, 12, 0])


def test_float_floor_divide_is_exact():
    x = np.float32([2.0, -3.5, 3.5, 7.0])
    y = np.float32([0.4, 2.0, -2.0, 0.7])
    _check(jnp.floor_divide(x, y), np.floor_divide(x, y))
    _check(jnp.remainder(x, y), np.remainder(x, y))


# JAX's promotion lattice (x32 defaults); written out by hand as the reference
PROMOTION = [
    (np.int32, np.float32, np.float32),
    (np.int8, np.uint8, np.int16),
    (np.uint8, np.int32, np.int32),
    (np.float16, np.int32, np.float16),
    (np.float16, np.float32, np.float32),
    (np.bool_, np.int8, np.int8),
    (np.bool_, np.float16, np.float16),
    (np.int16, np.float16, np.float16),
    (np.float64, np.float32, np.float32),  # x64 off: float64 is float32
    (np.int64, np.int8, np.int32),
    (np.uint32, np.int32, np.int32),  # int64 narrowed
    (np.int32, np.int32, np.int32),
]
WEAK = [
    (np.int8, 3, np.int8),
    (np.uint8, 3, np.uint8),
    (np.int32, 2.5, np.float32),
    (np.float16, 2.5, np.float16),
    (np.float16, 3, np.float16),
    (np.bool_, 3, np.int32),
    (np.bool_, 2.5, np.float32),
    (np.float64, 2.5, np.float32),
    (np.int64, 3, np.int32),
    (np.uint8, 2.5, np.float32),
]


@pytest.mark.parametrize("a, b, expected", PROMOTION)
def test_type_promotion_lattice(a, b, expected):
    x, y = np.ones(2, a), np.ones(2, b)
    assert jnp.add(x, y).dtype == expected
    assert jnp.add(y, x).dtype == expected
    assert jnp.result_type(a, b) == expected
    assert fflow.jit(jnp.multiply)(x, y).dtype == expected


@pytest.mark.parametrize("a, scalar, expected", WEAK)
def test_python_scalars_are_weak(a, scalar, expected):
    x = np.ones(2, a)
    assert jnp.add(x, scalar).dtype == expected
    assert jnp.multiply(scalar, x).dtype == expected
    assert (jnp.asarray(x) * scalar).dtype == expected
    assert fflow.jit(lambda v: v * scalar)(x).dtype == expected


def test_python_values_get_32_bit_defaults():
    assert jnp.array([1.0, 2.0]).dtype == np.float32
    assert jnp.array([1, 2]).dtype == np.int32
    assert jnp.asarray(3.0).dtype == np.float32
    assert jnp.array(np.ones(2, np.float64)).dtype == np.float32  # x64 off, as in JAX
    assert jnp.sin(np.ones(2, np.float64)).dtype == np.float32
    with enable_x64():
        assert jnp.array([1.0, 2.0]).dtype == np.float64
        assert jnp.array([1, 2]).dtype == np.int64
        assert jnp.sin(np.ones(2, np.float64)).dtype == np.float64
        assert jnp.add(np.ones(2), np.ones(2, np.float32)).dtype == np.float64
        assert (np.ones(2, np.float32) * jnp.asarray(2.5)).dtype == np.float32
    assert jnp.float32(3).dtype == np.float32 and jnp.int8(3).dtype == np.int8
    assert np.dtype(jnp.bfloat16).name == "bfloat16"


DTYPE_NAMES = ["bool", "int8", "uint8", "int16", "int32", "float16", "float32", "bfloat16"]


def test_promotion_same_as_jax():
    jax = pytest.importorskip("jax")
    import ml_dtypes

    def dt(name):
        return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)

    for a in DTYPE_NAMES:
        x = np.ones(2, dt(a))
        for b in DTYPE_NAMES:
            y = np.ones(2, dt(b))
            assert jnp.add(x, y).dtype == jax.numpy.result_type(x, y), (a, b)
        for scalar in (2, 2.5):
            assert jnp.add(x, scalar).dtype == jax.numpy.result_type(x, scalar), (a, scalar)


@pytest.mark.parametrize(
    "name", ["exp", "sin", "tanh", "log1p", "sqrt", "arctan", "square", "cbrt", "sinh", "expm1"]
)
@pytest.mark.usefixtures("x64_case")  # float64 reference on purpose
def test_unary_jit_and_grad(name):
    f = getattr(jnp, name)
    x = np.linspace(0.2, 1.7, 7)
    np.testing.assert_allclose(np.asarray(fflow.jit(f)(x)), np.asarray(f(x)), rtol=1e-12)
    g = np.asarray(fflow.grad(lambda v: jnp.sum(f(v)))(x))
    eps = 1e-6
    fd = (np.asarray(f(x + eps)) - np.asarray(f(x - eps))) / (2 * eps)
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize(
    "name", ["add", "subtract", "multiply", "divide", "power", "arctan2", "logaddexp", "hypot"]
)
@pytest.mark.usefixtures("x64_case")  # float64 reference on purpose
def test_binary_jit_and_grad(name):
    f = getattr(jnp, name)
    x = np.linspace(0.5, 2.0, 6)
    y = np.linspace(1.7, 0.3, 6)
    np.testing.assert_allclose(np.asarray(fflow.jit(f)(x, y)), np.asarray(f(x, y)), rtol=1e-12)
    gx, gy = fflow.grad(lambda a, b: jnp.sum(f(a, b)), argnums=(0, 1))(x, y)
    eps = 1e-6
    fdx = (np.asarray(f(x + eps, y)) - np.asarray(f(x - eps, y))) / (2 * eps)
    fdy = (np.asarray(f(x, y + eps)) - np.asarray(f(x, y - eps))) / (2 * eps)
    np.testing.assert_allclose(np.asarray(gx), fdx, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(np.asarray(gy), fdy, rtol=1e-6, atol=1e-8)


def test_where_clip_and_masks():
    x = np.linspace(-2, 2, 9).astype(np.float32)
    _check(jnp.where(x > 0, x, 0.0), np.where(x > 0, x, 0.0), np.float32)
    _check(jnp.clip(x, -1, 0.5), np.clip(x, -1, 0.5), np.float32)
    _check(jnp.clip(x, max=0.5), np.clip(x, None, 0.5))
    g = fflow.grad(lambda v: jnp.sum(jnp.where(v > 0, v * v, -v)))(x)
    np.testing.assert_allclose(np.asarray(g), np.where(x > 0, 2 * x, -1), rtol=1e-6)
    x = x + np.float32(0.1)  # off the kinks
    g = fflow.grad(lambda v: jnp.sum(jnp.clip(v, -1, 0.5)))(x)
    np.testing.assert_allclose(np.asarray(g), ((x > -1) & (x < 0.5)).astype(np.float32))
    b = np.array([True, False, True])
    _check(jnp.logical_and(b, ~b), b & ~b)
    _check(jnp.logical_or(b, np.array([False, True, False])), [True, True, True])
    _check(jnp.logical_not(np.int32([0, 2])), [True, False])


def test_negating_a_0d_array_keeps_an_ndarray_inside():
    # regression: -Array(0-d) stored a NumPy scalar and later ops failed to dispatch
    x = -jnp.asarray(0.3)
    assert type(np.asarray(x)) is np.ndarray
    np.testing.assert_allclose(float(jnp.log1p(x)), np.log1p(-0.3), rtol=1e-6)


def test_functions_of_python_scalars_are_weak():
    low = jnp.ones(2, jnp.bfloat16)
    assert jnp.sqrt(2.0).weak_type and jnp.add(2, 3).weak_type
    assert (low * jnp.sqrt(2.0)).dtype == low.dtype
    assert (low * jnp.full((), 2.0)).dtype == low.dtype
    assert (low * jnp.asarray(2.0)).dtype == low.dtype
    assert (np.ones(2, np.float16) + jnp.exp(1.0)).dtype == np.float16
    assert fflow.jit(lambda a: a * jnp.sqrt(2.0) + jnp.full((2,), 1.0))(low).dtype == low.dtype
    assert not jnp.zeros(2).weak_type and not jnp.sqrt(np.float32(2)).weak_type
