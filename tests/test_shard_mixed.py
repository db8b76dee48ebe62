"""One sharded program over two placements (`with_sbp(x, sbp, placement=...)` inside
`shard`): values and gradients equal the unsharded function's for every SBP pair of
the move, the move's bytes are in the plan, and mixing placements without a move names
the user's line. MPI == simulated: tests/test_pipeline_mpi.py (same cases)."""

import os
import sys

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__))))
import pipeline_mpi_script as script  # noqa: E402

S, B = fflow.sbp.split, fflow.sbp.broadcast
A, Bpl = fflow.placement("cpu", [0, 1]), fflow.placement("cpu", [2, 3])


def plain(x, w1, w2):
    return jnp.sum(jnp.tanh(jnp.tanh(x @ w1) @ w2) ** 2)


def test_every_sbp_pair_value_and_grad_equal_unsharded():
    args = script.mixed_inputs()
    want_v, want_g = fflow.value_and_grad(plain, argnums=(0, 1, 2))(*args)
    got = script.mixed_cases()
    assert len(got) == len(script.MIXED_PAIRS) + 2
    for name, (v, *g) in got.items():
        np.testing.assert_allclose(np.asarray(v), np.asarray(want_v), rtol=1e-5, err_msg=name)
        assert v.placement.ranks in ((2, 3), (0, 1, 2, 3)), name  # the loss lives on b
        for u, w in zip(g, want_g):
            np.testing.assert_allclose(np.asarray(u), np.asarray(w), rtol=1e-4, atol=1e-6)
        assert g[0].placement == A and g[1].placement == A  # x and w1 are used on a


def test_plan_has_the_move_and_its_bytes():
    f = fflow.shard(lambda x, w1, w2: script.mixed(x, w1, w2, S(0), S(1), Bpl), A, (S(0), B, B))
    plan = f.lower(*script.mixed_inputs())
    text = str(plan)
    assert "2 segments, 1 moves" in text
    # a 4x4 float32 S(0) on [0,1] -> S(1) on [2,3]: each destination gets a 4x2 block,
    # half from each source, so 64 bytes in 4 messages
    assert plan.move_bytes == 64
    assert "4 messages, 64 B" in text
    assert plan.bytes == plan.move_bytes + sum(sp.bytes for sp in plan.segments)


def test_jit_of_a_mixed_program():
    f = fflow.shard(lambda x, w1, w2: script.mixed(x, w1, w2, S(0), B, Bpl), A, (S(0), B, B))
    args = script.mixed_inputs()
    np.testing.assert_allclose(np.asarray(fflow.jit(f)(*args)), np.asarray(plain(*args)), rtol=1e-5)


def test_two_placements_without_a_move_names_the_line():
    def f(x, w):
        h = fflow.with_sbp(x, B, placement=Bpl)
        g = fflow.with_sbp(w, B, placement=fflow.placement("cpu", [1]))
        return h + g  # h is on [2,3], g on [1]

    x = np.ones((2, 2), np.float32)
    with pytest.raises(ValueError, match=r"two placements.*with_sbp") as info:
        fflow.shard(f, A)(x, x)
    assert "test_shard_mixed.py" in str(info.value)


def test_memory_limit_with_moves_says_so():
    f = fflow.shard(
        lambda x, w1, w2: script.mixed(x, w1, w2, S(0), B, Bpl), A, (S(0), B, B), memory_limit=1e9
    )
    with pytest.raises(ValueError, match="memory_limit is not supported"):
        f(*script.mixed_inputs())
