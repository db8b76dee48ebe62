"""take_along_axis as its own primitive (primitives/along_axis.py), with its transpose
scatter_add_along_axis: values against NumPy, gradients against JAX, vmap against a
loop, the CUDA kernels through the host shim, and under `shard`: every dimension but
the indexed one is a batch dimension, so a cross-entropy with the batch split plans no
conversion of logits or targets (simulated devices and fflow.launch -n 2 / -n 4), and
gpt_chars' step with its parameters kept in place moves about as few bytes as the free
plan."""

import os
import sys

import jax
import jax.numpy as jjnp
import numpy as np
import pytest
from mpi_util import launch_result, mpi_available
from take_along_axis_shard_script import cross_entropy, data, layouts, run

import fflow
import fflow.numpy as jnp
from fflow import lax
from fflow.sharding import B, S

rng = np.random.default_rng(0)
X = rng.normal(size=(3, 5, 4)).astype(np.float32)


def _indices(axis, m, dtype, broadcast=False, lo=None):
    """Indices for X along `axis`, `m` per line, in [-n, n) (NumPy's range) ; with
    `broadcast` every other dim but the last has size 1."""
    n = X.shape[axis]
    shape = list(X.shape)
    shape[axis] = m
    if broadcast:
        shape = [s if d in (axis % 3, 2) else 1 for d, s in enumerate(shape)]
    return rng.integers(-n if lo is None else lo, n, size=shape).astype(dtype)


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32])
@pytest.mark.parametrize("broadcast", [False, True])
def test_values_match_numpy(axis, dtype, broadcast):
    idx = _indices(axis, 3, dtype, broadcast, lo=0 if dtype == np.uint32 else None)
    want = np.take_along_axis(X, idx, axis=axis)
    got = jnp.take_along_axis(X, idx, axis=axis)
    np.testing.assert_array_equal(np.asarray(got), want)
    jitted = fflow.jit(lambda x, i: jnp.take_along_axis(x, i, axis=axis))(X, idx)
    np.testing.assert_array_equal(np.asarray(jitted), want)


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint32, np.bool_])
@pytest.mark.parametrize(
    "kw",
    [{}, {"mode": "fill"}, {"mode": "clip"}, {"fill_value": 7}, {"wrap_negative_indices": False}],
)
def test_out_of_range_modes_match_jax(dtype, kw):
    """JAX's default mode "fill" (NaN / extreme integer / True where out of range), "clip",
    fill_value, and negatives not wrapped: eager and jit against jax.numpy."""
    x = (np.arange(12).reshape(3, 4) % 5).astype(dtype)
    idx = np.array([[5, 0], [-1, 3], [-7, -4]])
    want = np.asarray(jjnp.take_along_axis(x, idx, axis=1, **kw))
    got = jnp.take_along_axis(x, idx, axis=1, **kw)
    np.testing.assert_array_equal(np.asarray(got), want)
    traced = fflow.jit(lambda x, i: jnp.take_along_axis(x, i, axis=1, **kw))(x, idx)
    np.testing.assert_array_equal(np.asarray(traced), want)


@pytest.mark.parametrize("kw", [{}, {"mode": "clip"}])
def test_out_of_range_gradients_match_jax(kw):
    idx = np.array([[5, 0], [-1, 3], [-7, -4]])
    x = rng.normal(size=(3, 4)).astype(np.float32)
    got = fflow.grad(lambda x: jnp.sum(jnp.take_along_axis(x, idx, axis=1, **kw) ** 2))(x)
    want = jax.grad(lambda x: jjnp.sum(jjnp.take_along_axis(x, idx, axis=1, **kw) ** 2))(x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)


@pytest.mark.usefixtures("x64_case")
def test_int64_indices_in_64_bit_mode():
    idx = _indices(1, 7, np.int64)
    f = fflow.jit(lambda x, i: jnp.take_along_axis(x, i, axis=1))
    assert "i64" in str(fflow.make_jaxpr(f)(X, idx))
    np.testing.assert_array_equal(np.asarray(f(X, idx)), np.take_along_axis(X, idx, axis=1))


def test_one_primitive_each_way():
    """The forward is one take_along_axis (no iota index arrays, no full gather), the
    backward one scatter_add_along_axis."""
    idx = _indices(2, 1, np.int32)
    text = str(fflow.make_jaxpr(fflow.grad(lambda x: jnp.sum(jnp.take_along_axis(x, idx, 2))))(X))
    assert "take_along_axis[axis=2]" in text and "scatter_add_along_axis[axis=2]" in text
    assert "gather" not in text and "iota" not in text


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("broadcast", [False, True])
def test_gradients_match_jax(axis, broadcast):
    idx = _indices(axis, 6, np.int32, broadcast)  # 6 > n: repeated indices accumulate
    w = rng.normal(
        size=np.broadcast_shapes(idx.shape, X.shape[: axis % 3] + (6,) + X.shape[axis % 3 + 1 :])
    )

    def loss(np_):
        return lambda x: np_.sum(np_.sin(np_.take_along_axis(x, idx, axis=axis)) * w)

    got = fflow.grad(loss(jnp))(X)
    want = jax.grad(loss(jjnp))(X)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_transpose_pair_against_numpy():
    """scatter_add_along_axis adds repeated indices (np.add.at) and is the transpose of
    take_along_axis: <take(x), u> == <x, scatter_add(0, u)>."""
    idx = _indices(1, 7, np.int32, lo=0)
    u = rng.normal(size=idx.shape).astype(np.float32)
    want = X.copy()
    i0, _, i2 = np.indices(idx.shape)
    np.add.at(want, (i0, idx, i2), u)
    got = lax.scatter_add_along_axis(X, idx, u, 1)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    _, vjp = fflow.vjp(lambda x: lax.take_along_axis(x, idx, 1), X)
    (ct,) = vjp(u)
    np.testing.assert_allclose(np.asarray(ct), want - X, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("in_axes", [(0, 0), (0, None), (None, 0), (2, 1)])
def test_vmap_matches_a_loop(in_axes):
    xs = rng.normal(size=(4, 3, 5)).astype(np.float32)
    idx = rng.integers(0, 5, size=(4, 3, 2)).astype(np.int32)
    xs_in = np.moveaxis(xs, 0, in_axes[0]) if in_axes[0] is not None else xs[0]
    idx_in = np.moveaxis(idx, 0, in_axes[1]) if in_axes[1] is not None else idx[0]
    got = fflow.vmap(lambda x, i: jnp.take_along_axis(x, i, axis=1), in_axes)(xs_in, idx_in)
    want = [
        np.take_along_axis(
            xs[k] if in_axes[0] is not None else xs[0],
            idx[k] if in_axes[1] is not None else idx[0],
            axis=1,
        )
        for k in range(4)
    ]
    np.testing.assert_array_equal(np.asarray(got), np.stack(want))


def test_per_example_cross_entropy_gradients_match_jax():
    logits, targets = data()

    def ce(np_, nn_):
        def f(l, t):
            logp = nn_.log_softmax(l)
            return -np_.mean(np_.take_along_axis(logp, t[..., None], axis=-1))

        return f

    got = fflow.vmap(fflow.grad(ce(jnp, fflow.nn)))(logits, targets)
    want = jax.vmap(jax.grad(ce(jjnp, jax.nn)))(logits, targets)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-7)


def test_full_gather_with_iota_indices_still_jits():
    """The formulation take_along_axis had before (a gather over every axis, iotas as
    the batch indices) under jit(grad): the CPU row fusion (used from this size on)
    crashed on the iota, an equation with no inputs."""
    logits = rng.normal(size=(32, 64, 40)).astype(np.float32)
    targets = rng.integers(0, 40, size=(32, 64)).astype(np.int32)

    def ce(l, t):
        logp = fflow.nn.log_softmax(l)
        shape = t.shape + (1, 1)
        parts = [lax.broadcasted_iota(np.int32, shape, d) for d in range(2)]
        idx = lax.concatenate(parts + [t[..., None, None]], 3)
        return -jnp.mean(lax.gather(logp, idx, (0, 1, 2)))

    got = fflow.jit(fflow.value_and_grad(ce))(logits, targets)
    want = jax.value_and_grad(
        lambda l: -jjnp.mean(jjnp.take_along_axis(jax.nn.log_softmax(l), targets[..., None], -1))
    )(logits)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-7)


# x[jnp.arange(n), labels]: NumPy indexing with iotas on the leading dims
def _iota_cases():
    labels = rng.integers(-5, 5, size=(3,))  # along X's axis 1 (negative ones wrap)
    grid = rng.integers(-4, 4, size=(3, 5))  # along X's axis 2
    return [  # (index of X (3, 5, 4), whether it becomes one take_along_axis)
        ((np.arange(3), labels), True),
        ((np.arange(3)[:, None], np.arange(5), grid), True),
        ((np.arange(3)[:, None], np.arange(5)[None, :], grid[:1]), True),
        ((np.arange(3), np.arange(3)), True),  # a diagonal
        ((np.arange(3)[::-1], labels), False),  # not an iota
        ((slice(None), np.arange(5), grid[0]), False),  # not on the leading dims
        ((np.arange(3)[:, None], grid % 5, np.arange(4)[:1]), False),  # iota after the take
        ((labels % 3, np.arange(3)), False),
    ]


@pytest.mark.parametrize("case", range(len(_iota_cases())))
def test_indexing_with_leading_iotas_is_take_along_axis(case):
    idx, is_take = _iota_cases()[case]
    want = X[idx]
    as_fflow = tuple(jnp.asarray(i) if isinstance(i, np.ndarray) else i for i in idx)
    f = fflow.jit(lambda x: x[as_fflow])
    np.testing.assert_array_equal(np.asarray(f(X)), want)
    np.testing.assert_array_equal(np.asarray(jnp.asarray(X)[idx]), want)
    text = str(fflow.make_jaxpr(f)(X))
    assert ("take_along_axis" in text) == is_take and ("gather" in text) != is_take
    ct = rng.normal(size=want.shape)
    want_grad = np.zeros_like(X, np.float64)
    np.add.at(want_grad, idx, ct)
    got = fflow.grad(lambda x: jnp.sum(x[as_fflow] * ct))(X)
    np.testing.assert_allclose(np.asarray(got), want_grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("form", ["flat", "3d"])
def test_arange_indexed_cross_entropy_keeps_the_batch_split(form):
    """logp[jnp.arange(n), labels] on (tokens, vocab) logits, and NumPy iotas on
    (batch, time, vocab). (jnp.arange(b)[:, None] under a trace is a staged reshape,
    not a constant: that form stays a gather.)"""
    logits, targets = data()
    b, t, v = logits.shape

    def ce(np_, nn_):
        def f(logits, targets):
            if form == "flat":
                logp = nn_.log_softmax(logits.reshape(b * t, v))
                picked = logp[np_.arange(b * t), targets.reshape(-1)]
            else:
                logp = nn_.log_softmax(logits)
                picked = logp[np.arange(b)[:, None], np.arange(t), targets]
            return -np_.mean(picked)

        return f

    line = fflow.placement("cpu", [0, 1, 2, 3])
    f = fflow.shard(
        fflow.value_and_grad(ce(jnp, fflow.nn)), line, in_sbp=(S(0), S(0)), out_sbp=(B, S(0))
    )
    sp = f.plan(logits, targets)
    moves = [(v.aval.shape, bp.collectives()) for _, v, *_, bp in sp.boxings() if bp.bytes]
    assert moves == [((), ["all_reduce"])]  # the loss only
    value, grad = f(logits, targets)
    want = jax.value_and_grad(ce(jjnp, jax.nn))(logits, targets)
    np.testing.assert_allclose(float(value), float(want[0]), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(want[1]), atol=1e-7)


# -- under shard --------------------------------------------------------------------------


def _check_sharded(out, mesh):
    """Only (b, t) statistics and the scalar loss move; the logits/targets never do, and
    the indexing runs split along the batch (and, vocabulary-parallel, the vocabulary)."""
    b, t, v = data()[0].shape
    assert all(shape in ([], [b, t]) for shape, *_ in out["moves"]), out["moves"]
    if mesh == "1d":
        assert out["moves"] == [[[], "(P,)", "(B,)", ["all_reduce"]]]
        assert out["sigs"] == [
            ["take_along_axis", "((S(0),), (S(0),))", "((S(0),),)"],
            ["scatter_add_along_axis", "((S(0),), (S(0),), (S(0),))", "((S(0),),)"],
        ]
    else:  # the vocabulary split: each device looks up its shard, the parts sum
        assert out["sigs"][0] == ["take_along_axis", "((S(0), S(2)), (S(0), B))", "((S(0), P),)"]
        assert len(out["moves"]) == 3  # max and sum of the softmax rows, the loss
    assert out["grad_sbp"] == ("(S(0),)" if mesh == "1d" else "(S(0), S(2))")
    np.testing.assert_allclose(out["got"][0], out["ref"][0], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(out["got"][1]), np.asarray(out["ref"][1]), atol=1e-7)


@pytest.mark.parametrize("mesh", ["1d", "2x2"])
def test_sharded_cross_entropy_moves_no_logits(mesh):
    out = run(*layouts(4)[mesh])
    _check_sharded(out, mesh)
    logits, targets = data()
    want = jax.value_and_grad(
        lambda l: -jjnp.mean(jjnp.take_along_axis(jax.nn.log_softmax(l), targets[..., None], -1))
    )(logits)
    np.testing.assert_allclose(out["got"][0], float(want[0]), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(out["got"][1]), np.asarray(want[1]), atol=1e-7)


@pytest.mark.skipif(not mpi_available(), reason="no mpi4py/mpiexec")
@pytest.mark.parametrize("n", [2, 4])
def test_sharded_cross_entropy_on_mpi_ranks(n):
    out = launch_result("take_along_axis_shard_script.py", n)
    assert sorted(out) == (["1d", "2x2"] if n == 4 else ["1d"])
    for mesh, res in out.items():
        assert res["devices"] == n
        _check_sharded(res, mesh)


def _full_gather_pick(logp, y):
    """take_along_axis(logp, y[..., None], -1) as it was built before its own primitive:
    one gather over every axis, with iotas as the indices of the batch dims."""
    shape = y.shape + (1,)
    parts = [lax.broadcasted_iota(y.dtype, shape, d) for d in range(y.ndim)]
    idx = lax.concatenate([p[..., None] for p in parts] + [y[..., None, None]], y.ndim + 1)
    return lax.gather(logp, idx, tuple(range(logp.ndim)))


def test_gpt_chars_kept_parameters_keep_the_batch_split():
    """gpt_chars' Adam step (1 layer, default width, 2x2) with its parameters and
    optimizer state kept in place (keep_in_sbp): the loss's take_along_axis keeps the
    batch split, so neither the kept nor the free plan moves logits or targets, and the
    kept plan moves under half the bytes of the same step with the pick written as the
    full gather take_along_axis used to be (69.0 vs 15-16 MiB when this was written)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples"))
    try:
        import gpt_chars as gc
    finally:
        sys.path.pop(0)
    mesh = fflow.placement("cpu", [[0, 1], [2, 3]])
    vocab, d, heads, context, batch = 40, 128, 4, 64, 32
    model = gc.GPT(vocab, d, heads, 1, context, key=fflow.random.PRNGKey(0), tp=True)
    tx = gc.make_optimizer(6, 3e-3, 1)

    def gathered_loss(model, ids):  # gc.loss_fn with the old full-gather pick
        x, y = ids[:, :-1], ids[:, 1:]
        logp = fflow.nn.log_softmax(model(x).astype(jnp.float32))
        return -jnp.mean(_full_gather_pick(logp, y))

    msbp = fflow.nn.sbp_of(model, default=(B, B))
    ssbp = fflow.optim.state_sbp(tx, model, msbp, mesh)
    args = (gc.place(model, msbp, mesh), gc.place(tx.init(model), ssbp, mesh))
    ids = fflow.to_global(np.zeros((batch, context + 1), np.int32), mesh, (S(0), B))
    plans = {}
    for name, loss_fn, keep in (
        ("free", gc.loss_fn, False),
        ("kept", gc.loss_fn, (True, True, False)),
        ("kept, full gather", gathered_loss, (True, True, False)),
    ):
        loss = fflow.amp(loss_fn, "bf16")

        def step(model, opt_state, ids, loss=loss):
            value, grads = fflow.value_and_grad(loss)(model, ids)
            updates, opt_state = tx.update(grads, opt_state, model)
            return fflow.optim.apply_updates(model, updates), opt_state, value

        f = fflow.shard(
            step, mesh, in_sbp=(msbp, ssbp, (S(0), B)), out_sbp=(msbp, ssbp, (B, B)),
            keep_in_sbp=keep,
        )  # fmt: skip
        plans[name] = sp = f.plan(*args, ids)
        if loss_fn is gathered_loss:
            continue
        per_token = [v.aval.shape for _, v, *_, bp in sp.boxings() if bp.bytes]
        assert (batch, context, vocab) not in per_token and (batch, context) not in per_token
        assert (batch, context, 1) not in per_token
        for e, sig in zip(sp.exec_program.eqns, sp.plan.eqn_sigs):
            if "along_axis" in e.primitive.name:  # split along the batch on the data axis
                assert all(s[0] == S(0) for s in sig.ins + sig.outs), sig
    bytes_ = {k: sp.bytes for k, sp in plans.items()}
    assert bytes_["kept"] <= 0.5 * bytes_["kept, full gather"], bytes_


# -- the CUDA kernels (NVRTC + host shim) ---------------------------------------------------


def test_cuda_kernels_through_the_shim():
    from cuda_harness import run_cases
    from fflow.lowering import cuda_backend

    logits, targets = data()
    vg = fflow.value_and_grad(cross_entropy)
    program = fflow.make_jaxpr(vg)(logits, targets)
    plan = cuda_backend.Plan(cuda_backend._optimize(program))
    assert not [s for s in plan.steps if type(s).__name__ == "HostStep"]  # all on the device
    idx = _indices(1, 7, np.int32)  # repeats and negatives (clamped to 0 here)
    u = rng.normal(size=idx.shape).astype(np.float32)
    run_cases(
        [
            ("cross-entropy value_and_grad", vg, [logits, targets]),
            ("take, axis 1", lambda x, i: lax.take_along_axis(x, i, 1), [X, idx]),
            (
                "scatter-add, axis 1",
                lambda x, i, u: lax.scatter_add_along_axis(x, i, u, 1),
                [X, idx, u],
            ),
        ]  # fmt: skip
    )
