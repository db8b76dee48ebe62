"""Measured bubbles (fflow/pipeline_trace.py): the traces a pipeline step records, the
executed schedule's ticks against the textbook (p-1)/(v*m+p-1), and timelines against
hand-worked examples."""

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp
from fflow.pipeline_schedule import Lane, place
from fflow.pipeline_trace import StepTrace, op_costs


def stage(w, xy):
    x, y = xy
    return jnp.tanh(x @ w), y


def last(w, xy):
    x, y = xy
    return jnp.mean((x @ w - y) ** 2)


def run(kind, m, p=4, v=1):
    n = p * v
    pls = [fflow.placement("cpu", [i]) for i in range(p)]
    f = fflow.pipeline([stage] * (n - 1) + [last], pls, m, schedule=kind)
    rng = np.random.default_rng(0)
    ws = [rng.normal(size=(5, 5)).astype(np.float32) for _ in range(n)]
    batch = (rng.normal(size=(2 * m, 5)).astype(np.float32), np.zeros((2 * m, 5), np.float32))
    fflow.grad(f)(ws, batch)
    return f


@pytest.mark.parametrize("kind,v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)])
@pytest.mark.parametrize("m", [4, 8])
def test_executed_ticks_give_the_textbook_bubble(kind, v, m):
    p = 4
    f = run(kind, m, p, v)
    trace = f.stats["trace"]
    # every operation ran once, timed in order
    keys = sorted((o.kind, o.stage, o.mb) for o in trace)
    assert keys == sorted((k, s, b) for k in "FB" for s in range(p * v) for b in range(m))
    assert all(o.wait <= o.start <= o.end and o.cpu >= 0 for o in trace)
    assert all(a.end <= b.wait for a, b in zip(trace, trace[1:]))  # one process: in turn
    ticks = StepTrace.gather(f).ticks()
    assert ticks.span == 2 * (v * m + p - 1)
    np.testing.assert_allclose(ticks.idle, [(p - 1) / (v * m + p - 1)] * p)


def test_place_by_hand():
    # GPipe, 2 devices, 2 micro-batches, F = 1 s, B = 2 s:
    # dev0 F0 [0,1] F1 [1,2] ........ B0 [5,7] B1 [7,9]
    # dev1 ..... F0 [1,2] F1 [2,3] B0 [3,5] B1 [5,7]
    lanes = [
        Lane("dev0", [("F", 0, 0), ("F", 0, 1), ("B", 0, 0), ("B", 0, 1)]),
        Lane("dev1", [("F", 1, 0), ("F", 1, 1), ("B", 1, 0), ("B", 1, 1)]),
    ]
    t = place(lanes, lambda lane, op: 1.0 if op[0] == "F" else 2.0, 2)
    assert t.span == 9 and t.busy == [6, 6]
    np.testing.assert_allclose(t.idle, [1 / 3, 1 / 3])  # (p-1)/(m+p-1)
    # dev0 waiting for each B before the next F: no pipelining, span 8 ticks, not 6
    serial = [
        Lane("dev0", [("F", 0, 0), ("B", 0, 0), ("F", 0, 1), ("B", 0, 1)]),
        Lane("dev1", [("F", 1, 0), ("B", 1, 0), ("F", 1, 1), ("B", 1, 1)]),
    ]
    t = place(serial, lambda lane, op: 1.0, 2)
    assert t.span == 8 and t.idle == [0.5, 0.5]
    # an order that waits on itself is no schedule
    stuck = [Lane("dev0", [("B", 0, 0), ("F", 0, 0)]), Lane("dev1", [("F", 1, 0), ("B", 1, 0)])]
    with pytest.raises(ValueError, match="wait on each other"):
        place(stuck, lambda lane, op: 1.0, 2)


def test_cpu_timeline_and_costs():
    # two steps' traces of one 2-device GPipe step, with CPU seconds made up
    def trace(slow):
        def ops(s, f_sec, b_sec):
            seq = [("F", s, 0), ("F", s, 1), ("B", s, 0), ("B", s, 1)]
            return [k + (0.0, 0.0, 0.0, f_sec if k[0] == "F" else b_sec) for k in seq]

        return StepTrace(
            [Lane("dev0", ops(0, 1.0, 2.0)), Lane("dev1", ops(1, slow, 4.0))], 2, False
        )

    traces = [trace(3.0), trace(2.0)]
    costs = op_costs(traces)
    assert costs == {
        ("dev0", "F", 0): 1.0,
        ("dev0", "B", 0): 2.0,
        ("dev1", "F", 1): 2.0,
        ("dev1", "B", 1): 4.0,
    }
    # dev1 is the bottleneck (F 2, B 4): dev0 F0 [0,1] F1 [1,2]; dev1 F0 [1,3] F1 [3,5]
    # B0 [5,9] B1 [9,13]; dev0 B0 [9,11] B1 [13,15]: span 15, busy 6 and 12
    t = traces[0].cpu_timeline(costs)
    assert t.span == 15 and t.busy == [6.0, 12.0]
    assert t.bottleneck == pytest.approx(1 - 12 / 15)
    assert t.imbalance() == pytest.approx(12 / 9)
    assert traces[0].cpu_timeline().busy == [6.0, 14.0]  # its own seconds: F 3 on dev1
    assert traces[0].wall() is None  # simulated devices do not run at once
