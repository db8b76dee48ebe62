"""The NumPy backend's cheap forms of reductions and broadcasts: `ufunc.reduce` for
reduce_sum / reduce_max, broadcasts that ufuncs read as their sources (the
`np.broadcast_to` view dropped when nothing else reads it). Every result is compared
bit for bit with NumPy's own functions or with the untransformed function."""

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp


def _bits_equal(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape)
    assert got.tobytes() == want.tobytes()


def _kernel_source(jitted, *args):
    text = jitted.lower(*args).as_text()
    return text[text.index("def fflow_kernel") :]


RNG = np.random.default_rng(0)


@pytest.mark.usefixtures("x64_case")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "shape,axes", [((128, 10), (1,)), ((128, 10), (0,)), ((3, 4, 5), (0, 2)), ((7,), (0,))]
)
def test_reductions_are_numpys_sum_and_max_bit_for_bit(dtype, shape, axes):
    x = RNG.normal(size=shape).astype(dtype)
    x.flat[0] = -0.0
    x.flat[-1] = 0.0
    f = fflow.jit(lambda a: (jnp.sum(a, axis=axes), jnp.max(a, axis=axes), jnp.min(a, axis=axes)))
    s, m, n = f(jnp.asarray(x))
    _bits_equal(s, np.sum(x, axis=axes))
    _bits_equal(m, np.max(x, axis=axes))
    _bits_equal(n, np.min(x, axis=axes))
    src = _kernel_source(f, jnp.asarray(x))
    assert "np.add.reduce(" in src
    assert ("np.maximum.reduce(" in src) == (len(shape) > len(axes))  # 0-d: the impl
    assert ("np.minimum.reduce(" in src) == (len(shape) > len(axes))


def test_reductions_of_nan_and_broadcast_inputs():
    x = RNG.normal(size=(6, 9)).astype(np.float32)
    x[2, 3] = np.nan
    v = RNG.normal(size=9).astype(np.float32)
    f = fflow.jit(
        lambda a, b: (jnp.max(a, axis=1), jnp.sum(a + b, axis=0), jnp.sum(b * 0 + a), a.min(0))
    )
    m, s, t, n = f(jnp.asarray(x), jnp.asarray(v))
    _bits_equal(m, np.max(x, axis=1))
    _bits_equal(n, np.min(x, axis=0))
    _bits_equal(s, np.sum(x + v, axis=0))
    _bits_equal(t, np.sum(v * np.float32(0) + x))


def _cases():
    col = RNG.normal(size=(8,)).astype(np.float32)
    row = RNG.normal(size=(5,)).astype(np.float32)
    x = RNG.normal(size=(8, 5)).astype(np.float32)
    const = RNG.normal(size=(8,)).astype(np.float32)
    return [
        # (name, function, arguments, whether the kernel should need no broadcast_to)
        ("column", lambda x, c: x * c[:, None], (x, col), True),
        ("row, leading unit axis", lambda x, r: x - r, (x, row), True),
        ("keepdims max", lambda x: x - jnp.max(x, axis=1, keepdims=True), (x,), True),
        ("scalar array", lambda x, s: x / s, (x, np.float32(3.0)), True),
        ("two sources meet", lambda c, r: c[:, None] + r[None, :], (col, row), True),
        ("closed-over constant", lambda x: x * const[:, None], (x,), True),
        (
            "only a literal beside it",
            lambda c: jnp.broadcast_to(c[:, None], (8, 5)) * 2.0,
            (col,),
            False,
        ),
        (
            "read by a reduction",
            lambda c: jnp.sum(jnp.broadcast_to(c[:, None], (8, 5)), 0),
            (col,),
            False,
        ),
        (
            "an output",
            lambda x, c: (x * c[:, None], jnp.broadcast_to(c[:, None], (8, 5))),
            (x, col),
            False,
        ),
        (
            "broadcast of a broadcast",
            lambda x, r: x + jnp.broadcast_to(r, (8, 5))[None],
            (x, row),
            None,
        ),
        (
            "select with a broadcast mask",
            lambda x, c: jnp.where(c[:, None] > 0, x, -x),
            (x, col),
            None,
        ),
        (
            "reshape chains of a transposed array, the middle one read",
            lambda x: (x.T.reshape(-1), x.T.reshape(-1).reshape(4, 10) * 2.0),
            (x,),
            None,
        ),
        (
            "inside a scan body",
            lambda x, c: fflow.lax.scan(lambda h, r: (h * c[:, None] - r, h.sum()), x, x[None])[0],
            (x, col),
            None,
        ),
        (
            "log-softmax cross-entropy grad",
            fflow.grad(lambda h, y: -jnp.mean(jnp.sum(fflow.nn.log_softmax(h) * y, axis=-1))),
            (x, np.eye(5, dtype=np.float32)[np.arange(8) % 5]),
            True,
        ),
    ]


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_broadcasts_read_as_sources_give_the_eager_bits(case):
    name, f, args, no_view = case
    args = [jnp.asarray(a) for a in args]
    want = f(*args)  # eager: every primitive's own implementation
    jf = fflow.jit(f)
    for _ in range(2):
        got = jf(*args)
        for g, w in zip(fflow.tree_util.tree_leaves(got), fflow.tree_util.tree_leaves(want)):
            _bits_equal(g, w)
    src = _kernel_source(jf, *args)
    if no_view is True:
        assert "np.broadcast_to(" not in src, src
    elif no_view is False:
        assert "np.broadcast_to(" in src, src


def test_a_kept_view_is_the_full_shape_and_read_only():
    c = jnp.asarray(RNG.normal(size=(8,)).astype(np.float32))
    out = fflow.jit(lambda c: jnp.broadcast_to(c[:, None], (8, 5)))(c)
    assert out.shape == (8, 5)
    np.testing.assert_array_equal(out, np.broadcast_to(np.asarray(c)[:, None], (8, 5)))


_REDUCE = [jnp.sum, jnp.max]
_BIN = [jnp.add, jnp.subtract, jnp.multiply, jnp.divide, jnp.maximum]


def _program(ops):
    def f(x, y):
        vals = [x, y]
        for kind, a, b, c in ops:
            u = vals[-1]
            if kind == 0:  # u op reduce(v, axis, keepdims): a row or column broadcast
                r = _REDUCE[a % 2](vals[b % len(vals)], axis=c % 2, keepdims=True)
                vals.append(_BIN[b % 5](u, r) if c % 3 else _BIN[b % 5](r, u))
            elif kind == 1:  # a broadcast with only a literal beside it
                r = _REDUCE[a % 2](u, axis=b % 2, keepdims=True)
                vals.append(jnp.broadcast_to(r, u.shape) * 0.5 + vals[c % len(vals)])
            elif kind == 3:  # broadcast_in_dim of a reduction along a kept axis
                r = _REDUCE[a % 2](vals[b % len(vals)], axis=1 - c % 2)
                r = fflow.lax.broadcast_in_dim(r, u.shape, (c % 2,))
                vals.append(_BIN[b % 5](u, r) if a % 3 else _BIN[b % 5](r, r * u))
            elif kind == 2:  # two broadcasts meeting
                r0 = jnp.max(vals[a % len(vals)], axis=0, keepdims=True)
                r1 = jnp.sum(vals[b % len(vals)], axis=1, keepdims=True)
                vals.append(_BIN[c % 5](r1, r0))
            else:  # elementwise
                vals.append(_BIN[a % 5](u, vals[b % len(vals)]))
        return vals[-1], vals[len(vals) // 2], jnp.sum(vals[-1], axis=0)

    return f


def test_random_broadcast_programs_give_the_eager_bits():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    draw = st.tuples(st.integers(0, 4), st.integers(0, 9), st.integers(0, 9), st.integers(0, 9))

    @settings(max_examples=40, deadline=None)
    @given(st.lists(draw, min_size=1, max_size=8), st.booleans())
    def run(ops, donate):
        x = RNG.choice(np.array([0.0, -0.0, 1.5, -2.0, 3.0], np.float32), size=(3, 4))
        y = RNG.normal(size=(3, 4)).astype(np.float32)
        f = _program(ops)
        with np.errstate(all="ignore"):
            want = f(jnp.asarray(x), jnp.asarray(y))
            jf = fflow.jit(f, donate_argnums=(0,) if donate else ())
            got = jf(jnp.asarray(x.copy()), jnp.asarray(y))
        for g, w in zip(got, want):
            _bits_equal(g, w)

    run()


def test_unread_views_and_donation_flags_leave_the_kernel():
    w = RNG.normal(size=(4, 3)).astype(np.float32)
    v = RNG.normal(size=(4,)).astype(np.float32)

    def f(w, v):
        r = jnp.reshape(v, (4, 1)).reshape(4)  # reshapes that only a broadcast reads
        return (w * 2.0 + r[:, None],)  # w * 2 may go into w's donated buffer

    def g(w, v):
        return jnp.sum(w, axis=1) + v  # w is donated but not written

    for fn, flag in ((f, True), (g, False)):
        jf = fflow.jit(fn, donate_argnums=(0,))
        src = _kernel_source(jf, jnp.asarray(w), jnp.asarray(v))
        for _ in range(2):
            a = jnp.asarray(w.copy())
            got = jf(a, jnp.asarray(v))
            assert a.is_deleted()
            want = fn(jnp.asarray(w), jnp.asarray(v))
            for x, y in zip(fflow.tree_util.tree_leaves(got), fflow.tree_util.tree_leaves(want)):
                _bits_equal(x, y)
        assert "np.broadcast_to(" not in src and ".reshape((4,))" not in src, src
        assert ("own0 = " in src) == flag and (" if own0 " in src) == flag, src
