"""Plans explained: golden text of `.plan(...).explain()` and `.compare()` (fixed profile,
so the numbers are the cost model's and do not depend on this machine)."""

import os

import numpy as np

import fflow
import fflow.numpy as jnp
from fflow.sharding import B, DeviceProfile, S

PROFILE = DeviceProfile("golden", flops=1e9, mem_bandwidth=1e10, latency=1e-5, bandwidth=1e9)
PL2 = fflow.placement("cpu", [0, 1])


def mlp(x, w1, w2):
    return jnp.tanh(x @ w1) @ w2


ARGS = (np.ones((8, 4), np.float32), np.ones((4, 16), np.float32), np.ones((16, 4), np.float32))

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")


def _golden(name):
    with open(os.path.join(GOLDEN, name)) as f:
        return f.read()


def test_explain_megatron_mlp_golden():
    f = fflow.shard(mlp, PL2, in_sbp=(B, S(1), S(0)), out_sbp=B, profile=PROFILE)
    assert f.plan(*ARGS).explain() == _golden("planner_explain_megatron.txt")


def test_compare_megatron_with_data_parallel_golden():
    f = fflow.shard(mlp, PL2, in_sbp=(B, S(1), S(0)), out_sbp=B, profile=PROFILE)
    g = fflow.shard(mlp, PL2, in_sbp=(S(0), B, B), out_sbp=B, profile=PROFILE)
    assert f.plan(*ARGS).compare(g.plan(*ARGS)) == _golden("planner_compare.txt")


def test_explain_lists_with_sbp_constraints_and_only_communicating_equations():
    def hinted(x, w1, w2):
        return fflow.with_sbp(jnp.tanh(x @ w1), S(1)) @ w2

    f = fflow.shard(hinted, PL2, in_sbp=(B, B, S(0)), out_sbp=B, profile=PROFILE)
    text = f.plan(*ARGS).explain(every=False)
    assert "with_sbp at test_planner_print.py:" in text and "= S(1), already so" in text
    body = text.split("alternatives):\n")[1].splitlines()
    assert all("0 B]" not in line for line in body if line.startswith("  "))


def test_explain_says_which_inputs_were_kept_and_what_the_others_became_golden():
    """keep_in_sbp: the kept weights are named and read in place (their equations have no
    other choice); the annotated but free batch is all-gathered; an alternative that
    would split a value anew shows that apart from its time."""
    f = fflow.shard(
        mlp, PL2, in_sbp=(S(0), S(1), S(0)), out_sbp=B, profile=PROFILE,
        keep_in_sbp=(False, True, True),
    )  # fmt: skip
    golden = _golden("planner_explain_keep.txt")
    assert f.plan(*ARGS).explain() == golden
    # fflow.explain of the sharded function ends with the plan's head (totals, forced)
    head = golden.split("\nequations (")[0]
    assert str(fflow.explain(f)(*ARGS)).endswith("\nsharded call 0: " + head)
    free = fflow.shard(mlp, PL2, in_sbp=(S(0), S(1), S(0)), out_sbp=B, profile=PROFILE)
    text = free.plan(*ARGS).compare(f.plan(*ARGS))
    assert text.splitlines()[1] == "kept inputs: none vs w1, w2"


def test_explain_of_grad_names_the_derived_plans_and_their_kept_weights():
    """fflow.explain(grad(shard(...))): the primal and backward sharded calls, each with
    what it is, the kept weights it reads in place and the gradients' SBPs."""
    f = fflow.shard(
        lambda x, w1, w2: jnp.sum(mlp(x, w1, w2) ** 2), PL2, in_sbp=(B, S(1), S(0)),
        profile=PROFILE, keep_in_sbp=(False, True, True),
    )  # fmt: skip
    text = str(fflow.explain(fflow.grad(f, argnums=(1, 2)))(*ARGS))
    calls = text.split("\nsharded call ")[1:]
    assert [c.splitlines()[1].split(" (")[0] for c in calls] == [
        "the primal part of a sharded call under grad",
        "the transposed linear part of a sharded call",
    ]
    # the backward reads w2 in place (x's gradient is not asked for; w1 is not read)
    assert "= S(0), kept (keep_in_sbp: w2): read in place by eqn" in calls[1]
    assert calls[1].endswith("output 0 f32[4,16] = S(1)\n  output 1 f32[16,4] = S(0)")
