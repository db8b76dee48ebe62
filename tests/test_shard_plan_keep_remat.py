"""`shard(..., keep_in_sbp=)` through `checkpoint`: a 2-layer transformer whose layers
are checkpointed, Megatron-annotated weights kept. Kept weights stay in their SBPs in
every program grad derives (known, linear, transpose: the recomputation reads them as
residuals), the gradients come back in the annotated SBPs, the values equal the
unsharded `value_and_grad`, and checkpoint still saves fewer residual bytes."""

import pytest
from shard_plan_keep_script import check_remat, placements, pm, run_remat, sharded_loss

import fflow

PARTIAL = fflow.sbp.partial_sum


@pytest.mark.parametrize("mesh", ["1d", "2x2"])
def test_checkpointed_kept_weights_gradients_in_their_sbp_equal_unsharded(mesh):
    # (on fflow.launch -n 2 and -n 4: test_shard_plan_keep.py's launches check it too)
    check_remat(run_remat(placements()[mesh]))


def _programs(sp):
    """`sp` and every sharded program grad derived from it (jvp, known, linear, transpose)."""
    out = [sp]
    for d in getattr(sp, "derived", {}).values():
        for x in d if isinstance(d, tuple) else (d,):
            if hasattr(x, "plan_options"):
                out += _programs(x)
    return out


def _residual_bytes(sp):
    (jsp,) = [v for k, v in sp.derived.items() if k[0] == "jvp"]
    (hit,) = [v for k, v in jsp.derived.items() if k[0] == "pe"]
    return sum(v.aval.size * v.aval.dtype.itemsize for v in hit[1].program.invars[: hit[3]])


@pytest.mark.parametrize("mesh", ["1d", "2x2"])
def test_checkpoint_reads_kept_weights_in_place_and_saves_fewer_residuals(mesh):
    """At b,t,d = 8,512,512 (planning only), where a free plan would all-gather the split
    weights: with the weights read as residuals by the recomputation left free, the
    transpose gathered 24 of them; kept, no weight moves in any program (on 2x2 only
    the weight gradients are all-reduced over the data axis)."""
    pl = placements()[mesh]
    b, t, d = 8, 512, 512
    params, (x, y) = pm.init(2, d), pm.data(b, t, d)
    weights = {w.shape for p in params for w in p.values() if w.ndim == 2}
    res = {}
    for remat in (True, False):
        f, _ = sharded_loss(pl, d, remat=remat)
        fflow.make_jaxpr(fflow.grad(f))(params, x, y)  # plans every derived program
        sp = f.plan(params, x, y)
        progs = _programs(sp)
        names = [p.name for p in progs]
        assert {"jvp", "known", "linear", "transpose"} <= set(names), names
        for p in progs:
            kept = {p.exec_program.invars[i] for i in p.plan.problem.kept}
            moved = [(v, h, bp.collectives()) for _, v, h, _, bp in p.boxings() if bp.bytes]
            assert not [m for m in moved if m[0] in kept], p.name
            # a weight-shaped value moves only as a gradient being summed (2x2: over the
            # data axis), never as a weight being gathered
            weight_moves = [m for m in moved if m[0].aval.shape in weights]
            assert all(PARTIAL in m[1] for m in weight_moves), (p.name, weight_moves)
        transpose = next(p for p in progs if p.name == "transpose")
        # weights read from kept inputs/residuals: the kept names reach the transpose
        assert len(transpose.plan.problem.kept) >= 12
        res[remat] = _residual_bytes(sp)
    # saved: each layer's input, not its attention probabilities and MLP activations
    assert res[True] < res[False] / 10, res
