"""The planner on a data-parallel training step: params B, batch S(0), outputs B.

With the simulated-link CPU profile the plan is plain data parallelism (one all-reduce
per gradient and one for the loss, bytes = 2 (p-1) x their sizes), because gradient
all-reduces are bucketed and overlap the rest of the backward pass
(transforms/shard_cost.py `hidden_time`); the default CPU_MPI profile gets the same plan
from its per-collective costs (tests/test_device_profile.py). Before that credit, every collective was
priced as if serial and the planner reduce-scattered the hidden layers' gradients,
updated them split and all-gathered the weights. Values against a float64 NumPy step
with the backward pass written out, on simulated devices and under fflow.launch."""

import numpy as np
import pytest
from fflow.transforms.shard_cost import hidden_time
from mpi_util import launch_result, mpi_available
from shard_plan_dp_script import DIMS, run

import fflow
from fflow.config import config
from fflow.sharding import CPU


def test_hidden_time_is_the_overlap_on_one_link():
    # a: ready at 0, read at 10, takes 4 -> hides all; b waits for the link until 4,
    # runs to 8, its reader starts at 6 -> 2 hidden; c is read as soon as it is ready
    items = [("a", 0.0, 10.0, 4.0), ("b", 1.0, 6.0, 4.0), ("c", 9.0, 9.0, 1.0)]
    assert hidden_time(items) == {"a": 4.0, "b": 2.0, "c": 0.0}
    # the order given does not matter, the order the values become ready does
    assert hidden_time(items[::-1]) == {"a": 4.0, "b": 2.0, "c": 0.0}
    # a busy link delays the next one past its reader
    assert hidden_time([("a", 0.0, 1.0, 5.0), ("b", 0.5, 3.0, 1.0)]) == {"a": 1.0, "b": 0.0}


def _expected_dp_bytes(p):
    sizes = [a * b + b for a, b in zip(DIMS[:-1], DIMS[1:])]
    return 2 * (p - 1) * 4 * (sum(sizes) + 1)  # every gradient and the loss, f32


def _check(out):
    p = out["devices"]
    grad_shapes = {(a, b) for a, b in zip(DIMS[:-1], DIMS[1:])}
    grad_shapes |= {(b, a) for a, b in grad_shapes} | {(b,) for b in DIMS[1:]} | {()}
    for shape, have, want, colls, _ in out["conversions"]:
        assert colls == ["all_reduce"] and have == "(P,)" and want == "(B,)", out["conversions"]
        assert tuple(shape) in grad_shapes
    assert len(out["conversions"]) == 2 * (len(DIMS) - 1) + 1
    assert out["bytes"] == _expected_dp_bytes(p)
    np.testing.assert_allclose(out["loss"], out["ref_loss"], rtol=1e-5)
    for got, ref in zip(out["params"], out["ref_params"]):
        np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("n", [2, 4])
def test_dp_mlp_gets_plain_data_parallelism(n):
    _check(run(fflow.placement("cpu", list(range(n)))))


def test_without_buckets_nothing_is_hidden():
    """grad_bucket_mb=0 turns bucketing off: every all-reduce runs where it is read, so
    none overlaps and the step is priced as before (no credit)."""
    from shard_plan_dp_script import init, step

    from fflow.sharding import B, S

    pl = fflow.placement("cpu", [0, 1])
    params, x, y = init()
    old = config.grad_bucket_mb
    try:
        config.update("grad_bucket_mb", 0.0)
        sp = fflow.shard(step, pl, in_sbp=(B, S(0), S(0)), out_sbp=B, profile=CPU).plan(
            params, x, y
        )
        assert not sp.plan.problem.hidden
    finally:
        config.update("grad_bucket_mb", old)
    sp = fflow.shard(step, pl, in_sbp=(B, S(0), S(0)), out_sbp=B, profile=CPU).plan(params, x, y)
    assert sp.plan.problem.hidden


@pytest.mark.skipif(not mpi_available(), reason="no mpi4py/mpiexec")
@pytest.mark.parametrize("n", [2, 4])
def test_dp_mlp_on_mpi_ranks(n):
    out = launch_result("shard_plan_dp_script.py", n)
    assert out["devices"] == n
    _check(out)


def test_explain_shows_the_communication_hidden_behind_the_backward_pass():
    from shard_plan_dp_script import init, step

    from fflow.sharding import B, S

    params, x, y = init()
    pl = fflow.placement("cpu", [0, 1])
    sp = fflow.shard(step, pl, in_sbp=(B, S(0), S(0)), out_sbp=B, profile=CPU).plan(params, x, y)
    plan = sp.plan
    # every weight and bias gradient (4 layers) is credited with some overlap (and the
    # loss's all-reduce, which the backward pass runs behind); the count is the credits'
    assert plan.hidden_count == len(plan.problem.hidden) >= 2 * (len(DIMS) - 1)
    # at most the overlap each gradient's all-reduce was credited with, and some of it
    assert 0 < plan.hidden_time <= sum(plan.problem.hidden.values()) * (1 + 1e-12)
    assert f"({plan.hidden_count} bucketed gradient all-reduces)" in sp.explain().splitlines()[1]
