"""Gradient buckets (transforms/shard_buckets.py) as the executor runs them
(transforms/shard_exec._stages): every bucket starts right after the stage that
computes its last member's input, is waited for right before the first stage that
reads one of its results, MPI is polled only while a bucket is in flight, and no
number changes: one plan run with buckets off, one per gradient, a few, one (DDP's
25 MB) and that one waited at its start gives the same bits on simulated devices and
on `fflow.launch -n 2` / `-n 4` ranks, close to a float64 NumPy step."""

import numpy as np
import pytest
from fflow.transforms.shard_exec import _stages
from mpi_util import launch_result, mpi_available
from shard_buckets_script import BATCH, DIMS, SETTINGS, init, run, step

import fflow
from fflow.config import config
from fflow.core import Literal
from fflow.sharding import B, S


def order_problems(prog, stages):
    """What is wrong with `stages` as a schedule of device program `prog`, read from
    the program's dataflow alone (empty when nothing is)."""
    have = set(prog.invars) | set(prog.constvars)
    flight, seen, problems = {}, set(), []
    comp = [k for k, st in enumerate(stages) if st[0] in ("segment", "collective")]

    def reads(st):
        return st[2] if st[0] == "segment" else [st[1].inputs[0]]

    def writes(st):
        return st[3] if st[0] == "segment" else [st[1].outputs[0]]

    for k, st in enumerate(stages):
        kind, item = st[0], st[1]
        if kind in ("segment", "collective"):
            missing = [v for v in reads(st) if type(v) is not Literal and v not in have]
            if missing:
                problems.append(f"stage {k} ({kind}) reads {missing} before they exist")
            have.update(writes(st))
            polled = k + 1 < len(stages) and stages[k + 1][0] == "progress"
            if kind == "segment" and flight and not polled:
                problems.append(f"stage {k} computes with buckets in flight, no poll after")
        elif kind == "start":
            ins = [e.inputs[0] for e in item.members]
            if item.number in seen:
                problems.append(f"bucket {item.number} started twice")
            if any(v not in have for v in ins):
                problems.append(f"bucket {item.number} started before its inputs exist")
            before = [j for j in comp if j < k]
            made = set(ins) & (set(writes(stages[before[-1]])) if before else set(prog.invars))
            if not made:  # started later than it could have been
                problems.append(f"bucket {item.number} not started right after its last input")
            seen.add(item.number)
            flight[item.number] = item
        elif kind == "wait":
            if flight.pop(item.number, None) is None:
                problems.append(f"bucket {item.number} waited for without being in flight")
            results = {e.outputs[0] for e in item.members}
            have.update(results)
            after = [j for j in comp if j > k]
            users = set(reads(stages[after[0]])) if after else set(prog.outvars)
            if not results & users:  # waited for earlier than its first use
                problems.append(f"bucket {item.number} waited for before its first use")
        elif kind == "progress" and not flight:
            problems.append(f"stage {k} polls MPI with no bucket in flight")
    if flight:
        problems.append(f"buckets {sorted(flight)} still in flight at the end")
    missing = [v for v in prog.outvars if type(v) is not Literal and v not in have]
    if missing:
        problems.append(f"outputs {missing} never computed")
    return problems


def _local(n, mb):
    params, x, y = init(DIMS, BATCH)
    config.update("grad_bucket_mb", mb)
    try:
        pl = fflow.placement("cpu", list(range(n)))
        fn = fflow.shard(step, pl, in_sbp=(B, S(0), S(0)), out_sbp=B)
        prog = fn.plan(params, x, y).local_program(0)
        return prog, _stages(prog)
    finally:
        config.update("grad_bucket_mb", 25.0)


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("mb", [1e-6, 0.01, 25.0])
def test_buckets_start_when_complete_and_wait_where_first_used(n, mb):
    prog, stages = _local(n, mb)
    kinds = [st[0] for st in stages]
    assert kinds.count("start") == kinds.count("wait") >= 1, kinds
    assert order_problems(prog, stages) == []
    # one 25 MB bucket is complete only when the backward pass is (its last member is
    # the first layer's gradient), and the update reads it next: only work that reads
    # no computed value (constants) can run behind it; smaller buckets start earlier,
    # with backward compute still to run behind them
    s, w = kinds.index("start"), kinds.index("wait")
    behind = [st for st in stages[s:w] if st[0] == "segment"]
    if mb < 1:
        assert any(st[2] for st in behind), kinds
    else:
        assert not any(st[2] for st in behind), kinds


def test_the_order_check_sees_wrong_orders():
    """The check above is not vacuous: moving a wait before its start, a start before
    its inputs, a wait past the first reader, or dropping a wait is reported."""
    prog, stages = _local(2, 0.01)
    s = next(k for k, st in enumerate(stages) if st[0] == "start")
    w = next(k for k, st in enumerate(stages) if st[0] == "wait" and st[1] is stages[s][1])
    swapped = list(stages)
    swapped[s], swapped[w] = stages[w], stages[s]
    early = stages[: s - 1] + [stages[s]] + [stages[s - 1]] + stages[s + 1 :]
    late = stages[:w] + [stages[w + 1], stages[w]] + stages[w + 2 :]
    dropped = stages[:w] + stages[w + 1 :]
    for wrong in (swapped, early, late, dropped):
        assert order_problems(prog, wrong), wrong


def _check(out, sim):
    assert out["devices"] == sim["devices"]
    assert out["buckets"] == sim["buckets"]
    # the settings really schedule differently: none, one per gradient, a few, one
    assert out["buckets"]["off"] == []
    counts = [len(out["buckets"][name]) for name, *_ in SETTINGS[1:]]
    assert counts[0] > counts[1] > counts[2] == counts[3] == counts[4] == 1, out["buckets"]
    # one number for every setting, the simulated runtime's bit for bit
    assert set(out["digest"].values()) == set(sim["digest"].values())
    assert len(set(out["digest"].values())) == 1, out["digest"]
    # gradients reduced in place never touch the caller's arrays, nor a caller's partial
    # value that is itself a bucket member
    assert out["inputs_kept"]
    part = out["partial_input"]
    assert part["buckets"] and part["kept"] and part["close"], part
    assert part["digest"] == sim["partial_input"]["digest"]
    np.testing.assert_allclose(out["loss"], out["ref_loss"], rtol=1e-5)
    for got, ref in zip(out["params"], out["ref_params"]):
        np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("n", [2, 4])
def test_buckets_change_no_number_simulated(n):
    sim = run(fflow.placement("cpu", list(range(n))))
    _check(sim, sim)


@pytest.mark.skipif(not mpi_available(), reason="no mpi4py/mpiexec")
@pytest.mark.parametrize("n", [2, 4])
def test_buckets_change_no_number_on_mpi_ranks(n):
    sim = run(fflow.placement("cpu", list(range(n))))
    _check(launch_result("shard_buckets_script.py", n), sim)


def test_every_member_of_the_group_splits_a_bucket_alike():
    """Which bucket members are reduced alone depends on their sizes only: a device whose
    big gradient is also held elsewhere (a cache, a view) must send the same parts as a
    device that owns it (different parts made the group's flat buffers differ: 3,075 vs
    265,219 elements in one run), and the held array is copied, never overwritten."""
    from fflow.transforms.shard_buckets import SPLIT_BYTES, Bucket

    big = np.arange(SPLIT_BYTES[0] // 4, dtype=np.float32)
    small = np.ones(10, np.float32)
    held = big.copy()
    bucket = Bucket(0, {}, np.float32)
    owned = bucket.parts([(small, False), (big.copy(), True)])
    shared = bucket.parts([(small, False), (held, False)])
    assert [p[0] for p in owned] == [p[0] for p in shared] == [[0], [1]]
    assert [p[1].shape for p in owned] == [p[1].shape for p in shared]
    assert all(p[2] for p in shared[1:])  # the big part may be reduced in place...
    assert not np.shares_memory(shared[1][1], held)  # ...because it is a copy
