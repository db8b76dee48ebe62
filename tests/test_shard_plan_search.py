"""Search gaps of the free planner on the Megatron-annotated transformer step
(benchmarks/planner_models.py, H200 profile), each closed by a start of the search
(transforms/shard_plan.py `_searched`): the free plan must be as fast as the hand plan
(which is searched too: only its forward activations are forced) and move no more
bytes than 1.05x it."""

import os
import sys

import pytest

import fflow
from fflow.sharding import H200

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
import planner_models as pm  # noqa: E402


def _plans(pl, layers, b, t, d):
    heads = max(4, pl.hierarchy[-1])
    f, args = pm.megatron_sharded(pl, layers, b, t, d, heads, profile=H200)
    hand, _ = pm.megatron_sharded(pl, layers, b, t, d, heads, hints=True, profile=H200)
    return f.plan(*args), hand.plan(*args)


@pytest.mark.parametrize("mesh", [[[0, 1], [2, 3]], [[0, 1, 2, 3], [4, 5, 6, 7]]])
def test_tiny_two_d_step_moves_the_hand_plans_bytes(mesh):
    """1 layer at 2,16,64 on 2x2 / 2x4: the first block's layernorm backward all-reduced
    its (b, t, d) input gradient where the hand plan all-reduces the (d,) gradients of
    g1 / b1 (0.496 vs 0.448 MB, 0.665 vs 0.554 MB) at 0.08% more time; found from the
    extra partial-sum tie-breakers (0.0, 0.5) run on programs of <= 1000 equations."""
    sp, hand = _plans(fflow.placement("cpu", mesh), 1, 2, 16, 64)
    assert sp.plan.time <= hand.plan.time * (1 + 1e-9)
    assert sp.bytes <= 1.05 * hand.bytes


def test_two_layer_layernorm_backward_is_one_all_reduce_per_block():
    """2 layers at 4,128,256 on 4 devices: every start refined to a plan whose forward
    layernorms run batch-split, so three layernorm backwards reduce-scatter their
    input gradient and all-gather it back (170.1 us, 25.2 MB). The start where splits
    only propagate from the annotations (`_propagated`) refines to Megatron: 149.0 us."""
    b, t, d = 4, 128, 256
    sp, hand = _plans(fflow.placement("cpu", [0, 1, 2, 3]), 2, b, t, d)
    acts = [
        bp.collectives()
        for _, v, _, _, bp in sp.boxings()
        if bp.bytes and v.aval.shape == (b, t, d)
    ]
    assert acts and all(c == ["all_reduce"] for c in acts), acts
    assert sp.plan.time <= hand.plan.time * (1 + 1e-9)
    assert sp.bytes <= 1.05 * hand.bytes


def test_propagated_start_shares_repeated_layers(monkeypatch):
    """The start where splits only propagate prices a new split at 1e3 s; a label
    reached only that way had a cost-to-come of 1e3 s minus what each layer's compute
    saved, new in every layer, so the lookahead's memo missed in every layer (24 layers:
    2766 messages vs 708 in the other starts) and the start was too slow to run there.
    From 4 to 8 layers it must send few new messages per added layer (about 10 of a
    layer's 373 equations; 60 before the fix)."""
    from fflow.transforms import shard_plan

    sent = {"on": False, "n": 0}
    messages, propagated = shard_plan._messages, shard_plan._propagated

    def counting_messages(*a):
        sent["n"] += sent["on"]
        return messages(*a)

    def counting_propagated(prob, bound):
        sent["on"], sent["n"] = True, 0
        try:
            return propagated(prob, shard_plan.INF)  # (both decodes)
        finally:
            sent["on"] = False

    monkeypatch.setattr(shard_plan, "_messages", counting_messages)
    monkeypatch.setattr(shard_plan, "_propagated", counting_propagated)
    pl = fflow.placement("cpu", [0, 1, 2, 3])
    n = {}
    for layers in (4, 8):
        f, args = pm.megatron_sharded(pl, layers, 2, 16, 64, 4, profile=H200)
        per_layer = len(f.plan(*args).exec_program.eqns) / layers
        n[layers] = sent["n"]
    assert n[4] > 0
    assert (n[8] - n[4]) / 4 < 0.1 * per_layer, (n, per_layer)


def test_a_kept_plan_costs_what_its_signatures_cost_free():
    """keep_in_sbp plans are points of the free search, so the free search can be held
    to "at least as fast as the kept plan": the same signatures must cost the same in
    both problems. The overlap credit of the gradient all-reduces read its compute
    timeline from each equation's cheapest candidate after keep_in_sbp's restriction,
    so the kept plan read 0.23% cheaper (1 layer 2,16,64 on 2x2: 40.761 vs 40.854 us;
    24 layers at 4,128,256 on 2x4: 1.547 vs 1.549 ms for the free plan's own signatures)."""
    from fflow.transforms.shard_plan import Plan

    pl = fflow.placement("cpu", [[0, 1], [2, 3]])
    free, args = pm.megatron_sharded(pl, 1, 2, 16, 64, 4, profile=H200)
    kept, _ = pm.megatron_sharded(pl, 1, 2, 16, 64, 4, profile=H200, keep=True)
    fp, kp = free.plan(*args).plan, kept.plan(*args).plan
    prob = fp.problem
    same = Plan(prob, [prob.cands[k].index(s) for k, s in enumerate(kp.eqn_sigs)])
    assert kp.hidden_time > 0  # (the credit is there to differ)
    assert kp.time == pytest.approx(same.time, rel=1e-12, abs=0)
    assert fp.time <= kp.time * (1 + 1e-12)
