"""cond / switch / while_loop / fori_loop / scan against plain Python references:
values, jvp, grad (check_grads, order 2), under jit, under vmap, compositions, errors."""

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp
from fflow import lax
from fflow.test_util import check_grads

pytestmark = pytest.mark.usefixtures("x64")  # float64 references on purpose

rng = np.random.default_rng(1)


# -- references -------------------------------------------------------------------------
def rnn(w, h0, xs):
    def step(h, x):
        h = jnp.tanh(w * h + x)
        return h, h * x

    return lax.scan(step, h0, xs)


def rnn_ref(w, h0, xs):
    h, ys = h0, []
    for x in xs:
        h = np.tanh(w * h + x)
        ys.append(h * x)
    return h, np.stack(ys)


def rnn_loss(w, h0, xs):
    h, ys = rnn(w, h0, xs)
    return jnp.sum(h) + jnp.sum(ys**2)


W = rng.standard_normal((3,))
H0 = rng.standard_normal((3,))
XS = rng.standard_normal((5, 3))


# -- scan -----------------------------------------------------------------------------------
@pytest.mark.parametrize("jit", [False, True])
def test_scan_values(jit):
    f = fflow.jit(rnn) if jit else rnn
    h, ys = f(W, H0, XS)
    h_ref, ys_ref = rnn_ref(W, H0, XS)
    np.testing.assert_allclose(np.asarray(h), h_ref, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(ys), ys_ref, rtol=1e-6)


def test_scan_pytrees_reverse_and_length():
    init = {"a": np.float32(1.0), "b": (np.zeros(2, np.float32),)}
    xs = (np.arange(4.0, dtype=np.float32), np.ones((4, 2), np.float32))

    def f(c, x):
        s, v = x
        new = {"a": c["a"] * 2 + s, "b": (c["b"][0] + v * s,)}
        return new, {"p": c["a"] + s}

    for reverse in (False, True):
        carry, ys = lax.scan(f, init, xs, reverse=reverse)
        c = {"a": 1.0, "b": (np.zeros(2),)}
        order = range(3, -1, -1) if reverse else range(4)
        ps = [None] * 4
        for i in order:
            ps[i] = c["a"] + xs[0][i]
            c = {"a": c["a"] * 2 + xs[0][i], "b": (c["b"][0] + xs[1][i] * xs[0][i],)}
        np.testing.assert_allclose(float(carry["a"]), c["a"])
        np.testing.assert_allclose(np.asarray(carry["b"][0]), c["b"][0])
        np.testing.assert_allclose(np.asarray(ys["p"]), np.array(ps))
    carry, ys = lax.scan(lambda c, _: (c + 1, c * 2), 0, None, length=3)
    assert int(carry) == 3 and np.asarray(ys).tolist() == [0, 2, 4]


def test_scan_grads_order2():
    check_grads(rnn_loss, (W, H0, XS), order=2)


def test_scan_grad_jit_and_eager_agree():
    g = fflow.grad(rnn_loss, argnums=(0, 1, 2))(W, H0, XS)
    gj = fflow.jit(fflow.grad(rnn_loss, argnums=(0, 1, 2)))(W, H0, XS)
    for a, b in zip(g, gj):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)


def test_nested_scan_and_cond_in_scan_grads():
    def f(w, xs):
        def outer(c, row):
            inner_c, _ = lax.scan(lambda a, x: (a * w + jnp.sin(x), None), c, row)
            c2 = lax.cond(inner_c > 0, lambda v: v * w, lambda v: v - w, inner_c)
            return c2, c2

        c, ys = lax.scan(outer, 0.3, xs)
        return c + jnp.sum(ys)

    def ref(w, xs):
        c, total = 0.3, 0.0
        for row in xs:
            for x in row:
                c = c * w + np.sin(x)
            c = c * w if c > 0 else c - w
            total += c
        return c + total

    xs = rng.standard_normal((3, 4))
    np.testing.assert_allclose(float(f(0.7, xs)), ref(0.7, xs), rtol=1e-7)
    check_grads(f, (0.7, xs), order=2)


def test_jacfwd_equals_jacrev_through_scan():
    def f(x):
        return lax.scan(lambda c, xi: (c * xi + jnp.sin(c), c**2), x[:2], x.reshape(3, 2))[1]

    x = rng.standard_normal(6)
    np.testing.assert_allclose(
        np.asarray(fflow.jacfwd(f)(x)), np.asarray(fflow.jacrev(f)(x)), rtol=1e-6
    )


# -- cond / switch ----------------------------------------------------------------------
def branchy(x, y):
    return lax.cond(jnp.sum(x) > 0, lambda a, b: jnp.sin(a) * b, lambda a, b: a**2 - b, x, y)


def branchy_ref(x, y):
    return np.sin(x) * y if np.sum(x) > 0 else x**2 - y


@pytest.mark.parametrize("jit", [False, True])
def test_cond_values_and_grads(jit):
    f = fflow.jit(branchy) if jit else branchy
    for sign in (1.0, -1.0):
        x, y = sign * np.abs(rng.standard_normal(3)), rng.standard_normal(3)
        np.testing.assert_allclose(np.asarray(f(x, y)), branchy_ref(x, y), rtol=1e-6)
        check_grads(lambda a, b: jnp.sum(f(a, b)), (x, y), order=2)


def test_switch_clamps_and_differentiates():
    branches = [lambda v: v + 1.0, lambda v: jnp.sin(v), lambda v: v**3]
    refs = [lambda v: v + 1.0, np.sin, lambda v: v**3]
    x = np.float64(0.4)
    for i in (-3, 0, 1, 2, 9):
        out = lax.switch(i, branches, x)
        np.testing.assert_allclose(float(out), refs[int(np.clip(i, 0, 2))](x), rtol=1e-6)
        out = fflow.jit(lambda i, v: lax.switch(i, branches, v))(i, x)
        np.testing.assert_allclose(float(out), refs[int(np.clip(i, 0, 2))](x), rtol=1e-6)
    check_grads(lambda v: lax.switch(2, branches, v), (x,), order=2)


def test_cond_batched_predicate_selects_per_lane():
    xs = rng.standard_normal((6, 3))
    ys = rng.standard_normal((6, 3))
    out = fflow.vmap(branchy)(xs, ys)
    ref = np.stack([branchy_ref(x, y) for x, y in zip(xs, ys)])
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-6)
    # batched index into switch, unbatched operand; and vmap(grad(...))
    idx = np.array([0, 1, 2, 5, -1], np.int32)
    f = lambda i, v: lax.switch(i, [lambda a: a * 2.0, jnp.sin, jnp.cos], v)  # noqa: E731
    out = fflow.vmap(f, in_axes=(0, None))(idx, np.float64(0.3))
    np.testing.assert_allclose(
        np.asarray(out), [0.6, np.sin(0.3), np.cos(0.3), np.cos(0.3), 0.6], rtol=1e-6
    )
    g = fflow.vmap(fflow.grad(lambda v, i: f(i, v)), in_axes=(None, 0))(np.float64(0.3), idx)
    np.testing.assert_allclose(
        np.asarray(g), [2.0, np.cos(0.3), -np.sin(0.3), -np.sin(0.3), 2.0], rtol=1e-6
    )


# -- while / fori ---------------------------------------------------------------------------
def collatz_steps(n):
    def body(c):
        k, steps = c
        k = jnp.where(k % 2 == 0, k // 2, 3 * k + 1)
        return k, steps + 1

    return lax.while_loop(lambda c: c[0] != 1, body, (n, 0))[1]


def collatz_ref(n):
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


def test_while_values_eager_jit_and_vmap_with_different_trip_counts():
    ns = np.array([1, 2, 3, 6, 7, 27], np.int32)
    refs = [collatz_ref(int(n)) for n in ns]
    assert [int(collatz_steps(n)) for n in ns] == refs
    assert [int(fflow.jit(collatz_steps)(n)) for n in ns] == refs
    assert np.asarray(fflow.vmap(collatz_steps)(ns)).tolist() == refs
    assert np.asarray(fflow.jit(fflow.vmap(collatz_steps))(ns)).tolist() == refs


def power_loop(x, n):
    return lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * x), (0, 1.0))[1]


def test_while_jvp_and_batched_trip_counts():
    x = 1.3
    y, t = fflow.jvp(lambda v: power_loop(v, 5), (x,), (1.0,))
    np.testing.assert_allclose(float(y), x**5, rtol=1e-6)
    np.testing.assert_allclose(float(t), 5 * x**4, rtol=1e-6)
    ns = np.array([0, 2, 5], np.int32)
    xs = np.array([1.5, 1.5, 1.5])
    np.testing.assert_allclose(np.asarray(fflow.vmap(power_loop)(xs, ns)), 1.5**ns, rtol=1e-6)
    d = fflow.vmap(fflow.jacfwd(power_loop))(xs, ns)
    np.testing.assert_allclose(np.asarray(d), ns * 1.5 ** np.maximum(ns - 1, 0), rtol=1e-6)


def test_while_reverse_mode_error_names_the_fix():
    with pytest.raises(fflow.errors.FflowError) as e:
        fflow.grad(lambda v: power_loop(v, 5))(1.3)
    msg = str(e.value)
    assert "max_steps" in msg and "fori_loop" in msg and "test_control_flow.py" in msg


def test_while_max_steps_is_reverse_differentiable():
    def f(x):
        c = (0, 1.0)
        return lax.while_loop(lambda c: c[0] < 5, lambda c: (c[0] + 1, c[1] * x), c, max_steps=8)[1]

    np.testing.assert_allclose(float(f(1.3)), 1.3**5, rtol=1e-6)
    np.testing.assert_allclose(float(fflow.grad(f)(1.3)), 5 * 1.3**4, rtol=1e-6)
    check_grads(f, (1.3,), order=2)


def test_fori_loop_static_is_scan_and_traced_is_while():
    def f(x):
        return lax.fori_loop(0, 4, lambda i, s: s * x + i, 1.0)

    def ref(x):
        s = 1.0
        for i in range(4):
            s = s * x + i
        return s

    np.testing.assert_allclose(float(f(0.9)), ref(0.9), rtol=1e-6)
    check_grads(f, (0.9,), order=2)
    assert "scan" in str(fflow.make_jaxpr(f)(0.9))
    g = fflow.jit(lambda n, x: lax.fori_loop(0, n, lambda i, s: s + i * x, 0.0))
    np.testing.assert_allclose(float(g(5, 2.0)), 20.0)
    assert "while" in str(fflow.make_jaxpr(lambda n: lax.fori_loop(0, n, lambda i, s: s + i, 0))(5))


# -- compositions -------------------------------------------------------------------------
def test_compositions_vmap_grad_jit():
    ws = rng.standard_normal((4, 3))
    per = np.stack([np.asarray(fflow.grad(rnn_loss)(w, H0, XS)) for w in ws])
    vg = fflow.vmap(fflow.grad(rnn_loss), in_axes=(0, None, None))
    np.testing.assert_allclose(np.asarray(vg(ws, H0, XS)), per, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(fflow.jit(vg)(ws, H0, XS)), per, rtol=1e-6)
    vjg = fflow.vmap(fflow.jit(fflow.grad(rnn_loss)), in_axes=(0, None, None))
    np.testing.assert_allclose(np.asarray(vjg(ws, H0, XS)), per, rtol=1e-6)
    # grad of a vmapped sum over a batch of sequences = sum of per-sequence grads
    xss = rng.standard_normal((4, 5, 3))
    total = fflow.grad(lambda w: jnp.sum(fflow.vmap(rnn_loss, (None, None, 0))(w, H0, xss)))(W)
    ref = sum(np.asarray(fflow.grad(rnn_loss)(W, H0, x)) for x in xss)
    np.testing.assert_allclose(np.asarray(total), ref, rtol=1e-6)


def test_vmap_of_scan_with_batched_xs_and_carry():
    xss = rng.standard_normal((4, 5, 3))
    h0s = rng.standard_normal((4, 3))
    h, ys = fflow.vmap(rnn, in_axes=(None, 0, 0))(W, h0s, xss)
    for k in range(4):
        h_ref, ys_ref = rnn_ref(W, h0s[k], xss[k])
        np.testing.assert_allclose(np.asarray(h[k]), h_ref, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(ys[k]), ys_ref, rtol=1e-6)
    # xs batched along its second axis
    h2, _ = fflow.vmap(rnn, in_axes=(None, None, 1))(W, H0, xss.transpose(1, 0, 2))
    np.testing.assert_allclose(
        np.asarray(h2), np.asarray(fflow.vmap(rnn, (None, None, 0))(W, H0, xss)[0])
    )


# -- errors -----------------------------------------------------------------------------------
def test_mismatched_carry_type_errors_name_both_types_and_line():
    with pytest.raises(TypeError) as e:
        lax.scan(lambda c, x: (c + x, None), np.float32(0.0), np.ones((3, 2), np.float32))
    msg = str(e.value)
    assert "f32[]" in msg and "f32[2]" in msg and "test_control_flow.py" in msg
    with pytest.raises(TypeError, match="f64"):
        lax.fori_loop(0, 3, lambda i, s: s.astype(np.float64), np.float32(0))
    # a weakly typed (Python scalar) carry takes the body's type, as in JAX
    assert float(lax.fori_loop(0, 3, lambda i, s: s + 0.5, 0)) == 1.5
    with pytest.raises(TypeError, match="pytree structure"):
        lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1,), (0, 1.0))
    with pytest.raises(TypeError, match="same types"):
        lax.cond(True, lambda x: x, lambda x: jnp.stack([x, x]), 1.0)
    with pytest.raises(ValueError, match="leading axis sizes"):
        lax.scan(lambda c, x: (c, None), 0.0, (np.ones(3), np.ones(4)))
    with pytest.raises(TypeError, match="boolean scalar"):
        lax.while_loop(lambda c: c, lambda c: c + 1, 0)
