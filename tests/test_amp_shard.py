"""shard(amp(...)): a data-parallel AMP step on simulated devices gives the numbers
of the unsharded AMP step, and AMP's casts do not change any value's SBP."""

import re

import numpy as np
import pytest
from test_amp import as_np, loss_fn, make_mlp

import fflow


def _placement_and_sbp():
    return fflow.placement("cpu", [0, 1]), fflow.sbp.split, fflow.sbp.broadcast


@pytest.mark.parametrize("policy", ["bf16", "fp16"])
def test_sharded_data_parallel_amp_step_matches_unsharded(policy):
    params, x, y = make_mlp(seed=0, n=16)
    pl, S, B = _placement_and_sbp()
    step = fflow.amp(fflow.value_and_grad(loss_fn), policy)
    loss_ref, grads_ref = step(params, x, y)
    sharded = fflow.shard(step, pl, in_sbp=(B, S(0), S(0)))
    loss, grads = sharded(params, x, y)
    np.testing.assert_allclose(np.asarray(loss), float(loss_ref), rtol=1e-5)
    ulp = 2.0**-7 if policy == "bf16" else 2.0**-10  # one unit in the last place
    for k, g in grads.items():
        assert np.asarray(g).dtype == np.float32, k
        ref = as_np(grads_ref[k])
        # the partial sums are reduced in fp32 before AMP rounds the result, so the
        # only differences come from the fp32 summation order: within one
        # low-precision ulp of the gradient's scale
        np.testing.assert_allclose(
            as_np(np.asarray(g)), ref, rtol=ulp, atol=ulp * np.abs(ref).max()
        )


def test_amp_casts_keep_the_sbp_of_their_input():
    params, x, y = make_mlp(seed=0, n=16)
    pl, S, B = _placement_and_sbp()
    sharded = fflow.shard(
        fflow.amp(fflow.value_and_grad(loss_fn), "bf16"), pl, in_sbp=(B, S(0), S(0))
    )
    text = str(sharded.plan(params, x, y))
    sbp_of = {}
    for name, sbp in re.findall(r"\b([a-z]+):[a-z0-9]+\[[0-9,]*\]\{([^}]*)\}", text):
        sbp_of[name] = sbp
    casts = re.findall(
        r"\b([a-z]+):bf16\[[0-9,]*\]\{([^}]*)\} = convert_element_type\[[^\]]*\] ([a-z]+)", text
    )
    assert casts, text
    for out, sbp, src in casts:
        if src in sbp_of:
            assert sbp_of[src] == sbp, (out, src, sbp_of[src], sbp)


def test_jit_of_sharded_amp_step_and_grad_of_sharded_amp_loss():
    params, x, y = make_mlp(seed=0, n=16)
    pl, S, B = _placement_and_sbp()
    step = fflow.amp(fflow.value_and_grad(loss_fn), "bf16")
    loss_ref, grads_ref = step(params, x, y)
    loss, grads = fflow.jit(fflow.shard(step, pl, in_sbp=(B, S(0), S(0))))(params, x, y)
    np.testing.assert_allclose(np.asarray(loss), float(loss_ref), rtol=1e-5)
    sharded_loss = fflow.shard(fflow.amp(loss_fn, "bf16"), pl, in_sbp=(B, S(0), S(0)))
    grads2 = fflow.grad(lambda p: sharded_loss(p, x, y))(params)
    for k, ref in grads_ref.items():
        ref = as_np(ref)
        for g in (grads[k], grads2[k]):
            np.testing.assert_allclose(
                as_np(np.asarray(g)), ref, rtol=2.0**-7, atol=2.0**-7 * np.abs(ref).max()
            )


def test_loss_scaled_fp16_step_under_shard():
    params, x, y = make_mlp(seed=0, n=16)
    pl, S, B = _placement_and_sbp()

    def step(params, ls, x, y):
        f = fflow.amp.scaled_value_and_grad(fflow.amp(loss_fn, "fp16"))
        loss, grads, finite = f(ls, params, x, y)
        new = {k: params[k] - 0.1 * grads[k] for k in params}
        return fflow.amp.select_tree(finite, new, params), ls.adjust(finite), loss

    ls = fflow.amp.DynamicLossScale(loss_scale=2.0**10, period=1)
    p_ref, ls_ref, loss_ref = step(params, ls, x, y)
    p, ls_out, loss = fflow.shard(step, pl, in_sbp=(B, B, S(0), S(0)))(params, ls, x, y)
    np.testing.assert_allclose(np.asarray(loss), float(loss_ref), rtol=1e-5)
    # the scale state is replicated (B) and follows the same schedule: grown after 1 step
    assert float(np.asarray(ls_out.loss_scale)) == float(ls_ref.loss_scale) == 2.0**11
    assert int(np.asarray(ls_out.counter)) == int(ls_ref.counter) == 0
    for k, ref in p_ref.items():
        np.testing.assert_allclose(as_np(np.asarray(p[k])), as_np(ref), rtol=1e-3, atol=1e-5)
