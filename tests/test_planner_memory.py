"""Memory as a constraint: per-device peak from liveness, `memory_limit=` never exceeded
(checked against a liveness count over the per-device program, written here), and
ZeRO-style storage of the optimizer state found from the batch annotation alone."""

import os
import sys

import numpy as np
import pytest

import fflow
from fflow.sharding import H200, S

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
import planner_models as pm  # noqa: E402

PL4 = fflow.placement("cpu", [0, 1, 2, 3])


def local_peak(sp, flat=0):
    """Peak bytes of one device's program: inputs all call long, values def..last use."""
    prog = sp.local_program(flat)
    n = len(prog.eqns)

    def size(v):
        return int(np.prod(v.aval.shape)) * v.aval.dtype.itemsize

    last, start = {}, {}
    for k, e in enumerate(prog.eqns):
        for v in e.inputs:
            if hasattr(v, "id"):
                last[v] = k
        for v in e.outputs:
            start[v] = k
    for v in prog.outvars:
        if hasattr(v, "id"):
            last[v] = n
    events = [0] * (n + 2)
    for v in list(prog.invars) + list(prog.constvars):
        events[0] += size(v)
        events[n + 1] -= size(v)
    for v, k in start.items():
        events[k] += size(v)
        events[last.get(v, k) + 1] -= size(v)
    cur = peak = 0
    for t in range(n + 1):
        cur += events[t]
        peak = max(peak, cur)
    return peak


def _setup():
    params = pm.init(1, 32)
    x, y = pm.data(8, 8, 32)
    return pm.step_fn(4), (params, pm.adam_init(params), x, y)


def test_tight_budget_stores_optimizer_state_split_and_fits():
    fn, args = _setup()
    free = fflow.shard(fn, PL4, in_sbp=(None, None, S(0), S(0)), profile=H200)
    peak_dp = local_peak(free.plan(*args))
    limit = int(peak_dp * 0.9)
    f = fflow.shard(fn, PL4, in_sbp=(None, None, S(0), S(0)), profile=H200, memory_limit=limit)
    sp = f.plan(*args)
    assert local_peak(sp) <= limit and sp.peak_memory == local_peak(sp)
    assert sp.storage_rung >= 1
    opt_in = sp.in_sbps[len(fflow.tree_util.tree_flatten(args[0])[0]) :][:12]
    assert all(s[0].is_split() for s in opt_in if s is not None)
    got, _ = fflow.tree_util.tree_flatten(f(*args))
    ref, _ = fflow.tree_util.tree_flatten(pm.train_step(*args, heads=4))
    for g, r in zip(got, ref):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=2e-4, atol=1e-5)


def test_budget_below_every_plan_is_a_clear_error():
    fn, args = _setup()
    f = fflow.shard(fn, PL4, in_sbp=(None, None, S(0), S(0)), profile=H200, memory_limit=1000)
    with pytest.raises(ValueError, match="memory_limit=1000"):
        f.plan(*args)
