"""Collectives over a named vmap axis (psum, pmean, pmax, pmin, all_gather,
axis_index) against NumPy, JAX's numbers, and check_grads through the vmap."""

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp
from fflow import lax
from fflow.test_util import check_grads

pytestmark = pytest.mark.usefixtures("x64")  # float64 references on purpose

rng = np.random.default_rng(3)
X = rng.standard_normal((4, 3))


def test_values_against_numpy():
    vm = lambda f: fflow.vmap(f, axis_name="i")  # noqa: E731
    np.testing.assert_allclose(
        np.asarray(vm(lambda v: lax.psum(v, "i"))(X)), np.tile(X.sum(0), (4, 1))
    )
    np.testing.assert_allclose(np.asarray(vm(lambda v: v - lax.pmean(v, "i"))(X)), X - X.mean(0))
    np.testing.assert_allclose(
        np.asarray(vm(lambda v: lax.pmax(v, "i"))(X)), np.tile(X.max(0), (4, 1))
    )
    np.testing.assert_allclose(
        np.asarray(vm(lambda v: lax.pmin(v, "i"))(X)), np.tile(X.min(0), (4, 1))
    )
    np.testing.assert_allclose(
        np.asarray(vm(lambda v: lax.all_gather(v, "i"))(X)), np.tile(X, (4, 1, 1))
    )
    tiled = vm(lambda v: lax.all_gather(v, "i", axis=0, tiled=True))(X)
    np.testing.assert_allclose(np.asarray(tiled), np.tile(X.reshape(-1), (4, 1)))
    idx = vm(lambda v: lax.axis_index("i") * jnp.ones_like(v))(X)
    np.testing.assert_allclose(np.asarray(idx), np.arange(4)[:, None] * np.ones((4, 3)))
    assert np.asarray(vm(lambda v: lax.psum(1, "i"))(X)).tolist() == [4, 4, 4, 4]


def test_nested_names_and_control_flow_and_jit():
    m = rng.standard_normal((2, 3))
    inner = fflow.vmap(lambda v: lax.psum(v, "j"), axis_name="j")
    np.testing.assert_allclose(
        np.asarray(fflow.vmap(inner, axis_name="i")(m)), np.tile(m.sum(1, keepdims=True), (1, 3))
    )
    both = fflow.vmap(fflow.vmap(lambda v: lax.psum(v, ("i", "j")), axis_name="j"), axis_name="i")
    np.testing.assert_allclose(np.asarray(both(m)), np.full((2, 3), m.sum()))
    outer = fflow.vmap(fflow.vmap(lambda v: lax.psum(v, "i"), axis_name="j"), axis_name="i")
    np.testing.assert_allclose(np.asarray(outer(m)), np.tile(m.sum(0), (2, 1)))

    def running(v):
        return lax.scan(lambda c, t: (c + lax.psum(t, "i"), None), 0.0, v)[0]

    out = fflow.jit(fflow.vmap(running, axis_name="i"))(m)
    np.testing.assert_allclose(np.asarray(out), np.full(2, m.sum()))
    cond = fflow.vmap(
        lambda v: lax.cond(v[0] > 0, lambda a: lax.pmax(a, "i"), lambda a: a, v), axis_name="i"
    )
    ref = np.where(m[:, :1] > 0, np.tile(m.max(0), (2, 1)), m)
    np.testing.assert_allclose(np.asarray(cond(m)), ref)


def test_gradients_through_named_collectives():
    def in_vmap(f):
        return lambda x: fflow.vmap(f, axis_name="i")(x)

    for f in (
        lambda v: v * lax.psum(v, "i"),
        lambda v: jnp.sin(v - lax.pmean(v, "i")),
        lambda v: v * lax.pmax(v, "i"),
        lambda v: v * lax.pmin(v, "i"),
        lambda v: v * jnp.sum(lax.all_gather(v, "i") ** 2, 0),
    ):
        check_grads(in_vmap(f), (X,), order=2)
    # per-example gradients with a batch statistic (vmap outside grad)
    g = fflow.vmap(fflow.grad(lambda a: a * lax.psum(a, "i")), axis_name="i")(np.arange(4.0))
    np.testing.assert_allclose(np.asarray(g), [12.0] * 4)  # S + sum of the others' a_j


def test_same_numbers_as_jax():
    jax = pytest.importorskip("jax")
    for f_jax, f_ff in (
        (lambda v: v / jax.lax.psum(v, "i"), lambda v: v / lax.psum(v, "i")),
        (
            jax.grad(lambda a: a * jax.lax.psum(a, "i")),
            fflow.grad(lambda a: a * lax.psum(a, "i")),
        ),
        (lambda v: jax.lax.all_gather(v, "i", axis=1), lambda v: lax.all_gather(v, "i", axis=1)),
        (lambda v: v * jax.lax.axis_index("i"), lambda v: v * lax.axis_index("i")),
    ):
        x = np.arange(1.0, 5.0, dtype=np.float32)
        if "all_gather" in repr(f_ff.__code__.co_names):
            x = np.arange(8.0, dtype=np.float32).reshape(4, 2)
        want = np.asarray(jax.vmap(f_jax, axis_name="i")(x))
        got = np.asarray(fflow.vmap(f_ff, axis_name="i")(x))
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_unbound_axis_name_errors():
    with pytest.raises(NameError, match="unbound axis name"):
        lax.psum(jnp.ones(3), "i")
    with pytest.raises(NameError, match="axis_name='k'"):
        fflow.vmap(lambda v: lax.psum(v, "k"), axis_name="i")(jnp.ones(3))
