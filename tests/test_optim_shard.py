"""Optimizer state under shard: sharded like its parameter (or ZeRO-split) gives the
unsharded numbers, on simulated devices and on 2 and 4 MPI ranks; so does
`optim.mixed_precision` (loss scale in the state), whose overflowed step is skipped on
every device. The reference is JAX + optax."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from mpi_util import mpi_available

import fflow
import fflow.numpy as jnp
from fflow import optim
from fflow.sharding import B, S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import optim_shard_script as script  # noqa: E402

sys.path.pop(0)


def _optax_reference(skip=None):
    """The same steps with JAX and optax (an independent implementation); without step
    `skip` when given (what a skipped overflow step must leave)."""
    jax = pytest.importorskip("jax")
    optax = pytest.importorskip("optax")
    jnp_ = jax.numpy
    params, x, y = script.init()
    params = {k: jnp_.asarray(np.asarray(v)) for k, v in params.items()}

    def loss_fn(p, x, y):
        h = jnp_.tanh(x @ p["w1"] + p["b1"])
        return jnp_.mean((h @ p["w2"] + p["b2"] - y) ** 2)

    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2, weight_decay=0.1))
    state, losses = tx.init(params), []
    for i in range(script.STEPS):
        if i == skip:
            continue
        loss, g = jax.value_and_grad(loss_fn)(params, x[i], y[i])
        u, state = tx.update(g, state, params)
        params = optax.apply_updates(params, u)
        losses.append(float(loss))
    return losses, {k: np.asarray(v) for k, v in params.items()}


def _check_mixed(runs):
    """Every mixed-precision run: optax's steps without the overflowed one, and the loss
    scale of a NumPy re-implementation of the rule (x2 after 2 finite steps, /2 on inf)."""
    ref_losses, ref_params = _optax_reference(skip=script.BAD)
    scales, scale, good = [], 2.0**10, 0
    for i in range(script.STEPS):
        if i == script.BAD:
            scale, good = scale / 2, 0
        elif good + 1 >= 2:
            scale, good = scale * 2, 0
        else:
            good += 1
        scales.append(scale)
    for name, (losses, params, got_scales, skipped) in runs.items():
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, err_msg=name)
        for k in ref_params:
            np.testing.assert_allclose(params[k], ref_params[k], rtol=1e-5, atol=1e-6, err_msg=name)
        assert got_scales == scales, (name, got_scales, scales)
        assert skipped == 1, name


def _check(out):
    _check_mixed(out.pop("mixed"))
    ref_losses, ref_params = _optax_reference()
    # fflow's own unsharded run equals optax's
    losses, params = out.pop("reference")
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)
    for k in ref_params:
        np.testing.assert_allclose(params[k], ref_params[k], rtol=1e-6, atol=1e-6, err_msg=k)
    plain = out.pop("state_bytes_zero=False")
    _check_zero_bytes(plain, out.pop("state_bytes_zero=True"))
    _check_zero_bytes(plain, out.pop("state_bytes_adamw(zero=True)"))
    for name, (losses, params) in out.items():
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, err_msg=name)
        for k in ref_params:
            np.testing.assert_allclose(params[k], ref_params[k], rtol=1e-5, atol=1e-6, err_msg=name)


def _check_zero_bytes(plain, zero):
    """ZeRO: each device holds 1/n of Adam's mu and nu (every dim here divides by n);
    the step count and clip state stay whole. The expected bytes come from the shapes."""
    (plain_bytes, n), (zero_bytes, _) = plain, zero
    params, _, _ = script.init()
    moments = 2 * sum(np.asarray(p).nbytes for p in params.values())  # mu and nu, float32
    scalars = plain_bytes - moments
    assert scalars >= 0
    assert zero_bytes == moments // n + scalars
    assert zero_bytes < plain_bytes


def test_sharded_state_equals_unsharded_simulated():
    _check(script.main())


def test_state_takes_param_sbp_and_zero_splits_it():
    pl = fflow.placement("cpu", [0, 1])
    params, _, _ = script.init()
    sbp = {"w1": S(1), "b1": S(0), "w2": S(0), "b2": B}
    fn, params, x, y, state_sbp = script.sharded(pl, sbp, S(0), zero=False)
    _, _, state = script.run(fn, params, x, y)
    adam = state[1][0]
    assert adam.mu["w1"].sbp == (S(1),) and adam.nu["b2"].sbp == (B,)
    assert adam.count.sbp == (B,)
    fn, params, x, y, _ = script.sharded(pl, {k: B for k in params}, S(0), zero=True)
    _, _, state = script.run(fn, params, x, y)
    adam = state[1][0]
    assert adam.mu["w1"].sbp == (S(0),) and adam.mu["b2"].sbp == (S(0),)
    assert adam.mu["w1"].to_local_shards()[0].shape == (4, 16)  # half of it per device


def test_init_on_global_params_keeps_their_sbp():
    pl = fflow.placement("cpu", [0, 1])
    w = fflow.to_global(jnp.ones((4, 6)), pl, S(1))
    state = optim.adam(1e-3).init({"w": w})
    assert state[0].mu["w"].sbp == (S(1),) and state[0].nu["w"].sbp == (S(1),)


@pytest.mark.skipif(not mpi_available(), reason="no mpi4py/mpiexec")
@pytest.mark.parametrize("n", [2, 4])
def test_sharded_state_on_mpi_ranks(n):
    env = {k: v for k, v in os.environ.items() if k != "FFLOW_RUNTIME"}
    cmd = [
        sys.executable,
        "-m",
        "fflow.launch",
        "-n",
        str(n),
        os.path.join(ROOT, "tests", "optim_shard_script.py"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    out = json.loads(line[len("RESULT ") :])
    assert ("dp_x_tp" in out) == (n == 4) == ("dp_x_tp" in out["mixed"])
    _check(out)


def test_global_norm_of_split_leaves_is_one_all_reduce():
    """clip_by_global_norm under shard: the per-leaf partial sums of squares add up as
    partial sums and the planner reduces once, not once per leaf."""
    rng = np.random.default_rng(3)
    tree = {k: rng.normal(size=(8, 4)).astype(np.float32) for k in "abcdef"}
    mesh = fflow.placement("cpu", [[0, 1], [2, 3]])
    sbp = {k: (S(0), S(1)) for k in tree}
    norm = fflow.shard(optim.global_norm, mesh, in_sbp=(sbp,), out_sbp=(B, B))
    plan = norm.plan(tree)
    assert plan.collectives().count("all_reduce") == 1, plan
    want = np.sqrt(sum(np.sum(v.astype(np.float64) ** 2) for v in tree.values()))
    np.testing.assert_allclose(float(norm(tree)), want, rtol=1e-6)
