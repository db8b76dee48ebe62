"""JAX's sharding API on fflow's placements and SBP: a PartitionSpec is an N-D SBP,
device_put / jit(in_shardings=...) / with_sharding_constraint give the same layouts and
plans as the equivalent fflow.to_global / fflow.shard / with_sbp calls, and shard_map /
pmap give NumPy's numbers (simulated devices)."""

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp
from fflow import lax
from fflow.jax_sharding import Mesh, NamedSharding, make_mesh, shard_map, to_sbp
from fflow.jax_sharding import PartitionSpec as P

S, B = fflow.sbp.split, fflow.sbp.broadcast


def test_partition_spec_is_an_nd_sbp():
    m = make_mesh((2, 2), ("a", "b"))
    assert to_sbp(m, P("a", "b")) == (S(0), S(1))
    assert to_sbp(m, P("b", "a")) == (S(1), S(0))
    assert to_sbp(m, P(None, "b")) == (B, S(1))
    assert to_sbp(m, P(("a", "b"))) == (S(0), S(0))
    assert to_sbp(m, P()) == (B, B)
    with pytest.raises(ValueError, match="mesh axis 'c'"):
        to_sbp(m, P("c"))
    with pytest.raises(NotImplementedError, match="mesh order"):
        to_sbp(m, P(("b", "a")))
    assert m.placement == fflow.placement("cpu", [[0, 1], [2, 3]])
    assert Mesh(np.array(fflow.local_devices()[:4]).reshape(2, 2), ("a", "b")) == m


def test_device_put_lays_out_as_to_global():
    m = make_mesh((2, 2), ("a", "b"))
    x = np.arange(24.0, dtype=np.float32).reshape(4, 6)
    sharding = NamedSharding(m, P("b", "a"))
    y = fflow.device_put(x, sharding)
    ref = fflow.to_global(jnp.asarray(x), m.placement, (S(1), S(0)))
    assert y.sbp == ref.sbp == (S(1), S(0))
    for a, b in zip(y.to_local_shards(), ref.to_local_shards()):
        np.testing.assert_array_equal(a, b)
    assert y.sharding == sharding and y.sharding.shard_shape(x.shape) == (2, 3)
    np.testing.assert_array_equal(y, x)
    assert jnp.ones(2).sharding.device_set == jnp.ones(2).devices()
    assert fflow.device_put(jnp.ones(2)).devices() == {fflow.devices("cpu")[0]}


def test_jit_with_shardings_is_the_shard_plan():
    mesh = make_mesh((4,), ("x",))

    def f(a, b):
        return jnp.tanh(a @ b)

    a = np.random.RandomState(0).rand(8, 3).astype(np.float32)
    b = np.random.RandomState(1).rand(3, 2).astype(np.float32)
    j = fflow.jit(
        f,
        in_shardings=(NamedSharding(mesh, P("x")), NamedSharding(mesh, P())),
        out_shardings=NamedSharding(mesh, P("x")),
    )
    np.testing.assert_allclose(j(a, b), np.tanh(a @ b), rtol=1e-6)
    same = fflow.shard(f, mesh.placement, in_sbp=(S(0), B), out_sbp=S(0))
    assert str(j.sharded.plan(a, b)) == str(same.plan(a, b))
    with mesh:  # bare PartitionSpecs take the mesh of the context
        k = fflow.jit(f, in_shardings=(P(None, None), P(None, "x")), out_shardings=P(None, "x"))
        mixed = fflow.shard(f, mesh.placement, in_sbp=(B, S(1)), out_sbp=S(1))
        b4 = np.random.RandomState(2).rand(3, 4).astype(np.float32)
        assert str(k.sharded.plan(a, b4)) == str(mixed.plan(a, b4))


def test_with_sharding_constraint_is_with_sbp():
    mesh = make_mesh((2,), ("x",))

    def g(x):
        return fflow.with_sharding_constraint(x * 2, NamedSharding(mesh, P("x"))) + 1

    def h(x):
        return fflow.with_sbp(x * 2, S(0)) + 1

    x = np.arange(4.0, dtype=np.float32)
    sg = fflow.shard(g, mesh.placement)
    sh = fflow.shard(h, mesh.placement)
    assert str(sg.plan(x)) == str(sh.plan(x))
    np.testing.assert_allclose(sg(x), x * 2 + 1)


def test_shard_map_matches_numpy():
    mesh = make_mesh((4,), ("x",))
    x = np.arange(16.0, dtype=np.float32).reshape(8, 2)
    total = shard_map(lambda b: lax.psum(jnp.sum(b, axis=0), "x"), mesh, P("x"), P())
    np.testing.assert_allclose(total(x), x.sum(0))
    local = shard_map(lambda b: b - jnp.mean(b, axis=0), mesh, P("x"), P("x"))
    ref = x.reshape(4, 2, 2) - x.reshape(4, 2, 2).mean(1, keepdims=True)
    np.testing.assert_allclose(local(x), ref.reshape(8, 2))
    m2 = make_mesh((2, 2), ("a", "b"))
    w = np.arange(12.0, dtype=np.float32).reshape(4, 3)
    xx = np.arange(16.0, dtype=np.float32).reshape(4, 4)
    tp = shard_map(
        lambda xb, wb: lax.psum(xb @ wb, "b"), m2, in_specs=(P("a", "b"), P("b", None)),
        out_specs=P("a", None),
    )  # fmt: skip
    np.testing.assert_allclose(tp(xx, w), xx @ w)
    g = fflow.grad(lambda v: jnp.sum(total(v) ** 2))(x)
    np.testing.assert_allclose(g, np.broadcast_to(2 * x.sum(0), x.shape))


def test_pmap_and_device_counts():
    n = fflow.device_count()
    assert n == fflow.local_device_count() >= 4
    x = np.arange(8.0, dtype=np.float32).reshape(4, 2)
    out = fflow.pmap(lambda v: v / lax.psum(v, "i"), axis_name="i")(x)
    np.testing.assert_allclose(out, x / x.sum(0))
    with pytest.raises(ValueError, match="devices"):
        fflow.pmap(lambda v: v)(np.ones((n + 1, 2)))
