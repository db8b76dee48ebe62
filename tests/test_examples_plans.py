"""The plans the sharded examples get from their annotations alone (no `with_sbp` hint
anywhere in examples/), at small sizes, planning only (tests/test_examples.py and
tests/test_shard_mpi.py run them and check their values):

- tensor_parallel.py: Megatron's MLP block, one all-reduce of the block output (1-D
  and 2x2, where it runs within each model group on half the batch); its gradient
  needs that one all-reduce and leaves both weights' gradients split as the weights.
- data_parallel.py: one all-reduce per gradient (and the loss), no other traffic,
  all in one gradient bucket.
- gpt_chars.py (1 layer at its default width): every matmul of the blocks split over
  all 4 devices; the tied output layer's (vocabulary 40) over the data axis at least.
- pipeline_parallel.py plans no SBP (one device per stage; tests/test_pipeline*.py).
"""

import pathlib
import re
import sys
from collections import Counter

import numpy as np
import pytest
from fflow.transforms.shard_buckets import plan_buckets
from fflow.transforms.shard_cost import work_share

import fflow

ROOT = pathlib.Path(__file__).resolve().parent.parent
S, B = fflow.sbp.split, fflow.sbp.broadcast
LOCAL = ("shard_slice", "shard_pad", "keep_one")  # boxing without messages


@pytest.fixture(scope="module")
def examples():
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import data_parallel
        import gpt_chars
        import tensor_parallel

        yield tensor_parallel, data_parallel, gpt_chars
    finally:
        sys.path.remove(str(ROOT / "examples"))


def _moves(sp):
    """(value shape, from, to, collectives) of every conversion that sends bytes."""
    return [(v.aval.shape, h, w, bp.collectives()) for _, v, h, w, bp in sp.boxings() if bp.bytes]


def test_no_example_hints_the_planner():
    hinted = [
        p.name
        for p in (ROOT / "examples").glob("*.py")
        if re.search(r"\bwith_sbp\(", p.read_text())
    ]
    assert hinted == []


def test_tensor_parallel_gets_megatron(examples):
    tp = examples[0]
    rng = np.random.default_rng(0)
    b, d = 8, 16
    x = rng.normal(size=(b, d)).astype(np.float32)
    w1, w2 = rng.normal(size=(d, 4 * d)).astype(np.float32), rng.normal(size=(4 * d, d))
    w2 = w2.astype(np.float32)
    line = fflow.placement("cpu", [0, 1, 2, 3])
    cols, rows = tp.own_slice(w1, line, S(1)), tp.own_slice(w2, line, S(0))
    fwd = fflow.shard(tp.mlp_block, line, in_sbp=(None, S(1), S(0))).plan(x, cols, rows)
    assert _moves(fwd) == [((b, d), (fflow.sbp.partial_sum,), (B,), ["all_reduce"])]
    grad = fflow.grad(tp.block_loss, argnums=(0, 1))
    g = fflow.shard(grad, line, in_sbp=(S(1), S(0), B)).plan(cols, rows, x)
    # the loss needs the block output whole; no gradient needs anything (x gets none)
    assert [m[3] for m in _moves(g)] == [["all_reduce"]] and _moves(g)[0][0] == (b, d)
    assert g.out_sbps == [(S(1),), (S(0),)]
    mesh = fflow.placement("cpu", [[0, 1], [2, 3]])
    sbps = ((S(0), B), (B, S(1)), (B, S(0)))
    f2 = fflow.shard(tp.mlp_block, mesh, in_sbp=sbps, out_sbp=(S(0), B)).plan(x, w1, w2)
    P = fflow.sbp.partial_sum
    assert _moves(f2) == [((b, d), (S(0), P), (S(0), B), ["all_reduce"])]


def test_data_parallel_all_reduces_each_gradient_once_in_one_bucket(examples):
    dp = examples[1]
    from _common import load_digits_split

    (x, y), _ = load_digits_split(test_fraction=0.0)
    params = fflow.nn.MLP(64, 10, width_size=16, depth=1, key=fflow.random.PRNGKey(0))
    line = fflow.placement("cpu", [0, 1, 2, 3])
    step = fflow.shard(dp.train_step, line, in_sbp=(B, S(0), S(0)), out_sbp=B)
    sp = step.plan(params, x[:32], y[:32])
    shapes = sorted(np.shape(p) for p in fflow.tree_util.tree_flatten(params)[0])
    moves = _moves(sp)
    assert all(m[1:] == ((fflow.sbp.partial_sum,), (B,), ["all_reduce"]) for m in moves), moves
    assert sorted(m[0] for m in moves) == sorted([*shapes, ()])  # the gradients and the loss
    (bucket,) = plan_buckets(sp.local_program(0))
    assert len(bucket.members) == len(moves)


def test_gpt_chars_splits_the_blocks_matmuls_over_the_whole_mesh(examples):
    gc = examples[2]
    mesh = fflow.placement("cpu", [[0, 1], [2, 3]])
    vocab, d, heads, context, batch = 40, 128, 4, 64, 32  # the defaults, 1 layer
    model = gc.GPT(vocab, d, heads, 1, context, key=fflow.random.PRNGKey(0), tp=True)
    tx = gc.make_optimizer(6, 3e-3, 1)
    step, _ = gc.build_step(tx, mesh, model, amp=True)
    sbp = fflow.nn.sbp_of(model)
    opt = gc.place(tx.init(model), fflow.optim.state_sbp(tx, model, sbp, mesh), mesh)
    model = gc.place(model, sbp, mesh)
    ids = fflow.to_global(np.zeros((batch, context + 1), np.int32), mesh, (S(0), B))
    sp = step.plan(model, opt, ids)
    shares = Counter(
        (any(vocab in v.aval.shape for v in e.inputs), work_share(e, sig, mesh.hierarchy))
        for e, sig in zip(sp.exec_program.eqns, sp.plan.eqn_sigs)
        if e.primitive.name == "dot_general"
    )
    blocks = [share for (output_layer, share) in shares if not output_layer]
    assert blocks == [0.25], shares
    # the output layer (logits and their input gradient): since the loss's
    # take_along_axis keeps the batch split, the cost model runs it on the data split
    # beside Megatron blocks rather than all-gather its (32, 64, 128) input gradient
    # (10.67 ms modelled vs 10.90 for the previous all-1/4 plan); the tiny size runs it
    # whole
    assert all(share <= 0.5 for (output_layer, share) in shares if output_layer), shares
