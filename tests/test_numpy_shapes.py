"""fflow.numpy shape functions against NumPy on drawn shapes; jit == eager; the
gradient of each (linear) shape op is checked against its transpose by an inner product."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fflow
import fflow.numpy as jnp
from fflow.dtypes import canonical_array

SETTINGS = settings(max_examples=10, deadline=None)


@st.composite
def arrays(draw, min_dims=1, max_dims=3):
    shape = draw(hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=1, max_side=4))
    dtype = draw(st.sampled_from([np.float32, np.int32, np.float64]))
    return draw(hnp.arrays(dtype, shape, elements=st.integers(-9, 9)))


def _same(out, expected):
    out = np.asarray(out)
    # JAX's rule (x64 off): NumPy's 64-bit results are 32-bit ones in JAX
    expected = canonical_array(np.asarray(expected))
    assert out.shape == np.shape(expected) and out.dtype == expected.dtype
    np.testing.assert_array_equal(out, expected)


@SETTINGS
@given(x=arrays(), data=st.data())
def test_axis_permutations(x, data):
    nd = x.ndim
    perm = data.draw(st.permutations(range(nd)))
    _same(jnp.transpose(x, perm), np.transpose(x, perm))
    _same(jnp.transpose(x), np.transpose(x))
    a, b = data.draw(st.integers(-nd, nd - 1)), data.draw(st.integers(-nd, nd - 1))
    _same(jnp.swapaxes(x, a, b), np.swapaxes(x, a, b))
    _same(jnp.moveaxis(x, a, b), np.moveaxis(x, a, b))
    _same(jnp.expand_dims(x, a), np.expand_dims(x, a))
    _same(jnp.flip(x, a), np.flip(x, a))
    _same(jnp.flip(x), np.flip(x))
    shift = data.draw(st.integers(-5, 5))
    _same(jnp.roll(x, shift, axis=a), np.roll(x, shift, axis=a))
    _same(jnp.roll(x, shift), np.roll(x, shift))
    _same(jnp.ravel(x), np.ravel(x))
    _same(jnp.reshape(x, (-1,) + x.shape[-1:]), np.reshape(x, (-1,) + x.shape[-1:]))
    _same(jnp.reshape(x, x.shape[::-1], order="F"), np.reshape(x, x.shape[::-1], order="F"))
    _same(jnp.squeeze(x[..., :1], -1), np.squeeze(x[..., :1], -1))


@SETTINGS
@given(x=arrays(), data=st.data())
def test_joining_and_splitting(x, data):
    nd = x.ndim
    ax = data.draw(st.integers(-nd, nd - 1))
    y = x * 2
    _same(jnp.concatenate([x, y, x], axis=ax), np.concatenate([x, y, x], axis=ax))
    _same(jnp.stack([x, y], axis=ax), np.stack([x, y], axis=ax))
    _same(jnp.concatenate([x, y], axis=None), np.concatenate([x, y], axis=None))
    n = x.shape[ax]
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=3)))
    for o, e in zip(jnp.split(x, cuts, axis=ax), np.split(x, cuts, axis=ax)):
        _same(o, e)
    for o, e in zip(jnp.array_split(x, 3, axis=ax), np.array_split(x, 3, axis=ax)):
        _same(o, e)
    reps = tuple(data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=4)))
    _same(jnp.tile(x, reps), np.tile(x, reps))
    r = data.draw(st.integers(1, 3))
    _same(jnp.repeat(x, r, axis=ax), np.repeat(x, r, axis=ax))
    _same(jnp.repeat(x, r), np.repeat(x, r))
    counts = np.asarray(data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)))
    _same(jnp.repeat(x, counts, axis=ax), np.repeat(x, counts, axis=ax))
    _same(jnp.broadcast_to(x, (2,) + x.shape), np.broadcast_to(x, (2,) + x.shape))


@SETTINGS
@given(x=arrays(), data=st.data())
def test_pad_take_sort(x, data):
    nd = x.ndim
    pw = [tuple(data.draw(st.lists(st.integers(0, 2), min_size=2, max_size=2))) for _ in range(nd)]
    for mode in ("constant", "edge", "wrap"):
        _same(jnp.pad(x, pw, mode=mode), np.pad(x, pw, mode=mode))
    _same(jnp.pad(x, 1, constant_values=5), np.pad(x, 1, constant_values=5))
    if min(x.shape) > 2:
        _same(jnp.pad(x, 2, mode="reflect"), np.pad(x, 2, mode="reflect"))
        _same(jnp.pad(x, 2, mode="symmetric"), np.pad(x, 2, mode="symmetric"))
    ax = data.draw(st.integers(-nd, nd - 1))
    n = x.shape[ax]
    idx = np.asarray(data.draw(st.lists(st.integers(-n, n - 1), min_size=1, max_size=5)))
    _same(jnp.take(x, idx, axis=ax), np.take(x, idx, axis=ax))
    _same(jnp.sort(x, axis=ax), np.sort(x, axis=ax))
    _same(jnp.argsort(x, axis=ax), np.argsort(x, axis=ax, kind="stable").astype(np.int32))
    order = np.argsort(x, axis=ax, kind="stable")
    _same(jnp.take_along_axis(x, order, axis=ax), np.take_along_axis(x, order, axis=ax))
    _same(jnp.sort(x, axis=None), np.sort(x, axis=None))
    desc = np.flip(np.argsort(np.flip(x, ax), axis=ax, kind="stable"), ax)
    desc = x.shape[ax] - 1 - desc
    _same(jnp.argsort(x, axis=ax, descending=True), desc.astype(np.int32))


@pytest.mark.usefixtures("x64_case")  # exact float64 gradients (rtol 1e-12)
def test_linear_shape_ops_grad_and_jit():
    x = np.random.RandomState(0).rand(2, 3, 4)
    ops = [
        lambda v: jnp.transpose(v, (2, 0, 1)),
        lambda v: jnp.reshape(v, (4, 6)),
        lambda v: jnp.concatenate([v, 2 * v], axis=1),
        lambda v: jnp.stack([v, v], axis=-1),
        lambda v: jnp.split(v, [1, 3], axis=2)[1],
        lambda v: jnp.tile(v, (1, 2, 1)),
        lambda v: jnp.repeat(v, 2, axis=0),
        lambda v: jnp.flip(v, 1),
        lambda v: jnp.roll(v, 2, axis=2),
        lambda v: jnp.pad(v, ((1, 0), (0, 2), (1, 1))),
        lambda v: jnp.pad(v, 1, mode="reflect"),
        lambda v: jnp.take(v, np.array([3, 0, 3]), axis=2),
        lambda v: jnp.broadcast_to(v, (5, 2, 3, 4)),
        lambda v: jnp.moveaxis(v, 0, -1),
        lambda v: jnp.squeeze(v[:, :1], 1),
    ]
    rng = np.random.RandomState(1)
    for op in ops:
        out = np.asarray(op(x))
        np.testing.assert_array_equal(np.asarray(fflow.jit(op)(x)), out)
        ct = rng.rand(*out.shape)
        g = np.asarray(fflow.grad(lambda v, op=op, ct=ct: jnp.sum(op(v) * ct))(x))
        # <op(e_i), ct> for each unit vector e_i: the exact gradient of a linear map
        ref = np.zeros_like(x)
        for i in np.ndindex(x.shape):
            e = np.zeros_like(x)
            e[i] = 1
            ref[i] = np.sum(np.asarray(op(e)) * ct)
        np.testing.assert_allclose(g, ref, rtol=1e-12, atol=1e-12)


def test_creation():
    _same(jnp.zeros((2, 3)), np.zeros((2, 3), np.float32))
    _same(jnp.ones(3, jnp.int32), np.ones(3, np.int32))
    _same(jnp.full((2,), 7), np.full((2,), 7, np.int32))
    _same(jnp.full_like(np.ones(2, np.float64), 3), np.full(2, 3.0))
    _same(jnp.arange(5), np.arange(5, dtype=np.int32))
    _same(jnp.arange(1.0, 2.0, 0.25), np.arange(1.0, 2.0, 0.25, dtype=np.float32))
    np.testing.assert_allclose(np.asarray(jnp.linspace(0, 1, 7)), np.linspace(0, 1, 7), rtol=1e-6)
    _same(jnp.eye(3, 4, k=1), np.eye(3, 4, k=1, dtype=np.float32))
    _same(jnp.zeros_like(np.ones(2, np.int8)), np.zeros(2, np.int8))
    _same(jnp.tri(3), np.tri(3, dtype=np.float32))
    _same(jnp.tril(np.ones((3, 3))), np.tril(np.ones((3, 3))))
    _same(jnp.triu(np.ones((3, 3)), 1), np.triu(np.ones((3, 3)), 1))
    for o, e in zip(
        jnp.meshgrid(jnp.arange(3), jnp.arange(2)), np.meshgrid(np.arange(3), np.arange(2))
    ):
        _same(o, e.astype(np.int32))
    x = np.arange(6.0).reshape(2, 3)
    # JAX copies: a later write into the caller's buffer must not show
    assert not np.shares_memory(np.asarray(jnp.asarray(x)), x)
    traced = fflow.jit(lambda v: jnp.array([v[0, 0], v[1, 2]]))(x)
    _same(traced, np.array([0.0, 5.0]))


def test_sort_grad_follows_the_permutation():
    x = np.array([[3.0, 1.0, 2.0], [0.5, 0.7, 0.1]])
    w = np.array([[1.0, 10.0, 100.0], [1.0, 10.0, 100.0]])
    g = np.asarray(fflow.grad(lambda v: jnp.sum(jnp.sort(v, axis=1) * w))(x))
    np.testing.assert_array_equal(g, [[100.0, 1.0, 10.0], [10.0, 100.0, 1.0]])


def test_nonzero_with_static_size_under_jit():
    x = np.array([[0, 3, 0], [1, 0, 2]])
    for size, fill in ((4, -1), (2, None), (3, 0)):
        out = fflow.jit(lambda a, s=size, f=fill: jnp.nonzero(a, size=s, fill_value=f))(x)
        ref = np.nonzero(x)
        for o, r in zip(out, ref):
            r = np.concatenate([r[:size], np.full(max(size - len(r), 0), fill or 0)])
            np.testing.assert_array_equal(np.asarray(o), r)
    np.testing.assert_array_equal(
        np.asarray(fflow.jit(lambda a: jnp.argwhere(a, size=3))(x)), np.argwhere(x)
    )
    np.testing.assert_array_equal(
        np.asarray(fflow.jit(lambda a: jnp.flatnonzero(a, size=3))(x)), np.flatnonzero(x)
    )


def test_array_methods():
    x = jnp.array([1.0, 3.0, 5.0])
    assert int(x.searchsorted(3.0)) == 1 and x.itemsize == 4
    np.testing.assert_array_equal(np.asarray(x.compress([True, False, True])), [1.0, 5.0])
    np.testing.assert_array_equal(np.asarray(x.imag), [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(np.asarray(jnp.array([0, 1]).choose([x[:2], x[1:]])), [1, 5])
    m = jnp.arange(6.0).reshape(2, 3)
    assert float(m.sum()) == 15 and m.mean(axis=0).tolist() == [1.5, 2.5, 3.5]
    assert m.T.shape == (3, 2) and m.reshape(3, 2).shape == (3, 2) and m.ravel().shape == (6,)
    assert m.max(axis=1).tolist() == [2.0, 5.0] and m.argmax(axis=1).tolist() == [2, 2]
    assert m.cumsum(axis=1).tolist() == [[0, 1, 3], [3, 7, 12]]
    assert m.astype(jnp.int32).dtype == np.int32 and m.squeeze().shape == (2, 3)
    assert m.clip(1, 4).tolist() == [[1, 1, 2], [3, 4, 4]]
    assert (m @ m.T).shape == (2, 2) and m.dot(m.T).shape == (2, 2)
