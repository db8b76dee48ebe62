"""Every primitive: the generated NumPy kernel equals eager evaluation, bit for bit
(dot_general within float tolerance: BLAS may block transposed operands differently)."""

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp
from fflow import lax
from fflow.core import primitives

rng = np.random.default_rng(0)


def f32(*shape, lo=-2.0, hi=2.0):
    return jnp.asarray(rng.uniform(lo, hi, shape).astype(np.float32))


def i32(*shape, lo=-5, hi=6):
    return jnp.asarray(rng.integers(lo, hi, shape).astype(np.int32))


def boolean(*shape):
    return jnp.asarray(rng.random(shape) < 0.5)


UNARY_FLOAT = {
    "sin": lax.sin,
    "cos": lax.cos,
    "tan": lax.tan,
    "asin": lambda x: lax.asin(x / 3),
    "acos": lambda x: lax.acos(x / 3),
    "atan": lax.atan,
    "sinh": lax.sinh,
    "cosh": lax.cosh,
    "tanh": lax.tanh,
    "asinh": lax.asinh,
    "acosh": lambda x: lax.acosh(lax.abs(x) + 1),
    "atanh": lambda x: lax.atanh(x / 3),
    "exp": lax.exp,
    "exp2": lax.exp2,
    "expm1": lax.expm1,
    "log": lambda x: lax.log(lax.abs(x)),
    "log1p": lambda x: lax.log1p(lax.abs(x)),
    "sqrt": lambda x: lax.sqrt(lax.abs(x)),
    "rsqrt": lambda x: lax.rsqrt(lax.abs(x) + 0.1),
    "cbrt": lax.cbrt,
    "logistic": lax.logistic,
    "erf": lax.erf,
    "erf_inv": lambda x: lax.erf_inv(x / 3),
    "abs": lax.abs,
    "sign": lax.sign,
    "floor": lax.floor,
    "ceil": lax.ceil,
    "round": lax.round,
    "round_even": lambda x: lax.round(x, 1),
    "is_finite": lambda x: lax.is_finite(lax.log(x)),
    "neg": lax.neg,
    "square": lax.square,
    "integer_pow": lambda x: lax.integer_pow(x, 3) + lax.integer_pow(x, -2) + x**2,
    "stop_gradient": lambda x: lax.stop_gradient(x) * 2,
    "copy": lambda x: primitives["copy"].bind(x) * 2,
}

BINARY_FLOAT = {
    "add": lax.add,
    "sub": lax.sub,
    "mul": lax.mul,
    "div": lax.div,
    "rem": lax.rem,
    "pow": lambda x, y: lax.pow(lax.abs(x), y),
    "max": lax.max,
    "min": lax.min,
    "atan2": lax.atan2,
    "nextafter": lax.nextafter,
    "eq": lax.eq,
    "ne": lax.ne,
    "lt": lax.lt,
    "le": lax.le,
    "gt": lax.gt,
    "ge": lax.ge,
    "select_n": lambda x, y: lax.select_n(lax.gt(x, y), x, y),
}

INT_OPS = {
    "and": lambda a, b: lax.bitwise_and(a, b),
    "or": lambda a, b: lax.bitwise_or(a, b),
    "xor": lambda a, b: lax.bitwise_xor(a, b),
    "not": lambda a, b: lax.bitwise_not(a),
    "shift_left": lambda a, b: lax.shift_left(a, lax.abs(b)),
    "shift_right_logical": lambda a, b: lax.shift_right_logical(
        lax.convert_element_type(a, np.uint32), lax.convert_element_type(lax.abs(b), np.uint32)
    ),
    "shift_right_arithmetic": lambda a, b: primitives["shift_right_arithmetic"].bind(a, lax.abs(b)),
    "int_div": lambda a, b: lax.div(a, b),
    "int_rem": lambda a, b: lax.rem(a, b),
}

OTHER = {
    "convert_element_type": lambda x: (x.astype(np.int32), x.astype(np.float16), x.astype(bool)),
    "broadcast_in_dim": lambda x: lax.broadcast_in_dim(x[0], (2, 4, 5), (2,)),
    "reshape": lambda x: lax.reshape(x, (5, 4)) * 2,
    "transpose": lambda x: lax.transpose(x, (1, 0)) + 1,
    "squeeze": lambda x: lax.squeeze(x[None], (0,)),
    "slice": lambda x: lax.slice(x, (1, 0), (4, 5), (2, 2)),
    "pad": lambda x: lax.pad(x, 0.5, ((1, 2, 1), (0, -1, 0))),
    "concatenate": lambda x: lax.concatenate([x, x * 2], 1),
    "rev": lambda x: lax.rev(x, (0,)),
    "iota": lambda x: lax.iota(np.float32, 5) + x,
    "dynamic_slice": lambda x: lax.dynamic_slice(x, (jnp.int32(1), jnp.int32(3)), (2, 2)),
    "dynamic_update_slice": lambda x: lax.dynamic_update_slice(
        x * 2, jnp.ones((2, 2)), (jnp.int32(1), jnp.int32(4))
    ),
    "gather": lambda x: lax.gather(x, jnp.asarray([[0], [3], [1]]), (0,)),
    "scatter": lambda x: lax.scatter(x + 1, jnp.asarray([[0], [2]]), x[:2] * 3, (0,)),
    "scatter_add": lambda x: lax.scatter_add(x + 1, jnp.asarray([[0], [0]]), x[:2], (0,)),
    "scatter_mul": lambda x: lax.scatter_mul(x + 1, jnp.asarray([[1], [3]]), x[:2], (0,)),
    "scatter_min": lambda x: lax.scatter_min(x + 1, jnp.asarray([[1], [3]]), x[:2], (0,)),
    "scatter_max": lambda x: lax.scatter_max(x + 1, jnp.asarray([[1], [3]]), x[:2], (0,)),
    "dot_general": lambda x: (
        x @ x.T,
        x.T @ x,
        lax.dot_general(x, x, (((1,), (1,)), ((0,), (0,)))),
    ),
    "reduce_sum": lambda x: (lax.reduce_sum(x, (0,)), lax.reduce_sum(x, (0, 1))),
    "reduce_max": lambda x: lax.reduce_max(x, (1,)),
    "reduce_min": lambda x: lax.reduce_min(x, (0,)),
    "reduce_prod": lambda x: lax.reduce_prod(x, (1,)),
    "reduce_or": lambda x: lax.reduce_or(x > 0, (1,)),
    "reduce_and": lambda x: lax.reduce_and(x > -1, (0,)),
    "argmax": lambda x: lax.argmax(x, 1),
    "argmin": lambda x: lax.argmin(x, 0),
    "cumsum": lambda x: lax.cumsum(x, 1),
    "cumprod": lambda x: lax.cumprod(x, 0, reverse=True),
    "cummax": lambda x: lax.cummax(x, 1),
    "cummin": lambda x: lax.cummin(x, 0),
    "sort": lambda x: lax.sort(x, 1),
    "random_bits": lambda x: fflow.random.uniform(fflow.random.PRNGKey(1), (3,)) + x[0, :3],
    "random_fold_in": lambda x: fflow.random.normal(
        fflow.random.fold_in(fflow.random.PRNGKey(1), 3), (3,)
    ),
}

# primitives tested elsewhere in this file under another name
ALIASES = {"int_div": "div", "int_rem": "rem"}
ELSEWHERE = {
    "debug_callback": "tests/test_debug.py (effects)",
    "cond": "test_control_flow_runs_compiled_bodies",
    "while": "test_control_flow_runs_compiled_bodies",
    "scan": "test_control_flow_runs_compiled_bodies",
}


def assert_same(a, b, exact=True):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
    if exact:
        np.testing.assert_array_equal(a, b)
    else:
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def check(fn, *args, exact=True):
    eager = fn(*args)
    jitted = fflow.jit(fn)(*args)
    flat_e = fflow.tree_util.tree_leaves(eager)
    flat_j = fflow.tree_util.tree_leaves(jitted)
    assert len(flat_e) == len(flat_j)
    for e, j in zip(flat_e, flat_j):
        assert_same(e, j, exact)
    return jitted


@pytest.mark.parametrize("name", sorted(UNARY_FLOAT))
def test_unary(name):
    with np.errstate(all="ignore"):
        check(UNARY_FLOAT[name], f32(3, 5))
        check(UNARY_FLOAT[name], f32())  # 0-d values take the scalar path


@pytest.mark.parametrize("name", sorted(BINARY_FLOAT))
def test_binary(name):
    with np.errstate(all="ignore"):
        check(BINARY_FLOAT[name], f32(4, 3), f32(4, 3))
        check(lambda x: BINARY_FLOAT[name](x, jnp.full_like(x, 0.5)), f32(4, 3))
        check(BINARY_FLOAT[name], f32(), f32())


@pytest.mark.parametrize("name", sorted(INT_OPS))
def test_int_ops(name):
    with np.errstate(all="ignore"):
        check(INT_OPS[name], i32(4, 3), i32(4, 3))
        if name in ("and", "or", "xor", "not"):
            check(INT_OPS[name], boolean(4, 3), boolean(4, 3))


@pytest.mark.parametrize("name", sorted(OTHER))
def test_other(name):
    check(OTHER[name], f32(4, 5), exact=name != "dot_general")


def _family_primitives():
    import importlib

    out = set()
    for fam in (
        "unary",
        "binary",
        "compare",
        "convert",
        "reduction",
        "shape",
        "indexing",
        "dot",
        "cumulative",
        "sort",
        "random_bits",
        "control_flow",
        "scan",
    ):
        try:
            mod = importlib.import_module(f"fflow.primitives.{fam}")
        except ImportError:
            continue
        out.update(v.name for k, v in vars(mod).items() if k.endswith("_p"))
    return out


def test_every_primitive_is_covered():
    covered = set(UNARY_FLOAT) | set(BINARY_FLOAT) | set(OTHER) | set(ELSEWHERE)
    covered |= {ALIASES.get(k, k) for k in INT_OPS}
    missing = sorted(_family_primitives() - covered)
    assert not missing, f"no kernel-vs-eager test for {missing}"


@pytest.mark.usefixtures("x64_case")  # float64 needs x64, as in JAX
def test_float64_and_float16_keep_their_dtype():
    x64 = jnp.asarray(np.linspace(-1, 1, 6))
    assert x64.dtype == np.float64
    check(lambda x: jnp.tanh(x) * 2 + x, x64)
    x16 = jnp.asarray(np.linspace(-1, 1, 6).astype(np.float16))
    check(lambda x: jnp.tanh(x) * 2 + x, x16)


def test_control_flow_runs_compiled_bodies():
    from fflow import lax_control

    def f(x):
        def body(c, xi):
            c = jnp.tanh(c * 0.9 + xi)
            return c, c * 2

        carry, ys = lax_control.scan(body, x[0], x)
        n = lax_control.while_loop(lambda c: c[0] < 10, lambda c: (c[0] + 1, c[1] * 1.5), (0, x[0]))
        z = lax_control.cond(jnp.sum(x) > 0, lambda a: a * 2, lambda a: a - 1, carry)
        return carry, ys, n[1], z

    x = f32(4, 3)
    lowered = fflow.jit(f).lower(x)
    text = lowered.as_text()
    assert "for _i in range(4)" in text and "while " in text
    check(f, x)
    check(f, -jnp.abs(x))


def test_large_select_is_bit_exact():
    # large selects take the bit-mask path: every bit of the chosen value is kept
    rng = np.random.default_rng(5)
    for dtype in (np.float32, np.float64, np.int32, np.float16):
        a = rng.normal(size=(64, 130)).astype(dtype)
        b = rng.normal(size=(64, 130)).astype(dtype)
        if np.dtype(dtype).kind == "f":
            a[0, :4] = [np.nan, -0.0, np.inf, -np.inf]
            b[1, :4] = [np.nan, -0.0, np.inf, -np.inf]
        x, y = jnp.asarray(a), jnp.asarray(b)
        for f in (
            lambda x, y: lax.select_n(x > y, x, y),
            lambda x, y: lax.select_n(x > 0, jnp.zeros_like(x), y),
        ):
            with np.errstate(all="ignore"):
                want = np.asarray(f(x, y))
                got = np.asarray(fflow.jit(f)(x, y))
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(
                got.view(f"u{got.itemsize}"), want.view(f"u{want.itemsize}")
            )
