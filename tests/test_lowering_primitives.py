"""The generated NumPy kernel equals eager evaluation: dtypes, control flow, bit-exact
selects. The per-primitive kernel-vs-eager checks run from the op database
(tests/op_db.py, tests/test_op_db.py::test_lowering_matches_eager)."""

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp
from fflow import lax

rng = np.random.default_rng(0)


def f32(*shape, lo=-2.0, hi=2.0):
    return jnp.asarray(rng.uniform(lo, hi, shape).astype(np.float32))


def i32(*shape, lo=-5, hi=6):
    return jnp.asarray(rng.integers(lo, hi, shape).astype(np.int32))


def boolean(*shape):
    return jnp.asarray(rng.random(shape) < 0.5)


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
