"""Programs written against JAX's vmap / lax control flow run unchanged on fflow with
the same numbers, shapes and dtypes (JAX is an optional reference dependency)."""

import numpy as np
import pytest

import fflow
import fflow.numpy as fjnp
from fflow import lax as flax

jax = pytest.importorskip("jax")
jjnp = pytest.importorskip("jax.numpy")
from jax import lax as jlax  # noqa: E402


def programs(vmap, grad, jit, jnp, lax, jacfwd, jacrev, hessian):
    out = {}

    def f1(w, x):
        def step(c, xi):
            c = jnp.tanh(c @ w + xi)
            return c, jnp.sum(c**2)

        return lax.scan(step, jnp.zeros(3), x)

    w = np.eye(3, dtype=np.float32) * 0.5
    x = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    out["scan"] = f1(w, x)
    out["scan_grad"] = grad(lambda w: f1(w, x)[1].sum())(w)
    out["vmap_scan"] = vmap(f1, (None, 0))(w, np.stack([x, x * 2]))
    out["fori"] = lax.fori_loop(0, 10, lambda i, v: v * 0.9 + i, 1.0)
    out["fori_arr"] = lax.fori_loop(0, 3, lambda i, v: v.at[i].set(i * 2.0), jnp.zeros(3))
    out["while"] = lax.while_loop(
        lambda c: c[1] < 100.0, lambda c: (c[0] + 1, c[1] * 2.5), (0, 1.0)
    )
    out["cond"] = lax.cond(3 > 2, lambda a, b: a + b, lambda a, b: a - b, 1.0, 2.0)
    out["cond_tree"] = lax.cond(
        False, lambda d: {"a": d["a"] * 2}, lambda d: {"a": d["a"] + 1}, {"a": jnp.ones(2)}
    )
    out["switch"] = lax.switch(1, [jnp.sin, jnp.cos, jnp.tan], 0.5)
    out["vmap_cond"] = vmap(lambda p, v: lax.cond(p, jnp.sin, jnp.cos, v))(
        np.array([True, False]), np.array([0.1, 0.2], np.float32)
    )
    out["map"] = lax.map(lambda v: v**2, jnp.arange(4.0))
    out["ascan"] = lax.associative_scan(jnp.maximum, jnp.array([1.0, 3.0, 2.0, 5.0, 4.0]))
    out["jacfwd"] = jacfwd(lambda v: jnp.sin(v) * v.sum())(jnp.arange(3.0))
    out["jacrev"] = jacrev(lambda v: jnp.sin(v) * v.sum())(jnp.arange(3.0))
    out["hess"] = hessian(lambda v: jnp.sum(v**3))(jnp.arange(3.0))
    out["vmap_out"] = vmap(lambda a: (a, a.sum()), in_axes=1, out_axes=(1, 0))(
        np.ones((2, 3), np.float32)
    )
    out["vmap_neg"] = vmap(lambda a, b: a * b, in_axes=(-1, None))(np.ones((2, 3), np.float32), 2.0)
    out["nested"] = vmap(vmap(lambda a, b: a * b, (0, None)), (None, 0))(
        jnp.arange(3.0), jnp.arange(2.0)
    )
    out["scan_rev"] = lax.scan(lambda c, x: (c + x, c), 0.0, jnp.arange(4.0), reverse=True)
    out["scan_len"] = lax.scan(lambda c, _: (c * 2, c), 1, None, length=4)
    out["jit_fori"] = jit(lambda n: lax.fori_loop(0, n, lambda i, v: v + i, 0))(7)
    out["grad_fori"] = grad(lambda x: lax.fori_loop(0, 3, lambda i, v: v * x, 1.0))(2.0)
    out["grad_cond"] = grad(lambda x: lax.cond(x > 1, lambda y: y**2, lambda y: -y, x))(3.0)
    out["vmap_while"] = vmap(
        lambda n: lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * 2), (0, 1))
    )(jnp.array([1, 4, 2]))
    return out


def assert_same_results(a, b, **tol):
    """Every program's JAX result `a[k]` and fflow result `b[k]`: same leaves, shapes, dtypes
    and values (within `tol`)."""
    for k in a:
        la = jax.tree_util.tree_leaves(a[k])
        lb = fflow.tree_util.tree_leaves(b[k])
        assert len(la) == len(lb), k
        for p, q in zip(la, lb):
            p, q = np.asarray(p), np.asarray(q)
            assert p.shape == q.shape and p.dtype == q.dtype, (
                k,
                p.dtype,
                q.dtype,
                p.shape,
                q.shape,
            )
            np.testing.assert_allclose(q, p, err_msg=k, **tol)


def test_same_results_as_jax():
    a = programs(jax.vmap, jax.grad, jax.jit, jjnp, jlax, jax.jacfwd, jax.jacrev, jax.hessian)
    b = programs(
        fflow.vmap, fflow.grad, fflow.jit, fjnp, flax, fflow.jacfwd, fflow.jacrev, fflow.hessian
    )
    assert a.keys() == b.keys()
    assert_same_results(a, b, rtol=1e-5, atol=1e-6)


def programs2(jnp, lax, vmap, jit, grad):
    o = {}
    o["int_scan"] = lax.scan(lambda c, x: (c + x, c), 0, jnp.arange(5))
    o["fori_float"] = lax.fori_loop(0, 5, lambda i, x: x + i, 0.0)
    o["fori_arr_i"] = lax.fori_loop(0, 5, lambda i, x: x.at[i].set(i), jnp.zeros(5, jnp.int32))
    o["cond_int"] = lax.cond(True, lambda: 1, lambda: 2)
    o["while_tuple"] = lax.while_loop(
        lambda c: c[0] < 5, lambda c: (c[0] + 1, c[1] + 0.5), (0, 0.0)
    )
    o["vmap_cond_int"] = vmap(lambda p: lax.cond(p > 0, lambda: p * 2, lambda: p - 1))(
        jnp.arange(-2, 3)
    )
    o["switch_tree"] = lax.switch(
        2, [lambda x: (x, x), lambda x: (x * 2, x), lambda x: (x + 1, -x)], jnp.ones(2)
    )
    o["scan_none"] = lax.scan(lambda c, _: (c * 2, None), 1.0, None, length=3)
    o["scan_tree_xs"] = lax.scan(
        lambda c, x: (c + x["a"] * x["b"], x["a"]), 0.0, {"a": jnp.arange(3.0), "b": jnp.ones(3)}
    )
    o["jit_cond"] = jit(lambda x: lax.cond(x.sum() > 0, lambda y: y + 1, lambda y: y - 1, x))(
        jnp.arange(3.0)
    )
    o["vmap_scan_out1"] = vmap(
        lambda x: lax.scan(lambda c, v: (c + v, c * v), 0.0, x), out_axes=(0, 1)
    )(jnp.ones((2, 3)))
    o["map_tree"] = lax.map(lambda d: d["x"] * 2, {"x": jnp.arange(4.0)})
    o["scan_unroll"] = lax.scan(lambda c, x: (c * x, c), 1.0, jnp.arange(1.0, 4.0), unroll=2)
    o["scan_bool_carry"] = lax.scan(
        lambda c, x: (jnp.logical_or(c, x > 1), c), False, jnp.arange(3.0)
    )
    o["fori_neg"] = lax.fori_loop(3, 1, lambda i, x: x + i, 10)
    o["cond_operand_tuple"] = lax.cond(
        False, lambda t: t[0] + t[1], lambda t: t[0] * t[1], (jnp.float32(2), jnp.float32(3))
    )
    return o


def test_more_programs_same_results_as_jax():
    a = programs2(jjnp, jlax, jax.vmap, jax.jit, jax.grad)
    b = programs2(fjnp, flax, fflow.vmap, fflow.jit, fflow.grad)
    assert_same_results(a, b, rtol=1e-6)
