"""`shard(..., keep_in_sbp=)`: annotated inputs as a binding layout (JAX's in_shardings,
OneFlow's global tensor SBP). Kept inputs are read as stored (never converted), their
gradients come back in the same SBP, and splits only propagate from them; so the
Megatron weight annotations alone give Megatron's plan: one all-reduce of the (b, t, d)
activation per attention block and per MLP block forward, one per block backward
(the first block's may be skipped: the batch needs no gradient), no matmul replicated.
Values against the same step unsharded; on simulated devices and fflow.launch -n 2 and -n 4."""

import numpy as np
import pytest
from mpi_util import launch_result, mpi_available
from shard_plan_keep_script import BIG, HEADS, check_remat, placements, run

import fflow
import fflow.numpy as jnp
from fflow.sharding import B, S


def _check(out, mesh):
    assert out["kept"] > 0 and out["kept_converted"] == 0  # kept inputs read as stored
    acts = out["activations"]
    model = "(S(0), P)" if mesh == "2x2" else "(P,)"
    done = "(S(0), B)" if mesh == "2x2" else "(B,)"
    # only all-reduces of partial block outputs over the model axis, nothing else
    assert all(c == ["all_reduce"] and h == model and w == done for h, w, c, _ in acts), acts
    fwd = sum(1 for *_, where in acts if where == "forward")
    bwd = len(acts) - fwd
    n = out["layers"]
    assert fwd == 2 * n, acts  # one per attention block and per MLP block
    assert 2 * n - 1 <= bwd <= 2 * n, acts
    # every matmul split over the model axis: 1/2 of the work on 2x2, 1/n on n devices
    assert out["max_share"] <= (0.5 if mesh == "2x2" else 1 / out["devices"])
    for g, r in zip(out["got"], out["ref"]):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("mesh", ["1d", "2x2"])
def test_kept_megatron_weights_give_one_all_reduce_per_block(mesh):
    _check(run(placements()[mesh]), mesh)  # 2 layers, values == the unsharded step


@pytest.mark.parametrize("mesh", ["1d", "2x2"])
def test_kept_megatron_weights_at_sizes_where_the_free_plan_differs(mesh):
    # without keep_in_sbp: 1-D reduce-scatters / all-gathers the block outputs
    # (sequence-parallel style), 2x2 all-gathers weights (data parallelism)
    _check(run(placements()[mesh], BIG[mesh], layers=2, values=False), mesh)


@pytest.mark.skipif(not mpi_available(), reason="no mpi4py/mpiexec")
@pytest.mark.parametrize("n", [2, 4])
def test_kept_megatron_weights_on_mpi_ranks(n):
    out = launch_result("shard_plan_keep_script.py", n)
    meshes = ("1d", "2x2") if n == 4 else ("1d",)  # (a 2x2 mesh needs 4 ranks)
    assert sorted(out) == sorted([*meshes, "remat"])
    check_remat(out["remat"]["1d"])  # checkpointed layers, kept weights (..._keep_remat.py)
    for mesh in meshes:
        assert out[mesh]["devices"] == n
        _check(out[mesh], mesh)


def test_free_plan_converts_the_weights_kept_plan_does_not():
    """The option matters: at b,t,d = 8,512,512 the free plan all-gathers the split
    weights (12 d^2 per layer moves less than 4 activation all-reduces of 4096
    tokens); kept, they stay split (planning only)."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
    import planner_models as pm

    pl = placements()["1d"]
    plans = {}
    for keep in (False, True):
        f, args = pm.megatron_sharded(
            pl, 1, 8, 512, 512, HEADS, keep=keep, profile=fflow.sharding.H200
        )
        sp = f.plan(*args)
        ins = set(sp.exec_program.invars)
        plans[keep] = [bp.collectives() for _, v, _, _, bp in sp.boxings() if v in ins]
    assert ["all_gather"] in plans[False]
    assert plans[True] == []


def test_gradient_comes_back_in_the_kept_sbp():
    pl = fflow.placement("cpu", [0, 1, 2, 3])
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 16)).astype(np.float32)
    w1 = rng.normal(size=(16, 32)).astype(np.float32)
    w2 = rng.normal(size=(32, 16)).astype(np.float32)
    bias = rng.normal(size=(16,)).astype(np.float32)

    def loss(x, w1, w2, bias):
        return jnp.sum(jnp.tanh(jnp.tanh(x @ w1) @ w2 + bias) ** 2)

    sbp = (B, S(1), S(0), B)
    f = fflow.shard(loss, pl, in_sbp=sbp, keep_in_sbp=(False, True, True, True))
    grads = fflow.grad(f, argnums=(1, 2, 3))(x, w1, w2, bias)
    ref = fflow.grad(loss, argnums=(1, 2, 3))(x, w1, w2, bias)
    # S(1) and S(0) as annotated; the broadcast bias's gradient all-reduced back to B
    assert [g.sbp for g in grads] == [(S(1),), (S(0),), (B,)]
    for g, r in zip(grads, ref):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-4)
    # the free default returns the broadcast input's gradient as it is made (partial)
    free = fflow.grad(fflow.shard(loss, pl, in_sbp=sbp), argnums=3)(x, w1, w2, bias)
    np.testing.assert_allclose(np.asarray(free), np.asarray(ref[2]), rtol=1e-4, atol=1e-4)


def test_a_kept_input_the_program_cannot_read_names_the_line():
    pl = fflow.placement("cpu", [0, 1])

    def f(x, w):
        return fflow.with_sbp(w, B).sum() + x.sum()  # the line the error names

    g = fflow.shard(f, pl, in_sbp=(B, S(0)), keep_in_sbp=True)
    with pytest.raises(ValueError) as e:
        g.plan(np.ones(4, np.float32), np.ones((4, 2), np.float32))
    msg = str(e.value)
    assert "`sbp_constraint` cannot read w as (S(0))" in msg and "it as: w (B)." in msg
    assert "the line the error names" in msg and "test_shard_plan_keep.py" in msg
    assert "Fix: annotate w in in_sbp" in msg
    # kept per argument: the same program plans when w is free to be converted
    g2 = fflow.shard(f, pl, in_sbp=(B, S(0)), keep_in_sbp=(True, False))
    assert g2.plan(np.ones(4, np.float32), np.ones((4, 2), np.float32)).collectives()


def test_two_kept_inputs_no_signature_reads_together():
    pl = fflow.placement("cpu", [0, 1])
    x, w = np.ones((4, 3), np.float32), np.ones((3, 2), np.float32)
    g = fflow.shard(lambda x, w: x @ w, pl, (B, S(0)), keep_in_sbp=True)
    with pytest.raises(ValueError, match=r"cannot read x as \(B\) and w as \(S\(0\)\)") as e:
        g.plan(x, w)
    assert "x (S(1)), w (S(0))" in str(e.value)  # the row-parallel reading it offers
    # x free: sliced to S(1) to meet the kept row-split w, the result all-reduced
    g = fflow.shard(lambda x, w: x @ w, pl, (B, S(0)), keep_in_sbp=(False, True))
    assert g.plan(x, w).collectives() == ["shard_slice", "all_reduce"]
    np.testing.assert_allclose(np.asarray(g(x, w)), x @ w)


def test_keep_in_sbp_structure_errors_say_what_to_give():
    pl = fflow.placement("cpu", [0, 1])
    g = fflow.shard(lambda x, w: x @ w, pl, in_sbp=(B, S(1)), keep_in_sbp=(True,))
    with pytest.raises(ValueError, match="keep_in_sbp"):
        g.plan(np.ones((2, 4), np.float32), np.ones((4, 2), np.float32))


def test_a_global_arrays_own_sbp_is_kept_and_jit_keeps_it():
    """keep_in_sbp=True with no in_sbp: a global array's own SBP is its annotation (kept),
    a local NumPy argument is unannotated (free); the same through jit."""
    pl = fflow.placement("cpu", [0, 1])
    rng = np.random.default_rng(1)
    x = rng.normal(size=(8, 6)).astype(np.float32)
    w = rng.normal(size=(6, 4)).astype(np.float32)
    wg = fflow.to_global(w, pl, S(0))
    f = fflow.shard(lambda x, w: jnp.tanh(x @ w), pl, keep_in_sbp=True)
    sp = f.plan(x, wg)
    assert sp.plan.problem.kept == {1: "w"}
    assert all(v is not sp.exec_program.invars[1] for _, v, _, _, _ in sp.boxings())
    for got in (f(x, wg), fflow.jit(f)(x, wg)):
        np.testing.assert_allclose(np.asarray(got), np.tanh(x @ w), rtol=1e-5, atol=1e-6)
