"""Control flow under `shard`: a scan over stacked layer weights keeps tensor parallelism
(the same plan cost per layer as the unrolled model), and gradient accumulation over
micro-batches keeps data parallelism with one all-reduce per gradient at the end.
Scans longer than shard unrolls (64 steps) run split when their body needs no
communication (transforms/shard_plan_control.py): on simulated devices, 2-D meshes
and under fflow.launch."""

import numpy as np
import pytest
from mpi_util import launch_result, mpi_available
from shard_plan_scan_script import D_IN, D_OUT, run, run_while

import fflow
import fflow.numpy as jnp
from fflow.sharding import CPU, H200, B, S

PL4 = fflow.placement("cpu", [0, 1, 2, 3])
L, BATCH, D = 3, 8, 16
RNG = np.random.default_rng(0)
W1 = (RNG.normal(size=(L, D, 4 * D)) * 0.2).astype(np.float32)
W2 = (RNG.normal(size=(L, 4 * D, D)) * 0.2).astype(np.float32)
X = RNG.normal(size=(BATCH, D)).astype(np.float32)


LOCAL = {"shard_slice", "shard_pad", "keep_one"}  # conversions that move no data


def _communicating(sp):
    return [c for c in sp.collectives() if c not in LOCAL]


def block(x, w1, w2):
    return x + jnp.tanh(x @ w1) @ w2


def scanned(w1, w2, x):
    y, _ = fflow.lax.scan(lambda x, w: (block(x, *w), None), x, (w1, w2))
    return jnp.sum(y**2)


def unrolled(w1, w2, x):
    for i in range(w1.shape[0]):
        x = block(x, w1[i], w2[i])
    return jnp.sum(x**2)


def _megatron(fn):
    step = fflow.value_and_grad(fn, argnums=(0, 1))
    # stacked weights: layer dim first, then Megatron's column / row split
    return fflow.shard(step, PL4, in_sbp=(S(2), S(1), B), out_sbp=(B, (S(2), S(1))), profile=H200)


def test_scan_over_stacked_layers_keeps_megatron_plan_per_layer():
    sp_scan = _megatron(scanned).plan(W1, W2, X)
    sp_unrolled = _megatron(unrolled).plan(W1, W2, X)
    per_layer, per_layer_unrolled = sp_scan.plan.time / L, sp_unrolled.plan.time / L
    assert abs(per_layer - per_layer_unrolled) <= 1e-3 * per_layer_unrolled
    # forward: one all-reduce per layer; backward: one per layer but the first
    assert _communicating(sp_scan) == ["all_reduce"] * (2 * L - 1)
    value, (g1, g2) = _megatron(scanned)(W1, W2, X)
    ref, (r1, r2) = fflow.value_and_grad(unrolled, argnums=(0, 1))(W1, W2, X)
    np.testing.assert_allclose(float(value), float(ref), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(g1), np.asarray(r1), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(g2), np.asarray(r2), rtol=1e-4, atol=1e-5)


def loss(params, x):
    w1, w2 = params
    return jnp.mean(jnp.tanh(x @ w1) @ w2)


def accumulated(params, micro):
    """Gradient accumulation: the mean gradient over micro-batches, by a scan."""

    def body(acc, xb):
        g = fflow.grad(loss)(params, xb)
        return (acc[0] + g[0], acc[1] + g[1]), None

    zeros = (jnp.zeros_like(params[0]), jnp.zeros_like(params[1]))
    (a, b), _ = fflow.lax.scan(body, zeros, micro)
    n = micro.shape[0]
    return a / n, b / n


def test_gradient_accumulation_keeps_data_parallel_one_all_reduce_at_the_end():
    params = (W1[0], W2[0])
    micro = RNG.normal(size=(4, BATCH, D)).astype(np.float32)  # 4 micro-batches
    f = fflow.shard(accumulated, PL4, in_sbp=((B, B), S(1)), out_sbp=B, profile=H200)
    sp = f.plan(params, micro)
    assert _communicating(sp) == ["all_reduce", "all_reduce"]  # one per gradient, once
    got = f(params, micro)
    ref = accumulated(params, micro)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-6)


def _check_accumulation(out):
    p = out["devices"]
    assert out["collectives"] == ["all_reduce"]  # the summed gradient, once, after the loop
    assert out["bytes"] == 2 * (p - 1) * D_IN * D_OUT * 4
    np.testing.assert_allclose(np.asarray(out["got"]), np.asarray(out["ref"]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mesh", [[0, 1], [0, 1, 2, 3], [[0, 1], [2, 3]]])
def test_long_gradient_accumulation_keeps_gradients_partial_through_the_loop(mesh):
    _check_accumulation(run(fflow.placement("cpu", mesh)))


@pytest.mark.skipif(not mpi_available(), reason="no mpi4py/mpiexec")
@pytest.mark.parametrize("n", [2, 4])
def test_long_gradient_accumulation_on_mpi_ranks(n):
    out = launch_result("shard_plan_scan_script.py", n)
    assert out["devices"] == n
    _check_accumulation(out)
    _check_while(out["while"])
    _check_while(out["cond"])  # the same checks: nothing moves, values as NumPy's


def _check_while(out):
    assert out["collectives"] == []
    np.testing.assert_allclose(np.asarray(out["got"]), np.asarray(out["ref"]), rtol=1e-5)


def test_while_loop_matches_numpy():
    _check_while(run_while(fflow.placement("cpu", [0, 1, 2, 3])))


def _recurrence(a, xs):
    def body(h, x):
        h = jnp.tanh(h * a + x)
        return h, jnp.sum(h * h, axis=1)

    h, ys = fflow.lax.scan(body, jnp.zeros((xs.shape[1], xs.shape[2]), np.float32), xs)
    return jnp.sum(h) + jnp.mean(ys)


def _scan_sigs(sp):
    return [s for e, s in zip(sp.exec_program.eqns, sp.plan.eqn_sigs) if e.primitive.name == "scan"]


@pytest.mark.parametrize("mesh", [[0, 1], [[0, 1], [2, 3]]])
def test_long_recurrence_and_its_gradient_run_split(mesh):
    """70 steps of h = tanh(h * a + x_t), rows split: the forward scan carries h split,
    the backward scan carries h's cotangent split and a's partial; both run split."""
    rng = np.random.default_rng(3)
    a = rng.normal(size=(16,)).astype(np.float32)
    xs = rng.normal(size=(70, 64, 16)).astype(np.float32)  # at 8 x 6 running whole is cheaper
    pl = fflow.placement("cpu", mesh)
    split = (S(1),) * pl.ndim
    step = fflow.value_and_grad(_recurrence, argnums=(0, 1))
    bcast = (B,) * pl.ndim  # one SBP per mesh axis, for every output
    # the simulated-link profile: under CPU_MPI's 0.2 ms per collective the 70 rows run
    # whole instead
    out = bcast if pl.ndim > 1 else B
    f = fflow.shard(step, pl, in_sbp=(bcast, split), out_sbp=out, profile=CPU)
    sp = f.plan(a, xs)
    sigs = _scan_sigs(sp)
    assert len(sigs) == 2
    for sig in sigs:  # every scan holds its loop-carried rows split
        assert any(s.is_split() for nd in sig.ins for s in nd)
    # what moves: the gradient of xs gathered for out_sbp=B, a's gradient and the loss
    assert _communicating(sp) == ["all_reduce", "all_reduce", "all_gather"]
    (v, (ga, gx)) = f(a, xs)
    rv, (rga, rgx) = step(a, xs)
    np.testing.assert_allclose(float(v), float(rv), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(ga), np.asarray(rga), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(gx), np.asarray(rgx), rtol=1e-4, atol=1e-6)


def test_long_scan_whose_body_communicates_runs_whole():
    """Normalising the split carry by its total needs an all-reduce every step: no
    signature without communication exists, so the scan runs whole on every device."""

    def f(xs):
        def body(h, x):
            h = h + x
            return h / jnp.sum(h * h), None

        h, _ = fflow.lax.scan(body, jnp.ones(xs.shape[1:], np.float32), xs)
        return h

    xs = np.random.default_rng(4).normal(size=(70, 8)).astype(np.float32)
    g = fflow.shard(f, fflow.placement("cpu", [0, 1]), in_sbp=S(1), out_sbp=B)
    sp = g.plan(xs)
    (sig,) = _scan_sigs(sp)
    assert all(s == B for nd in sig.ins + sig.outs for s in nd)
    np.testing.assert_allclose(np.asarray(g(xs)), np.asarray(f(xs)), rtol=1e-5, atol=1e-6)


def _iterate(x, a):
    def body(c):
        i, x = c
        return i + 1, jnp.tanh(x * a + 0.1)

    return fflow.lax.while_loop(lambda c: c[0] < 50, body, (0, x))[1]


@pytest.mark.parametrize("mesh", [[0, 1], [[0, 1], [2, 3]]])
def test_while_loop_on_split_rows_runs_split(mesh):
    """A while_loop whose condition reads only a broadcast counter: the rows stay split
    through the loop, nothing moves."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(16, 3)).astype(np.float32)
    a = np.float32(0.9)
    pl = fflow.placement("cpu", mesh)
    rows = (S(0),) * pl.ndim
    f = fflow.shard(_iterate, pl, in_sbp=(rows, (B,) * pl.ndim), out_sbp=rows)
    sp = f.plan(x, a)
    assert sp.collectives() == [] and sp.bytes == 0
    (sig,) = [
        s for e, s in zip(sp.exec_program.eqns, sp.plan.eqn_sigs) if e.primitive.name == "while"
    ]
    assert sig.outs[-1] == rows
    np.testing.assert_allclose(np.asarray(f(x, a)), np.asarray(_iterate(x, a)), rtol=1e-6)


def test_while_loop_whose_condition_reads_split_data_runs_whole():
    def f(x):
        return fflow.lax.while_loop(lambda x: jnp.sum(x) < 100.0, lambda x: x * 1.5 + 0.1, x)

    x = np.abs(np.random.default_rng(6).normal(size=(8,))).astype(np.float32)
    g = fflow.shard(f, fflow.placement("cpu", [0, 1]), in_sbp=S(0), out_sbp=B)
    sp = g.plan(x)
    (sig,) = [
        s for e, s in zip(sp.exec_program.eqns, sp.plan.eqn_sigs) if e.primitive.name == "while"
    ]
    assert all(s == B for nd in sig.ins + sig.outs for s in nd)
    np.testing.assert_allclose(np.asarray(g(x)), np.asarray(f(x)), rtol=1e-6)


def _branchy(k, x, w):
    return fflow.lax.cond(k > 0, lambda x: jnp.tanh(x @ w), lambda x: x @ w * 2.0, x)


@pytest.mark.parametrize("mesh", [[0, 1], [[0, 1], [2, 3]]])
def test_cond_on_split_rows_runs_split(mesh):
    """Both branches work row by row: the cond runs on each device's rows, nothing
    moves (running it whole would gather x and slice the result)."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(64, 8)).astype(np.float32)
    w = rng.normal(size=(8, 5)).astype(np.float32)
    pl = fflow.placement("cpu", mesh)
    rows, bcast = (S(0),) * pl.ndim, (B,) * pl.ndim
    f = fflow.shard(_branchy, pl, in_sbp=(bcast, rows, bcast), out_sbp=rows)
    for k in (1, -1):
        sp = f.plan(np.int32(k), x, w)
        assert sp.collectives() == [] and sp.bytes == 0
        want = np.tanh(x @ w) if k > 0 else x @ w * 2.0
        np.testing.assert_allclose(np.asarray(f(np.int32(k), x, w)), want, rtol=1e-5, atol=1e-6)


def test_a_tiny_cond_under_grad_keeps_the_cheaper_whole_plan():
    """Splitting the backward cond is possible but costs two more collectives than
    running a 16-row cond whole: the planner keeps the whole one (a second search
    with every loop and cond whole guards against getting stuck)."""
    rng = np.random.default_rng(8)
    x = rng.normal(size=(16, 3)).astype(np.float32)
    w = rng.normal(size=(3, 5)).astype(np.float32)
    step = fflow.value_and_grad(lambda k, x, w: jnp.sum(_branchy(k, x, w) ** 2), argnums=(1, 2))
    f = fflow.shard(step, fflow.placement("cpu", [0, 1]), in_sbp=(B, S(0), B), out_sbp=B)
    sp = f.plan(np.int32(1), x, w)
    assert _communicating(sp) == ["all_gather"]  # x, once
    v, (gx, gw) = f(np.int32(1), x, w)
    rv, (rgx, rgw) = step(np.int32(1), x, w)
    np.testing.assert_allclose(float(v), float(rv), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(gw), np.asarray(rgw), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(gx), np.asarray(rgx), rtol=1e-5, atol=1e-6)
