"""fflow.optim equals optax (with real JAX) to 1e-6 on the same gradient sequences."""

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp
from fflow import optim

optax = pytest.importorskip("optax")
jax = pytest.importorskip("jax")

STEPS = 6


def _params(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "w": rng.normal(size=(4, 3)).astype(np.float32),
        "b": rng.normal(size=(3,)).astype(np.float32),
    }


def _grads(seed=1):
    rng = np.random.default_rng(seed)
    return [
        {
            "w": rng.normal(size=(4, 3)).astype(np.float32),
            "b": rng.normal(size=(3,)).astype(np.float32),
        }
        for _ in range(STEPS)
    ]


def _run_fflow(tx, params, grads, jit):
    params = {k: jnp.asarray(v) for k, v in params.items()}
    state = tx.init(params)

    def step(params, state, g):
        updates, state = tx.update(g, state, params)
        return optim.apply_updates(params, updates), state

    step = fflow.jit(step) if jit else step
    out = []
    for g in grads:
        params, state = step(params, state, {k: jnp.asarray(v) for k, v in g.items()})
        out.append({k: np.asarray(v) for k, v in params.items()})
    return out


def _run_optax(tx, params, grads):
    params = {k: jax.numpy.asarray(v) for k, v in params.items()}
    state = tx.init(params)
    out = []
    for g in grads:
        updates, state = tx.update({k: jax.numpy.asarray(v) for k, v in g.items()}, state, params)
        params = optax.apply_updates(params, updates)
        out.append({k: np.asarray(v) for k, v in params.items()})
    return out


def _mask(p):
    return {"w": True, "b": False}


CASES = {
    "sgd": (lambda m: m.sgd(0.1)),
    "sgd_momentum": (lambda m: m.sgd(0.1, momentum=0.9)),
    "sgd_nesterov": (lambda m: m.sgd(0.1, momentum=0.9, nesterov=True)),
    "adam": (lambda m: m.adam(1e-2)),
    "adam_eps_root": (lambda m: m.adam(1e-2, eps_root=1e-8)),
    "adamw": (lambda m: m.adamw(1e-2, weight_decay=0.1)),
    "adamw_mask": (lambda m: m.adamw(1e-2, weight_decay=0.1, mask=_mask)),
    "lamb": (lambda m: m.lamb(1e-2, weight_decay=0.01)),
    "lion": (lambda m: m.lion(1e-3, weight_decay=0.01)),
    "rmsprop": (lambda m: m.rmsprop(1e-2)),
    "rmsprop_centered_momentum": (lambda m: m.rmsprop(1e-2, centered=True, momentum=0.9)),
    "adagrad": (lambda m: m.adagrad(0.1)),
    "clip_chain": (lambda m: m.chain(m.clip_by_global_norm(1.0), m.clip(0.3), m.adam(1e-2))),
    "schedule_adamw": (
        lambda m: m.adamw(m.warmup_cosine_decay_schedule(0.0, 1e-2, 2, 6, end_value=1e-4))
    ),
    "multi_transform": (
        lambda m: m.multi_transform({"a": m.adam(1e-2), "s": m.sgd(0.1)}, {"w": "a", "b": "s"})
    ),
    "masked": (lambda m: m.masked(m.sgd(0.1, momentum=0.5), {"w": False, "b": True})),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("jit", [False, True])
def test_matches_optax(name, jit):
    params, grads = _params(), _grads()
    got = _run_fflow(CASES[name](optim), params, grads, jit)
    want = _run_optax(CASES[name](optax), params, grads)
    for g, w in zip(got, want):
        for k in g:
            np.testing.assert_allclose(g[k], w[k], rtol=1e-6, atol=1e-6, err_msg=f"{name} {k}")


def test_multisteps_matches_optax():
    params, grads = _params(), _grads()
    got = _run_fflow(optim.MultiSteps(optim.adam(1e-2), 3), params, grads, jit=True)
    want = _run_optax(optax.MultiSteps(optax.adam(1e-2), 3), params, grads)
    for g, w in zip(got, want):
        for k in g:
            np.testing.assert_allclose(g[k], w[k], rtol=1e-6, atol=1e-6)


SCHEDULES = {
    "constant": lambda m: m.constant_schedule(0.3),
    "linear": lambda m: m.linear_schedule(1.0, 0.1, 10, transition_begin=3),
    "polynomial": lambda m: m.polynomial_schedule(1.0, 0.1, 2.0, 10),
    "cosine": lambda m: m.cosine_decay_schedule(1.0, 12, alpha=0.1, exponent=2.0),
    "warmup_cosine": lambda m: m.warmup_cosine_decay_schedule(0.0, 1.0, 5, 20, end_value=0.05),
    "exponential": lambda m: m.exponential_decay(1.0, 4, 0.5, transition_begin=2),
    "exponential_staircase_end": lambda m: m.exponential_decay(
        1.0, 3, 0.5, staircase=True, end_value=0.2
    ),
    "piecewise": lambda m: m.piecewise_constant_schedule(1.0, {4: 0.5, 9: 0.1}),
    "join": lambda m: m.join_schedules(
        [m.constant_schedule(1.0), m.linear_schedule(1.0, 0.0, 5)], [3]
    ),
}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_schedules_match_optax(name):
    ours, theirs = SCHEDULES[name](optim), SCHEDULES[name](optax)
    for count in range(25):
        np.testing.assert_allclose(
            float(ours(count)), float(theirs(count)), rtol=1e-6, atol=1e-7, err_msg=str(count)
        )
        np.testing.assert_allclose(
            float(ours(jnp.asarray(count, jnp.int32))), float(theirs(count)), rtol=1e-6, atol=1e-7
        )


def test_apply_if_finite_matches_optax():
    params, grads = _params(), _grads()
    grads[2]["w"][0, 0] = np.inf
    grads[3]["b"][1] = np.nan
    got = _run_fflow(optim.apply_if_finite(optim.adam(1e-2), 3), params, grads, jit=True)
    want = _run_optax(optax.apply_if_finite(optax.adam(1e-2), 3), params, grads)
    for g, w in zip(got, want):
        for k in g:
            np.testing.assert_allclose(g[k], w[k], rtol=1e-6, atol=1e-6)
