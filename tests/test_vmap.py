"""vmap against Python loops + np.stack, einsum, and the untransformed function."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fflow
import fflow.numpy as jnp
from fflow import lax

rng = np.random.default_rng(0)


def loop_vmap(f, in_axes, out_axes, *args):
    """The reference: slice each mapped argument, call f, stack along out_axes."""
    sizes = {a.shape[ax] for a, ax in zip(args, in_axes) if ax is not None}
    (n,) = sizes
    outs = []
    for i in range(n):
        sl = [a if ax is None else np.take(a, i, axis=ax) for a, ax in zip(args, in_axes)]
        outs.append(np.asarray(f(*[jnp.asarray(s) for s in sl])))
    return np.stack(outs, axis=out_axes)


UNARY = {
    "sin": jnp.sin,
    "tanh": jnp.tanh,
    "exp": jnp.exp,
    "sum0": lambda x: jnp.sum(x, axis=0),
    "max-1": lambda x: jnp.max(x, axis=-1),
    "cumsum": lambda x: jnp.cumsum(x, axis=-1),
    "transpose": lambda x: x.T,
    "reshape": lambda x: x.reshape(-1),
    "slice": lambda x: x[1:, ::2],
    "pad": lambda x: jnp.pad(x, ((1, 0), (0, 2))),
    "rev": lambda x: x[::-1],
    "concat": lambda x: jnp.concatenate([x, 2 * x], axis=1),
    "broadcast": lambda x: jnp.broadcast_to(x[:, None, :], (x.shape[0], 2, x.shape[1])),
    "argmax": lambda x: jnp.argmax(x, axis=0),
    "sort": lambda x: jnp.sort(x, axis=-1),
    "gather": lambda x: x[jnp.array([2, 0, 1])],
    "dynamic_slice": lambda x: lax.dynamic_slice(x, (1, 1), (2, 2)),
    "scatter_add": lambda x: x.at[jnp.array([0, 0, 2])].add(1.0),
    "squeeze": lambda x: jnp.squeeze(x[:1], 0),
    "where": lambda x: jnp.where(x > 0, x, 0.0),
    "matvec": lambda x: x @ jnp.arange(4.0),
    "cumprod": lambda x: jnp.cumprod(x, axis=0),
    "prod": lambda x: jnp.prod(x, axis=1),
}

BINARY = {
    "add": lambda x, y: x + y,
    "mul": lambda x, y: x * y,
    "max": jnp.maximum,
    "matmul": lambda x, y: x @ y.T,
    "concat": lambda x, y: jnp.concatenate([x, y], 0),
    "dus": lambda x, y: lax.dynamic_update_slice(x, y[:2, :2], (1, 1)),
    "select": lambda x, y: jnp.where(x > y, x, y),
    "dot_general_batch": lambda x, y: jnp.einsum("ij,ij->i", x, y),
}


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(sorted(UNARY)),
    in_axis=st.sampled_from([0, 1, 2, -1, -3]),
    out_axis=st.sampled_from([0, 1, -1]),
)
def test_unary_vmap_matches_loop(name, in_axis, out_axis):
    f = UNARY[name]
    base = rng.standard_normal((3, 4)).astype(np.float32)
    x = np.stack([base * (i + 1) for i in range(5)], axis=in_axis % 3)
    expected = loop_vmap(f, (in_axis,), out_axis, x)
    out_axis = out_axis if out_axis < 0 or out_axis <= expected.ndim - 1 else -1
    actual = fflow.vmap(f, in_axes=in_axis, out_axes=out_axis)(x)
    np.testing.assert_allclose(np.asarray(actual), expected, rtol=1e-5, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(sorted(BINARY)),
    axes=st.sampled_from([(0, 0), (1, 0), (0, None), (None, 2), (2, -1), (-1, None)]),
    out_axis=st.sampled_from([0, 1, -1]),
)
def test_binary_vmap_matches_loop(name, axes, out_axis):
    f = BINARY[name]
    n = 5

    def make(ax):
        base = rng.standard_normal((3, 4)).astype(np.float32)
        if ax is None:
            return base
        return np.stack([base + i for i in range(n)], axis=ax % 3)

    x, y = make(axes[0]), make(axes[1])
    expected = loop_vmap(f, axes, out_axis, x, y)
    actual = fflow.vmap(f, in_axes=axes, out_axes=out_axis)(x, y)
    np.testing.assert_allclose(np.asarray(actual), expected, rtol=1e-5, atol=1e-5)


def test_batched_indices_for_gather_and_dynamic_slice():
    x = rng.standard_normal((6, 5)).astype(np.float32)
    idx = np.array([0, 3, 5, 9], np.int32)  # 9 is clamped like dynamic_slice does
    f = lambda i: lax.dynamic_slice(jnp.asarray(x), (i, 1), (2, 3))  # noqa: E731
    np.testing.assert_allclose(
        np.asarray(fflow.vmap(f)(idx)), np.stack([np.asarray(f(int(i))) for i in idx])
    )
    g = lambda xx, i: xx[i]  # noqa: E731
    xs = rng.standard_normal((4, 6, 5)).astype(np.float32)
    np.testing.assert_allclose(
        np.asarray(fflow.vmap(g)(xs, idx % 6)), np.stack([xs[k][idx[k] % 6] for k in range(4)])
    )
    h = lambda xx, i, u: lax.dynamic_update_slice(xx, u, (i, 0))  # noqa: E731
    us = rng.standard_normal((4, 2, 5)).astype(np.float32)
    ref = np.stack([np.asarray(h(xs[k], int(idx[k]), us[k])) for k in range(4)])
    np.testing.assert_allclose(np.asarray(fflow.vmap(h)(xs, idx, us)), ref)
    s = lambda xx, i, u: jnp.asarray(xx).at[i].add(u)  # noqa: E731
    ref = np.stack([np.asarray(s(xs[k], int(idx[k] % 6), us[k, 0])) for k in range(4)])
    np.testing.assert_allclose(np.asarray(fflow.vmap(s)(xs, idx % 6, us[:, 0])), ref)


def test_pytree_in_axes_out_axes_and_kwargs():
    params = {"w": rng.standard_normal((3, 2)).astype(np.float32), "b": np.float32(0.5)}
    xs = rng.standard_normal((7, 3)).astype(np.float32)

    def f(p, x):
        y = x @ p["w"] + p["b"]
        return {"y": y, "n": jnp.sum(y)}

    out = fflow.vmap(f, in_axes=({"w": None, "b": None}, 0), out_axes={"y": 1, "n": 0})(params, xs)
    ref = [f(params, x) for x in xs]
    np.testing.assert_allclose(np.asarray(out["y"]), np.stack([r["y"] for r in ref], 1), 1e-5)
    np.testing.assert_allclose(np.asarray(out["n"]), np.stack([r["n"] for r in ref]), 1e-5)
    out2 = fflow.vmap(f, in_axes=(None, 0))(params, xs)
    np.testing.assert_allclose(np.asarray(out2["n"]), np.asarray(out["n"]))
    # list in_axes behave as tuples; None out_axes for an unbatched output
    g = fflow.vmap(lambda a, b: (a + b, jnp.sum(b)), in_axes=[0, None], out_axes=(0, None))
    s, t = g(xs, xs[0])
    assert s.shape == (7, 3) and t.shape == ()


def test_axis_size_and_unbatched_outputs():
    out = fflow.vmap(lambda x: x * 2, in_axes=None, axis_size=4)(jnp.arange(3.0))
    np.testing.assert_allclose(np.asarray(out), np.tile(np.arange(3.0) * 2, (4, 1)))
    out = fflow.vmap(lambda x: jnp.ones(2), in_axes=0)(jnp.arange(3.0))
    assert out.shape == (3, 2)


def test_nested_vmap_matches_einsum():
    a = rng.standard_normal((4, 3, 5)).astype(np.float32)
    b = rng.standard_normal((5, 6)).astype(np.float32)
    f = fflow.vmap(fflow.vmap(lambda r, m: r @ m, in_axes=(0, None)), in_axes=(0, None))
    np.testing.assert_allclose(
        np.asarray(f(a, b)), np.einsum("ijk,kl->ijl", a, b), rtol=1e-4, atol=1e-6
    )
    # inner maps axis 1 of b, outer maps axis 0 of a: out[j, i] = a[i] . b[:, j]
    a2 = rng.standard_normal((4, 5)).astype(np.float32)
    g = fflow.vmap(fflow.vmap(jnp.dot, in_axes=(0, None)), in_axes=(None, 1))
    np.testing.assert_allclose(
        np.asarray(g(a2, b)), np.einsum("ik,kj->ji", a2, b), rtol=1e-4, atol=1e-6
    )


def test_batch_size_mismatch_names_each_argument():
    def f(x, y):
        return x + y

    with pytest.raises(ValueError) as e:
        fflow.vmap(f)(np.ones((3, 2)), np.ones((4, 2)))
    msg = str(e.value)
    assert "x of shape (3, 2) has size 3" in msg and "y of shape (4, 2) has size 4" in msg
    assert "test_vmap.py" in msg
    with pytest.raises(ValueError, match="at least one non-None"):
        fflow.vmap(f, in_axes=None)(1.0, 2.0)
    with pytest.raises(ValueError, match="out_axes=None"):
        fflow.vmap(lambda x: x, out_axes=None)(np.ones(3))
    with pytest.raises(ValueError, match="out of range"):
        fflow.vmap(lambda x: x, in_axes=2)(np.ones((3, 2)))


def test_per_example_gradients_match_loop():
    w = rng.standard_normal((3, 2)).astype(np.float32)
    xs = rng.standard_normal((6, 3)).astype(np.float32)
    ys = rng.standard_normal((6, 2)).astype(np.float32)

    def loss(w, x, y):
        return jnp.sum((jnp.tanh(x @ w) - y) ** 2)

    per_ex = fflow.vmap(fflow.grad(loss), in_axes=(None, 0, 0))(w, xs, ys)
    ref = np.stack([np.asarray(fflow.grad(loss)(w, x, y)) for x, y in zip(xs, ys)])
    assert per_ex.shape == (6, 3, 2)
    np.testing.assert_allclose(np.asarray(per_ex), ref, rtol=1e-5, atol=1e-6)
    # grad of a vmapped sum equals the sum of per-example gradients
    total = fflow.grad(lambda w: jnp.sum(fflow.vmap(loss, (None, 0, 0))(w, xs, ys)))(w)
    np.testing.assert_allclose(np.asarray(total), ref.sum(0), rtol=1e-4, atol=1e-5)


def test_jit_vmap_compositions():
    xs = rng.standard_normal((5, 4)).astype(np.float32)
    f = lambda x: jnp.sum(jnp.sin(x) * x)  # noqa: E731
    ref = np.array([np.sum(np.sin(x) * x) for x in xs])
    np.testing.assert_allclose(np.asarray(fflow.jit(fflow.vmap(f))(xs)), ref, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(fflow.vmap(fflow.jit(f))(xs)), ref, rtol=1e-5)
    gref = np.sin(xs) + xs * np.cos(xs)
    np.testing.assert_allclose(
        np.asarray(fflow.jit(fflow.vmap(fflow.grad(f)))(xs)), gref, rtol=1e-5
    )
    np.testing.assert_allclose(np.asarray(fflow.vmap(fflow.jit(fflow.grad(f)))(xs)), gref, 1e-5)


@pytest.mark.usefixtures("x64_case")  # finite differences with eps 1e-6 need float64
def test_jacfwd_jacrev_hessian():
    x = rng.standard_normal(4)

    def f(v):
        return jnp.sin(v) * v[0] + jnp.cumsum(v) ** 2

    eps = 1e-6
    num = np.stack(
        [(np.asarray(f(x + eps * e)) - np.asarray(f(x - eps * e))) / (2 * eps) for e in np.eye(4)],
        axis=1,
    )
    np.testing.assert_allclose(np.asarray(fflow.jacfwd(f)(x)), num, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(fflow.jacrev(f)(x)), num, rtol=1e-6, atol=1e-7)
    h = fflow.hessian(lambda v: jnp.sum(jnp.sin(v) * v))(x)
    href = np.diag(2 * np.cos(x) - x * np.sin(x))
    np.testing.assert_allclose(np.asarray(h), href, rtol=1e-6, atol=1e-8)


def test_vmap_of_random_keys_and_python_scalars():
    out = fflow.vmap(lambda x, s: x * s, in_axes=(0, None))(jnp.arange(3.0), 2.0)
    np.testing.assert_allclose(np.asarray(out), [0.0, 2.0, 4.0])


def test_custom_rules_survive_vmap():
    @fflow.custom_jvp
    def f(x):
        return jnp.log(1.0 + jnp.exp(x))

    @f.defjvp
    def f_jvp(p, t):
        (x,), (tx,) = p, t
        return f(x), tx * 2.0  # not the true derivative: shows the rule is used

    xs = jnp.array([0.1, 0.2, 3.0])
    np.testing.assert_allclose(np.asarray(fflow.vmap(f)(xs)), np.log1p(np.exp(np.asarray(xs))))
    np.testing.assert_allclose(np.asarray(fflow.grad(lambda v: jnp.sum(fflow.vmap(f)(v)))(xs)), 2.0)
    np.testing.assert_allclose(np.asarray(fflow.vmap(fflow.grad(f))(xs)), 2.0)

    @fflow.custom_vjp
    def g(x, y):
        return jnp.sin(x) * y

    g.defvjp(lambda x, y: (g(x, y), (x, y)), lambda res, ct: (ct * 3.0, ct * jnp.sin(res[0])))
    gx, gy = fflow.grad(lambda v, w: jnp.sum(fflow.vmap(g, (0, None))(v, w)), (0, 1))(xs, 2.0)
    np.testing.assert_allclose(np.asarray(gx), 3.0)
    np.testing.assert_allclose(float(gy), np.sum(np.sin(np.asarray(xs))), rtol=1e-6)
    jac = fflow.jacrev(lambda v: fflow.vmap(g, (0, None))(v, 2.0))(xs)
    np.testing.assert_allclose(np.asarray(jac), 3.0 * np.eye(3))
    h = fflow.checkpoint(lambda x: jnp.sin(jnp.sin(x)))
    ref = np.cos(np.sin(np.asarray(xs))) * np.cos(np.asarray(xs))
    np.testing.assert_allclose(np.asarray(fflow.vmap(fflow.grad(h))(xs)), ref, rtol=1e-6)
    np.testing.assert_allclose(
        np.asarray(fflow.grad(lambda v: jnp.sum(fflow.vmap(h)(v)))(xs)), ref, rtol=1e-6
    )


ANY_SHAPE = {
    "cos": jnp.cos,
    "square_plus_self": lambda x: x * x + x,
    "sum_last": lambda x: jnp.sum(x, axis=-1),
    "min_first": lambda x: jnp.min(x, axis=0),
    "mean_all": jnp.mean,
    "logsumexp_rows": lambda x: jnp.log(jnp.sum(jnp.exp(x), axis=-1)),
    "flip_reshape": lambda x: x[::-1].reshape(-1),
    "expand_concat": lambda x: jnp.concatenate([x[None], x[None] * 2], axis=0),
    "cummax": lambda x: lax.cummax(x, axis=x.ndim - 1),
    "outer_last": lambda x: x[..., :, None] * x[..., None, :],
    "where_pos": lambda x: jnp.where(x > 0, x, -x),
    "argmin_first": lambda x: jnp.argmin(x, axis=0),
}


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_vmap_matches_loop_for_drawn_shapes_axes_and_primitives(data):
    shape = tuple(data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=3), label="shape"))
    batch = data.draw(st.integers(1, 4), label="batch")
    ndim = len(shape) + 1
    in_axis = data.draw(st.integers(-ndim, ndim - 1), label="in_axis")
    name = data.draw(st.sampled_from(sorted(ANY_SHAPE)), label="primitive")
    f = ANY_SHAPE[name]
    x = np.stack(
        [rng.standard_normal(shape).astype(np.float32) for _ in range(batch)], axis=in_axis % ndim
    )
    out_ndim = np.ndim(np.asarray(f(jnp.asarray(np.take(x, 0, axis=in_axis))))) + 1
    out_axis = data.draw(st.integers(-out_ndim, out_ndim - 1), label="out_axis")
    expected = loop_vmap(f, (in_axis,), out_axis, x)
    actual = fflow.vmap(f, in_axes=in_axis, out_axes=out_axis)(x)
    np.testing.assert_allclose(np.asarray(actual), expected, rtol=1e-5, atol=1e-5)


def test_select_with_batched_scalar_predicate_and_unbatched_cases():
    p = jnp.array([True, False, True])
    a, b = jnp.arange(3.0), -jnp.arange(3.0)
    out = fflow.vmap(lambda q: lax.select_n(q, a, b))(p)
    ref = np.stack([np.asarray(b) if q else np.asarray(a) for q in [True, False, True]])
    np.testing.assert_allclose(np.asarray(out), ref)
    bs = np.stack([np.asarray(b) * k for k in range(3)])
    out = fflow.vmap(lambda q, bb: lax.select_n(q, a, bb))(p, bs)
    ref = np.stack([bs[k] if q else np.asarray(a) for k, q in enumerate([True, False, True])])
    np.testing.assert_allclose(np.asarray(out), ref)
