"""Random small programs with random input/output SBPs on random meshes: the sharded
result equals the unsharded function, and the bytes the runtime measured equal the
plan's cost."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import fflow
import fflow.numpy as jnp
from fflow.sharding import B, P, S, partial_max, runtime

OPS = ["tanh", "matmul", "sum0", "max1", "transpose", "add_other", "slice", "row_bias",
       "scale", "exp_mean", "concat"]  # fmt: skip
MESHES = [(2,), (3,), (4,), (2, 2)]
SBPS = [S(0), S(1), B, P, partial_max]


def build(ops):
    def f(x, y):
        h = x
        for op in ops:
            if h.ndim != 2:
                h = jnp.broadcast_to(h.reshape(1, -1) if h.ndim else h.reshape(1, 1), (3, 5))
            if op == "tanh":
                h = jnp.tanh(h)
            elif op == "matmul":
                h = h @ jnp.ones((h.shape[1], 4), jnp.float32) * 0.1
            elif op == "sum0":
                h = jnp.sum(h, axis=0, keepdims=True) + h
            elif op == "max1":
                h = h - jnp.max(h, axis=1, keepdims=True)
            elif op == "transpose":
                h = h.T
            elif op == "add_other":
                h = h + jnp.sum(y) * 0.01
            elif op == "slice":
                h = h[1:, :] if h.shape[0] > 1 else h
            elif op == "row_bias":
                h = h + y[0, : h.shape[1]].sum()
            elif op == "scale":
                h = h * 0.5 + 1.0
            elif op == "exp_mean":
                h = jnp.exp(h * 0.1) / jnp.mean(jnp.exp(h * 0.1))
            elif op == "concat":
                h = jnp.concatenate([h, h * 2.0], axis=1)
        return h, jnp.sum(h * h)

    return f


@settings(max_examples=25, deadline=None)
@given(
    ops=st.lists(st.sampled_from(OPS), min_size=1, max_size=5),
    mesh=st.sampled_from(MESHES),
    data=st.data(),
    rows=st.integers(4, 9),
    cols=st.integers(4, 8),
)
def test_random_programs(ops, mesh, data, rows, cols):
    n = int(np.prod(mesh))
    pl = fflow.placement("cpu", np.arange(n).reshape(mesh).tolist())
    rng = np.random.default_rng(rows * 31 + cols)
    x = rng.normal(size=(rows, cols)).astype(np.float32)
    y = rng.normal(size=(4, 8)).astype(np.float32)

    def nd():
        return tuple(data.draw(st.sampled_from(SBPS)) for _ in mesh)

    def out_nd():
        return tuple(data.draw(st.sampled_from([S(0), B, P])) for _ in mesh)

    f = build(ops)
    want_h, want_s = f(x, y)
    in_sbp = (nd(), nd())
    out_h = out_nd() if np.ndim(want_h) == 2 else None
    if out_h is not None and np.shape(want_h)[0] < n:  # a split would leave devices empty
        out_h = tuple(B if s == S(0) else s for s in out_h)
    sharded = fflow.shard(f, pl, in_sbp=in_sbp, out_sbp=(out_h, None))
    sp = sharded.plan(x, y)
    rt = runtime()
    before = rt.bytes_moved
    got_h, got_s = sharded(x, y)
    measured = rt.bytes_moved - before
    np.testing.assert_allclose(np.asarray(got_h), np.asarray(want_h), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(float(got_s), float(want_s), rtol=1e-4, atol=1e-3)
    # inputs arrive as local arrays and are scattered for free; the program's own
    # communication is exactly the plan's
    assert measured == sp.bytes


@settings(max_examples=15, deadline=None)
@given(
    ops=st.lists(st.sampled_from(OPS), min_size=1, max_size=4),
    mesh=st.sampled_from(MESHES),
    data=st.data(),
)
def test_random_programs_gradients(ops, mesh, data):
    n = int(np.prod(mesh))
    pl = fflow.placement("cpu", np.arange(n).reshape(mesh).tolist())
    rng = np.random.default_rng(len(ops))
    x = rng.normal(size=(6, 5)).astype(np.float32)
    y = rng.normal(size=(4, 8)).astype(np.float32)
    f = build(ops)

    def loss(x, y):
        return f(x, y)[1]

    in_sbp = tuple(tuple(data.draw(st.sampled_from(SBPS)) for _ in mesh) for _ in range(2))
    got = fflow.grad(fflow.shard(loss, pl, in_sbp=in_sbp), argnums=(0, 1))(x, y)
    want = fflow.grad(loss, argnums=(0, 1))(x, y)
    # sums are ordered differently per device: allow rounding relative to the largest
    # gradient (a gradient that cancels to ~0 keeps that absolute noise)
    scale = max(1.0, max(float(np.max(np.abs(np.asarray(w)))) for w in want))
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=2e-5 * scale)
