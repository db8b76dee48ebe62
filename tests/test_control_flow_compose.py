"""More compositions of control flow with vmap / grad / jit / linearize / hessian,
each against a plain Python or NumPy reference."""

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp
from fflow import lax
from fflow.typecheck import check_program

pytestmark = pytest.mark.usefixtures("x64")  # float64 references on purpose


def power_loop(x, n):
    return lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * x), (0, 1.0))[1]


def test_while_batched_body_unbatched_predicate_and_nested_vmap():
    out = fflow.vmap(power_loop, (0, None))(jnp.array([1.0, 2.0]), 3)
    np.testing.assert_allclose(np.asarray(out), [1.0, 8.0])
    f2 = fflow.vmap(fflow.vmap(power_loop, (None, 0)), (0, None))
    out = f2(jnp.array([1.0, 2.0]), jnp.array([0, 1, 3]))
    np.testing.assert_allclose(np.asarray(out), np.array([1.0, 2.0])[:, None] ** [0, 1, 3])


def test_grad_of_vmap_of_cond_with_batched_predicate():
    def g(x):
        return jnp.sum(fflow.vmap(lambda v: lax.cond(v > 0, jnp.sin, jnp.cos, v))(x))

    x = np.array([1.0, -1.0, 0.5])
    ref = np.where(x > 0, np.cos(x), -np.sin(x))
    np.testing.assert_allclose(np.asarray(fflow.grad(g)(x)), ref, rtol=1e-6)


def test_hessian_of_scan_matches_finite_differences_of_grad():
    def h(x):
        return lax.scan(lambda c, xi: (c * jnp.sin(xi) + c**2 * 0.1, None), 1.0, x)[0]

    x = np.array([0.3, 0.5, 0.7])
    hess = np.asarray(fflow.hessian(h)(x))
    gf = fflow.grad(h)
    eps = 1e-5
    num = np.stack(
        [
            (np.asarray(gf(x + eps * e)) - np.asarray(gf(x - eps * e))) / (2 * eps)
            for e in np.eye(3)
        ],
        axis=1,
    )
    np.testing.assert_allclose(hess, num, rtol=1e-5, atol=1e-7)


def test_edge_cases_zero_length_int_carries_reverse_and_closures():
    c, ys = lax.scan(lambda c, x: (c + x, x), 1.0, jnp.zeros((0,)))
    assert float(c) == 1.0 and ys.shape == (0,)
    g0 = fflow.grad(lambda c: lax.scan(lambda c, x: (c * x, x), c, jnp.zeros((0,)))[0])(2.0)
    assert float(g0) == 1.0

    def int_carry(w):
        (_, _), ys = lax.scan(
            lambda c, x: ((c[0] + 1, c[1] * w), c[1] * x), (0, 1.0), jnp.arange(3.0)
        )
        return ys.sum()

    assert float(fflow.grad(int_carry)(2.0)) == 1 + 4 * 2.0
    assert float(fflow.grad(lambda x: lax.cond(True, lambda: x * 2, lambda: x * 3))(1.0)) == 2.0
    g = fflow.grad(lambda xs: lax.scan(lambda c, x: (c * 2 + x, c), 0.0, xs, reverse=True)[0])
    np.testing.assert_allclose(np.asarray(g(jnp.arange(3.0))), [1.0, 2.0, 4.0])
    y, f_jvp = fflow.linearize(
        lambda w: lax.scan(lambda c, x: (c * w, c), 1.0, jnp.arange(3.0))[1], 2.0
    )
    np.testing.assert_allclose(np.asarray(y), [1.0, 2.0, 4.0])
    np.testing.assert_allclose(np.asarray(f_jvp(1.0)), [0.0, 1.0, 4.0])


def test_bounded_while_under_vmap_of_grad_with_different_trip_counts():
    def w2(x, n):
        c = (0, 1.0)
        return lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * x), c, max_steps=10)[
            1
        ]

    ns = np.array([1, 2, 3])
    out = fflow.vmap(fflow.grad(w2))(jnp.array([2.0, 2.0, 2.0]), ns)
    np.testing.assert_allclose(np.asarray(out), ns * 2.0 ** (ns - 1))
    out = fflow.jit(fflow.vmap(lambda n: lax.fori_loop(0, n, lambda i, s: s + i, 0)))(
        jnp.array([3, 5])
    )
    assert np.asarray(out).tolist() == [3, 10]


def test_transformed_control_flow_programs_typecheck():
    def f(w, xs):
        def step(c, x):
            c = lax.cond(x > 0, lambda a: a * w, lambda a: a + w, c)
            p = lax.while_loop(lambda t: t[0] < 2, lambda t: (t[0] + 1, t[1] * c), (0, 1.0))[1]
            q = lax.while_loop(
                lambda t: t[0] < 2, lambda t: (t[0] + 1, t[1] * c), (0, 1.0), max_steps=3
            )[1]
            return c, p + q

        return lax.scan(step, 1.0, xs)[1].sum()

    xs = np.array([0.5, -0.5, 1.0], np.float32)
    w = np.float32(0.7)
    w_batch = np.array([0.7, 0.9], np.float32)
    xs_batch = np.stack([xs, -xs])
    cases = [
        (f, (w, xs)),
        (fflow.jit(f), (w, xs)),
        (lambda w, xs: fflow.jvp(lambda v: f(v, xs), (w,), (np.float32(1.0),)), (w, xs)),
        (fflow.vmap(f, (0, None)), (w_batch, xs)),
        (fflow.vmap(f, (None, 0)), (w, xs_batch)),
    ]
    for fn, args in cases:
        check_program(fflow.make_jaxpr(fn)(*args))

    def g(w, xs):
        def step(c, x):
            c = lax.cond(x > 0, lambda a: a * w, lambda a: a + w, c)
            q = lax.while_loop(
                lambda t: t[0] < 2, lambda t: (t[0] + 1, t[1] * c), (0, 1.0), max_steps=3
            )[1]
            return c, q

        return lax.scan(step, 1.0, xs)[1].sum()

    check_program(fflow.make_jaxpr(fflow.grad(g))(w, xs))
    check_program(fflow.make_jaxpr(fflow.vmap(fflow.grad(g), (0, None)))(w_batch, xs))
    w_batch = np.array([0.7, 0.9], np.float32)
    ref = [float(f(w, xs)) for w in w_batch]
    np.testing.assert_allclose(np.asarray(fflow.vmap(f, (0, None))(w_batch, xs)), ref, rtol=1e-6)


def test_numpy_scalars_keep_their_dtype_when_traced():
    # np.float64 subclasses Python float; traced code must still see a strong f64
    c = np.ones(2)
    w = np.float64(0.8)
    eager = jnp.asarray(c) * w
    traced = fflow.jit(lambda v: v * w)(c)
    assert eager.dtype == traced.dtype == np.float64
    out = lax.scan(lambda h, x: (h * w + x, None), jnp.zeros(2, np.float64), np.ones((3, 2)))[0]
    np.testing.assert_allclose(np.asarray(out), (1 + 0.8 + 0.64) * np.ones(2))
