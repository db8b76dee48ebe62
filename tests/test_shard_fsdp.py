"""FSDP / ZeRO-3 from the batch annotation and a memory budget (transforms/shard_fsdp.py):
parameters stored split and all-gathered per use (forward, then backward), the
gathered copy freed after its last reader, gradients reduce-scattered as computed.

Checks: the plan fits the budget by the liveness count of the per-device program
(written here, as in test_planner_memory.py) and by the bytes of live arrays
measured on simulated devices; the budget is below every plan without per-use
gathering; values against a float64 NumPy Adam step on 2 and 4 simulated devices and
under `python -m fflow.launch -n 2` / `-n 4`; a loose budget keeps ZeRO-2 / DP."""

import functools
import os
import sys

import numpy as np
import pytest
from fflow.transforms import shard_exec
from fflow.transforms.shard_fsdp import gather_per_use, use_groups
from fflow.transforms.staging import trace_to_program
from mpi_util import launch_result, mpi_available
from shard_fsdp_script import (
    DIMS,
    init,
    mesh_placement,
    numpy_step,
    peaks_without_fsdp,
    run,
    step,
)
from test_planner_memory import local_peak

import fflow
import fflow.numpy as jnp
from fflow.core import ShapedArray
from fflow.sharding import H200, B, S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import planner_models as pm  # noqa: E402


def _check(out):
    assert out["per_use"], "the budget needs FSDP, the plan did not gather per use"
    assert 0 < out["measured"] <= out["peak"] <= out["budget"]
    np.testing.assert_allclose(out["loss"], out["ref_loss"], rtol=1e-5)
    for got, ref in zip(out["got"], out["ref"]):
        np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-4, atol=5e-5)
    # every hidden weight (read by the forward and by the backward pass) is all-gathered
    # twice: once per use
    hidden = [c for c in out["conversions"] if c[0] == [DIMS[1], DIMS[2]]]
    assert sum(c[3] == ["all_gather"] for c in hidden) == 2 * (len(DIMS) - 3), hidden


def test_use_groups_split_forward_from_backward():
    a = ShapedArray((4, 4), np.float32)

    def f(w, x):  # w: a use, a matmul of other values, a second use, then the tail
        h = jnp.sin(x @ w)
        return (h @ h) @ w + jnp.cos(w)

    prog = trace_to_program(lambda w, x: [f(w, x)], [a, a])
    groups = use_groups(prog, prog.invars[0])
    # the cos runs after the last matmul (the optimizer tail): it reads w as stored
    assert [[prog.eqns[k].primitive.name for k in g] for g in groups] == [
        ["dot_general"],
        ["dot_general"],
    ]
    new = gather_per_use(prog, {0: (S(0),)})
    w_var = prog.invars[0]
    copies = [e for e in new.eqns if e.primitive.name == "sbp_constraint" and e.inputs == [w_var]]
    assert [e.params["sbp"] for e in copies] == [(S(0),), (S(0),)]
    x, w = np.random.default_rng(0).normal(size=(2, 4, 4)).astype(np.float32)
    want = np.asarray(f(w, x))
    pl = fflow.placement("cpu", [0, 1])
    got = fflow.shard(f, pl, in_sbp=(S(0), S(0)), memory_limit=10**6)(w, x)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [2, 4])
def test_fsdp_adam_step_fits_and_matches_numpy(n):
    pl = fflow.placement("cpu", list(range(n)))
    out = run(pl)
    _check(out)
    # the independent liveness count of device 0's program agrees with the planner's
    params, opt, x, y = init()
    f = fflow.shard(
        step, pl, in_sbp=(None, None, S(0), S(0)), profile=H200, memory_limit=out["budget"]
    )
    sp = f.plan(params, opt, x, y)
    assert local_peak(sp) == sp.peak_memory <= out["budget"]
    # explain() says so, and does not list the inserted constraints as the user's with_sbp
    text = sp.explain()
    assert "all-gathered per use (FSDP" in text and "with_sbp at" not in text
    # every weight but the first is read forward and backward (no input gradient is
    # computed for the batch); biases are read once
    assert f"FSDP: {2 * (len(DIMS) - 2)} uses" in text


def test_gathered_weights_are_freed_after_their_last_reader():
    """Bytes of live arrays on each simulated device, before every stage of its program:
    never above the planned peak, and a gathered hidden weight (the only arrays of the
    whole weight's shape) is freed after its use, so at most one is live at a time."""
    pl = fflow.placement("cpu", [0, 1, 2, 3])
    params, opt, x, y = init()
    args = (params, opt, x, y)
    budget = min(peaks_without_fsdp(pl, args)) - 1
    f = fflow.shard(step, pl, in_sbp=(None, None, S(0), S(0)), profile=H200, memory_limit=budget)
    sp = f.plan(*args)
    seen = {"bytes": 0, "full": 0}

    def probe(env):
        bufs = {}  # (a device's piece of an input may be a view of the caller's array)
        for a in env.values():
            a = np.asarray(a)
            bufs[(a.__array_interface__["data"][0], a.nbytes)] = a.nbytes
        seen["bytes"] = max(seen["bytes"], sum(bufs.values()))
        full = sum(np.shape(a) == (DIMS[1], DIMS[2]) for a in env.values())
        seen["full"] = max(seen["full"], full)

    shard_exec.live_probe = probe
    try:
        f(*args)
    finally:
        shard_exec.live_probe = None
    assert 0 < seen["bytes"] <= sp.peak_memory <= budget
    assert seen["full"] == 1


def test_budgets_from_loose_to_impossible():
    """Transformer step (planner_models), batch annotated only, budgets from 10% under the
    data-parallel peak down to where nothing fits: every plan returned fits by the
    liveness count of device 0's program (or planning raises, naming the limit); the
    loose budget keeps the parameters whole (ZeRO-1/2, no per-use gathers); a tighter
    one gets FSDP, whose step equals the unsharded one."""
    pl = fflow.placement("cpu", [0, 1, 2, 3])
    params = pm.init(2, 32)
    x, y = pm.data(4, 8, 32)
    rng = np.random.default_rng(2)

    # Adam state away from zero: the first step from zeros is lr * sign(g), which turns
    # rounding in tiny gradients into lr-sized differences (a conditioning issue)
    def state(a, floor):
        return (floor + (rng.normal(size=a.shape) * 1e-2) ** 2).astype(np.float32)

    opt = [
        ({k: state(a, -1e-4) for k, a in p.items()}, {k: state(a, 1e-4) for k, a in p.items()})
        for p in params
    ]
    args = (params, opt, x, y)
    fn = pm.step_fn(4)
    in_sbp = (None, None, S(0), S(0))
    peak = local_peak(fflow.shard(fn, pl, in_sbp=in_sbp, profile=H200).plan(*args))
    kinds = []
    for frac in (0.9, 0.6, 0.5, 0.4):
        limit = int(frac * peak)
        f = fflow.shard(fn, pl, in_sbp=in_sbp, profile=H200, memory_limit=limit)
        try:
            sp = f.plan(*args)
        except ValueError as e:
            assert f"memory_limit={limit}" in str(e)
            kinds.append("none")
            continue
        assert local_peak(sp) == sp.peak_memory <= limit, frac
        kinds.append("fsdp" if sp.gathered_per_use else sp.storage_rung)
        if sp.gathered_per_use and kinds.count("fsdp") == 1:
            got, _ = fflow.tree_util.tree_flatten(f(*args))
            ref, _ = fflow.tree_util.tree_flatten(pm.train_step(*args, heads=4))
            for g, r in zip(got, ref):
                np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=2e-4, atol=2e-5)
    assert kinds[0] == 1 and "fsdp" in kinds and kinds[-1] == "none", kinds


def test_outputs_converted_for_the_caller_count():
    """An output held in another SBP than the caller asked for is converted after the
    last equation; that copy counts (on a 2x2 mesh the Adam update's new parameters are
    all-gathered there, and a plan whose device program held 306180 B was reported at
    279588 B under a 306703 B limit)."""
    from fflow.transforms.shard_memory import peak_memory

    pl = fflow.placement("cpu", [0, 1])
    x = np.ones((64, 8), np.float32)
    f = fflow.shard(lambda a: a * 2.0, pl, in_sbp=S(0), out_sbp=B)
    sp = f.plan(x)
    assert sp.count("all_gather") == 1  # gathered at the end: the product stays split
    # at the end: the input's piece, the product's piece, the gathered product
    assert peak_memory(sp.plan.problem, sp.plan.sig_index)[0] == local_peak(sp) == 4096
    np.testing.assert_allclose(np.asarray(f(x)), x * 2.0)


def _split_everywhere(out):
    """Every parameter and Adam state leaf stored split by every mesh axis (the batch's
    two leaves come last): a device holds a quarter of it on 2x2, not a half."""
    stored = out["stored"][:-2]
    assert stored and all(s.count("S(") == len(out["mesh"]) for s in stored), stored


@functools.lru_cache(maxsize=1)
def _run_2x2():
    """The MLP FSDP step on a simulated 2x2 mesh (shared by two tests)."""
    return run(mesh_placement(4, "2x2"))


def test_fsdp_adam_step_on_2x2_mesh():
    """Batch split over the 2x2 mesh, budget below every plan without per-use gathers:
    state stored split over both mesh axes, each weight gathered per use, the step
    equals float64 NumPy and fits by device 0's liveness count and by measured bytes."""
    pl = mesh_placement(4, "2x2")
    out = _run_2x2()
    _check(out)
    _split_everywhere(out)
    params, opt, x, y = init()
    data = (S(0), S(0))
    f = fflow.shard(
        step, pl, in_sbp=(None, None, data, data), profile=H200, memory_limit=out["budget"]
    )
    sp = f.plan(params, opt, x, y)
    assert all(local_peak(sp, k) <= sp.peak_memory for k in range(4))
    assert local_peak(sp) == sp.peak_memory <= out["budget"]


@pytest.mark.skipif(not mpi_available(), reason="no mpi4py/mpiexec")
@pytest.mark.parametrize("n", [2, 4])
def test_fsdp_adam_step_on_mpi_ranks(n):
    out = launch_result("shard_fsdp_script.py", n)
    assert out["devices"] == n
    _check(out)


@pytest.mark.skipif(not mpi_available(), reason="no mpi4py/mpiexec")
def test_fsdp_adam_step_on_mpi_ranks_2x2(monkeypatch):
    """The 2x2 FSDP step on 4 ranks equals float64 NumPy, and the simulated run."""
    monkeypatch.setenv("FSDP_MESH", "2x2")
    out = launch_result("shard_fsdp_script.py", 4)
    assert out["mesh"] == [2, 2]
    _check(out)
    _split_everywhere(out)
    sim = _run_2x2()
    assert (sim["peak"], sim["bytes"], sim["stored"]) == (out["peak"], out["bytes"], out["stored"])
    np.testing.assert_allclose(out["loss"], sim["loss"], rtol=1e-6)
    for got, ref in zip(out["got"], sim["got"]):
        np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-5, atol=1e-6)


def test_transformer_grads_on_2x2_mesh_under_a_tight_budget():
    """Transformer loss and gradients (planner_models, no optimizer), batch split over the
    2x2 mesh, a budget 10% under the data-parallel peak: the plan gathers per use
    with the parameters stored split over both mesh axes, fits by every device's
    liveness count, and gives the unsharded value and gradients."""
    pl = mesh_placement(4, "2x2")
    params = pm.init(2, 32)
    x, y = pm.data(8, 8, 32)
    fn = pm.step_fn(4, adam=False)
    data = (S(0), S(0))
    in_sbp = (None, data, data)
    ref_v, ref_g = fn(params, x, y)
    ref, _ = fflow.tree_util.tree_flatten(ref_g)
    peak = local_peak(fflow.shard(fn, pl, in_sbp=in_sbp, profile=H200).plan(params, x, y))
    limit = int(0.9 * peak)
    f = fflow.shard(fn, pl, in_sbp=in_sbp, profile=H200, memory_limit=limit)
    sp = f.plan(params, x, y)
    assert max(local_peak(sp, k) for k in range(4)) == sp.peak_memory <= limit
    assert sp.gathered_per_use
    assert all(s == (S(s[0].axis),) * 2 for s in sp.in_sbps[:-2])  # (batch: the last two)
    v, g = f(params, x, y)
    np.testing.assert_allclose(float(v), float(ref_v), rtol=1e-5)
    for a, r in zip(fflow.tree_util.tree_flatten(g)[0], ref):
        np.testing.assert_allclose(np.asarray(a), np.asarray(r), rtol=2e-4, atol=2e-6)


def test_fsdp_on_2x2_with_dims_the_mesh_does_not_divide():
    """MLP 6-10-10-2 on a 2x2 mesh: no dim is a multiple of 4, so each mesh axis splits
    its own dim (weights (S(0), S(1))) or, where only one dim divides by 2, one axis
    splits and the other keeps it whole (biases (S(0), B)). Under a budget of half the
    data-parallel peak the plan gathers per use, fits by every device's liveness count,
    and the Adam step equals float64 NumPy."""
    pl = mesh_placement(4, "2x2")
    params, opt, x, y = init((6, 10, 10, 2), batch=8)
    args = (params, opt, x, y)
    data = (S(0), S(0))
    in_sbp = (None, None, data, data)
    peak = local_peak(fflow.shard(step, pl, in_sbp=in_sbp, profile=H200).plan(*args))
    limit = peak // 2
    f = fflow.shard(step, pl, in_sbp=in_sbp, profile=H200, memory_limit=limit)
    sp = f.plan(*args)
    assert sp.gathered_per_use
    assert sp.in_sbps[:4] == [(S(0), S(1)), (S(0), B), (S(0), S(1)), (S(0), B)]
    assert max(local_peak(sp, k) for k in range(4)) == sp.peak_memory <= limit
    loss, new_p, new_o = f(*args)
    ref_loss, ref_p, ref_o = numpy_step(*args)
    np.testing.assert_allclose(float(loss), ref_loss, rtol=1e-5)
    for got, ref in zip(new_p + new_o, ref_p + ref_o):
        for a, r in zip(got, ref):
            np.testing.assert_allclose(np.asarray(a), r, rtol=1e-4, atol=1e-6)
