"""NumPy indexing (`x[idx]`) and functional updates (`x.at[idx].set/add/mul/min/max`)
against NumPy: ints, slices, None, Ellipsis, integer arrays, boolean masks; eager,
under jit and under grad."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fflow
import fflow.numpy as jnp

X = np.arange(24.0, dtype=np.float32).reshape(2, 3, 4)

BASIC = [
    1,
    -1,
    (1, 2),
    (0, -1, 3),
    slice(None, None, 2),
    (slice(None), slice(None, None, -1)),
    (0, slice(1, None, 2), slice(3, 0, -2)),
    (None, 0),
    (Ellipsis, 1),
    (0, Ellipsis, None, 1),
    slice(5, 10),
    (slice(-2, None), 1),
]
ADVANCED = [
    np.array([1, 0, 1]),
    (np.array([0, 1]), np.array([2, 0])),
    (slice(None), np.array([2, 0])),
    (np.array([0, 1]), slice(None), np.array([2, 0])),
    (np.array([[0], [1]]), np.array([0, 2, 1])),
    np.array([-1, -2]),
    (0, np.array([2, 1]), 1),
    (1, slice(None), np.array([0, 3])),
    (np.array([0, 1]), None),
    (slice(None), [2, 0]),  # a list inside the index tuple is an index array (JAX)
]
MASKS = [X > 10, np.array([True, False]), X[:, :, 0] > 3]


def _np_index(idx):
    return (
        tuple(idx)
        if isinstance(idx, list) and not isinstance(idx[0], (int, np.integer))
        else (np.asarray(idx) if isinstance(idx, list) else idx)
    )


def test_a_list_as_the_whole_index_raises_as_jax():
    with pytest.raises(TypeError, match="non-tuple sequence"):
        jnp.asarray(X)[[1, 0]]
    with pytest.raises(TypeError, match="non-tuple sequence"):
        jnp.asarray(X).at[[1, 0]].set(0.0)
    np.testing.assert_array_equal(jnp.asarray(X)[jnp.array([1, 0])], X[[1, 0]])


@pytest.mark.parametrize("idx", BASIC + ADVANCED + MASKS, ids=repr)
def test_getitem_matches_numpy(idx):
    out = jnp.asarray(X)[idx]
    expected = X[_np_index(idx)]
    assert out.shape == expected.shape
    np.testing.assert_array_equal(np.asarray(out), expected)


@pytest.mark.parametrize("idx", BASIC + ADVANCED[:5], ids=repr)
def test_getitem_under_jit_and_grad(idx):
    np.testing.assert_array_equal(np.asarray(fflow.jit(lambda v: v[idx])(X)), X[_np_index(idx)])
    g = np.asarray(fflow.grad(lambda v: jnp.sum(v[idx] * 2.0))(X))
    ref = np.zeros_like(X)
    np.add.at(ref, _np_index(idx), 2.0)
    np.testing.assert_array_equal(g, ref)


def _np_update(mode, idx, values):
    out = X.copy()
    idx = _np_index(idx)
    if mode == "set":
        out[idx] = values
    elif mode == "add":
        np.add.at(out, idx, values)
    elif mode == "mul":
        np.multiply.at(out, idx, values)
    elif mode == "min":
        np.minimum.at(out, idx, values)
    else:
        np.maximum.at(out, idx, values)
    return out


@pytest.mark.parametrize("mode", ["set", "add", "mul", "min", "max"])
@pytest.mark.parametrize("idx", BASIC[:8] + ADVANCED[:4] + MASKS[:1], ids=repr)
def test_at_updates_match_numpy(mode, idx):
    shape = X[_np_index(idx)].shape
    values = np.linspace(-5, 30, int(np.prod(shape))).reshape(shape).astype(np.float32)
    out = getattr(jnp.asarray(X).at[idx], mode)(values)
    np.testing.assert_allclose(np.asarray(out), _np_update(mode, idx, values))
    # a scalar broadcasts
    out = getattr(jnp.asarray(X).at[idx], mode)(7.0)
    np.testing.assert_allclose(np.asarray(out), _np_update(mode, idx, 7.0))


def test_at_semantics():
    z = jnp.zeros(5)
    np.testing.assert_array_equal(np.asarray(z.at[np.array([0, 0, 2])].add(1.0)), [2, 0, 1, 0, 0])
    np.testing.assert_array_equal(np.asarray(z.at[10].set(1.0)), np.zeros(5))  # dropped
    np.testing.assert_array_equal(np.asarray(jnp.arange(5)[np.array([7, -9])]), [4, 0])  # clamped
    np.testing.assert_array_equal(np.asarray(z.at[1].set(5)), [0, 5, 0, 0, 0])
    assert z.at[1].set(5).dtype == np.float32
    assert np.asarray(z).sum() == 0  # the original is untouched
    np.testing.assert_array_equal(np.asarray(z.at[2].get()), 0.0)
    with pytest.raises(TypeError, match="at\\[idx\\].set"):
        z[0] = 1.0


def test_traced_indices_and_updates():
    f = fflow.jit(lambda v, i: v[i, 1:3])
    np.testing.assert_array_equal(np.asarray(f(X, 1)), X[1, 1:3])
    g = fflow.jit(lambda v, i, u: v.at[i].add(u))
    np.testing.assert_array_equal(np.asarray(g(X, 1, 1.0)), _np_update("add", 1, 1.0))
    idx = np.array([0, 0])
    np.testing.assert_array_equal(np.asarray(g(X, idx, 1.0)), _np_update("add", idx, 1.0))
    h = fflow.jit(lambda v, i: v[i])
    np.testing.assert_array_equal(np.asarray(h(np.arange(5.0), -1)), 4.0)
    # gradient flows to both the array and the update values
    gx, gu = fflow.grad(lambda v, u: jnp.sum(v.at[0, 1].set(u) ** 2), argnums=(0, 1))(X, 3.0)
    ref = 2 * X
    ref[0, 1] = 0
    np.testing.assert_allclose(np.asarray(gx), ref)
    assert float(gu) == pytest.approx(2 * 3.0 * 4)


@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_drawn_integer_array_indices(data):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4))
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    k = data.draw(st.integers(1, len(shape)))
    idx = tuple(
        np.asarray(data.draw(st.lists(st.integers(-n, n - 1), min_size=3, max_size=3)))
        for n in shape[:k]
    )
    np.testing.assert_array_equal(np.asarray(jnp.asarray(x)[idx]), x[idx])
    ref = x.copy()
    np.add.at(ref, idx, 1.0)
    np.testing.assert_array_equal(np.asarray(jnp.asarray(x).at[idx].add(1.0)), ref)


def test_out_of_bounds_array_indices_drop_their_updates():
    z = jnp.zeros(5)
    np.testing.assert_array_equal(np.asarray(z.at[np.array([1, 7])].set(1.0)), [0, 1, 0, 0, 0])
    np.testing.assert_array_equal(np.asarray(z.at[np.array([1, -7])].add(1.0)), [0, 1, 0, 0, 0])
    f = fflow.jit(lambda i: jnp.zeros(5).at[i].add(1.0))
    np.testing.assert_array_equal(np.asarray(f(np.array([1, 7]))), [0, 1, 0, 0, 0])
    np.testing.assert_array_equal(np.asarray(f(9)), np.zeros(5))
    np.testing.assert_array_equal(np.asarray(f(-1)), [0, 0, 0, 0, 1])
    out = jnp.zeros((3, 4)).at[np.array([0, 5]), 1].set(1.0)
    np.testing.assert_array_equal(np.asarray(out)[:, 1], [1, 0, 0])
    # gradients skip the dropped updates too
    g = fflow.grad(lambda u: jnp.sum(jnp.zeros(5).at[np.array([1, 7])].add(u) ** 2))(
        np.array([2.0, 3.0])
    )
    np.testing.assert_array_equal(np.asarray(g), [4.0, 0.0])


def test_take_and_update_modes():
    x = np.arange(20.0, dtype=np.float32).reshape(4, 5)
    idx = np.array([0, 3, 7, -1])
    out = np.asarray(jnp.take(x, idx, axis=1))  # JAX's default mode: fill with NaN
    np.testing.assert_array_equal(out[:, [0, 1, 3]], x[:, [0, 3, 4]])
    assert np.isnan(out[:, 2]).all()
    out = np.asarray(jnp.take(x, idx, axis=1, mode="fill", fill_value=-9.0))
    np.testing.assert_array_equal(out[:, 2], -9.0)
    np.testing.assert_array_equal(
        np.asarray(jnp.take(x, idx, axis=1, mode="clip")), x[:, [0, 3, 4, 0]]
    )
    np.testing.assert_array_equal(
        np.asarray(jnp.take(x, idx, axis=1, mode="wrap")), np.take(x, idx, axis=1, mode="wrap")
    )
    assert jnp.take(np.arange(3, dtype=np.int32), np.array([5])).tolist() == [
        np.iinfo(np.int32).min
    ]
    z = np.zeros((4, 2), np.float32)
    out = jnp.asarray(z).at[np.array([0, 9])].set(1.0, mode="clip")
    np.testing.assert_array_equal(np.asarray(out)[:, 0], [1, 0, 0, 1])
    out = jnp.asarray(z).at[np.array([0, 9])].set(1.0, mode="drop")
    np.testing.assert_array_equal(np.asarray(out)[:, 0], [1, 0, 0, 0])


def test_linspace_with_array_endpoints():
    out = jnp.linspace(jnp.zeros(2), jnp.array([1.0, 2.0]), 3)
    np.testing.assert_allclose(np.asarray(out), np.linspace(np.zeros(2), [1.0, 2.0], 3))
    out = jnp.linspace(jnp.zeros(2), jnp.ones(2), 3, axis=1)
    np.testing.assert_allclose(np.asarray(out), np.linspace(np.zeros(2), np.ones(2), 3, axis=1))


def test_static_out_of_range_index_clamps_as_jax():
    # recorded from JAX 0.10.2: retrieval clamps (x[11] of 10 values is x[9], x[-11] is x[0])
    g = jnp.arange(10.0)
    assert [float(g[11]), float(g[-11]), float(g[-12])] == [9.0, 0.0, 0.0]
    m = jnp.arange(12.0).reshape(3, 4)
    assert m[5].tolist() == [8.0, 9.0, 10.0, 11.0] and float(m[1, 7]) == 7.0
    assert float(fflow.jit(lambda x: x[11])(g)) == 9.0
    assert m[5:7].shape == (0, 4)
