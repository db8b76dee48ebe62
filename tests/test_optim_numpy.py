"""fflow.optim vs NumPy re-implementations of each update formula (float64 references)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fflow
import fflow.numpy as jnp
from fflow import optim

STEPS = 5


def _seq(seed, shape=(3, 4)):
    rng = np.random.default_rng(seed)
    p0 = rng.normal(size=shape).astype(np.float32)
    gs = [rng.normal(size=shape).astype(np.float32) for _ in range(STEPS)]
    return p0, gs


def _run(tx, p0, gs):
    p = jnp.asarray(p0)
    state = tx.init(p)
    out = []
    for g in gs:
        u, state = tx.update(jnp.asarray(g), state, p)
        p = optim.apply_updates(p, u)
        out.append(np.asarray(p, np.float64))
    return out


def np_sgd(p, gs, lr, momentum=None, nesterov=False):
    p, t, out = p.astype(np.float64), 0.0, []
    for g in gs:
        if momentum is None:
            u = g
        else:
            t = g + momentum * t
            u = g + momentum * t if nesterov else t
        p = p - lr * u
        out.append(p)
    return out


def np_adam(p, gs, lr, b1=0.9, b2=0.999, eps=1e-8, wd=0.0, lamb=False):
    p, m, v, out = p.astype(np.float64), 0.0, 0.0, []
    for t, g in enumerate(gs, 1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        u = (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps) + wd * p
        if lamb:
            pn, un = np.linalg.norm(p), np.linalg.norm(u)
            u = u * (pn / un if pn > 0 and un > 0 else 1.0)
        p = p - lr * u
        out.append(p)
    return out


def np_lion(p, gs, lr, b1=0.9, b2=0.99, wd=1e-3):
    p, m, out = p.astype(np.float64), 0.0, []
    for g in gs:
        u = np.sign((1 - b1) * g + b1 * m) + wd * p
        m = b2 * m + (1 - b2) * g
        p = p - lr * u
        out.append(p)
    return out


def np_rmsprop(p, gs, lr, decay=0.9, eps=1e-8, centered=False):
    p, mu, nu, out = p.astype(np.float64), 0.0, 0.0, []
    for g in gs:
        nu = decay * nu + (1 - decay) * g * g
        mu = decay * mu + (1 - decay) * g
        denom = nu - mu * mu if centered else nu
        p = p - lr * g / np.sqrt(denom + eps)
        out.append(p)
    return out


def np_adagrad(p, gs, lr, init=0.1, eps=1e-7):
    p, s, out = p.astype(np.float64), init, []
    for g in gs:
        s = s + g * g
        p = p - lr * g / np.sqrt(s + eps)
        out.append(p)
    return out


CASES = [
    ("sgd", optim.sgd(0.1), lambda p, g: np_sgd(p, g, 0.1)),
    ("momentum", optim.sgd(0.1, 0.9), lambda p, g: np_sgd(p, g, 0.1, 0.9)),
    ("nesterov", optim.sgd(0.1, 0.9, True), lambda p, g: np_sgd(p, g, 0.1, 0.9, True)),
    ("adam", optim.adam(1e-2), lambda p, g: np_adam(p, g, 1e-2)),
    ("adamw", optim.adamw(1e-2, weight_decay=0.1), lambda p, g: np_adam(p, g, 1e-2, wd=0.1)),
    (
        "lamb",
        optim.lamb(1e-2, weight_decay=0.1),
        lambda p, g: np_adam(p, g, 1e-2, eps=1e-6, wd=0.1, lamb=True),
    ),
    ("lion", optim.lion(1e-2), lambda p, g: np_lion(p, g, 1e-2)),
    ("rmsprop", optim.rmsprop(1e-2), lambda p, g: np_rmsprop(p, g, 1e-2)),
    (
        "rmsprop_c",
        optim.rmsprop(1e-2, centered=True),
        lambda p, g: np_rmsprop(p, g, 1e-2, centered=True),
    ),
    ("adagrad", optim.adagrad(0.1), lambda p, g: np_adagrad(p, g, 0.1)),
]


@pytest.mark.parametrize("name,tx,ref", CASES, ids=[c[0] for c in CASES])
def test_optimizer_vs_numpy(name, tx, ref):
    p0, gs = _seq(0)
    for got, want in zip(_run(tx, p0, gs), ref(p0, [g.astype(np.float64) for g in gs])):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


@settings(max_examples=20, deadline=None)
@given(
    st.lists(st.floats(-5, 5, width=32), min_size=1, max_size=6),
    st.floats(0.1, 3.0),
)
def test_clip_by_global_norm_vs_numpy(values, max_norm):
    g = np.asarray(values, np.float32)
    tree = {"a": jnp.asarray(g), "b": jnp.asarray(2 * g[:1])}
    out, _ = optim.clip_by_global_norm(max_norm).update(tree, optim.EmptyState())
    norm = np.sqrt(np.sum(g.astype(np.float64) ** 2) + 4 * g[0] ** 2)
    factor = 1.0 if norm < max_norm else max_norm / norm
    np.testing.assert_allclose(np.asarray(out["a"]), g * factor, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out["b"]), 2 * g[:1] * factor, rtol=1e-5, atol=1e-6)


def test_multisteps_is_the_mean_of_k_gradients():
    p0, gs = _seq(3)
    tx = optim.MultiSteps(optim.sgd(0.5), every_k_schedule=2)
    got = _run(tx, p0, gs)
    p = p0.astype(np.float64)
    for i in range(0, 4, 2):
        np.testing.assert_allclose(got[i], p, rtol=1e-6)  # no update on the mini step
        p = p - 0.5 * (gs[i] + gs[i + 1]) / 2
        np.testing.assert_allclose(got[i + 1], p, rtol=1e-5, atol=1e-6)


def test_masked_and_decay_mask():
    params = {"w": jnp.ones(2), "b": jnp.ones(2)}
    grads = {"w": jnp.zeros(2), "b": jnp.zeros(2)}
    tx = optim.add_decayed_weights(0.5, mask={"w": True, "b": False})
    u, _ = tx.update(grads, tx.init(params), params)
    assert u["w"].tolist() == [0.5, 0.5] and u["b"].tolist() == [0.0, 0.0]


def test_multi_transform_unknown_label_says_which():
    tx = optim.multi_transform({"a": optim.sgd(1.0)}, {"w": "a", "b": "zz"})
    with pytest.raises(ValueError, match="zz"):
        tx.init({"w": jnp.ones(1), "b": jnp.ones(1)})


def test_chain_state_mismatch_is_a_clear_error():
    tx = optim.chain(optim.sgd(1.0), optim.clip(1.0))
    with pytest.raises(ValueError, match="chain"):
        tx.update(jnp.ones(1), (optim.EmptyState(),), jnp.ones(1))


def test_grad_through_an_update_vs_finite_differences():
    # meta-gradient: d/d(lr) of the loss after one momentum-SGD step
    p0 = jnp.array([1.0, -2.0])

    def after_step(lr):
        tx = optim.sgd(lr, momentum=0.9)
        g = 2 * p0
        u, _ = tx.update(g, tx.init(p0), p0)
        return jnp.sum(optim.apply_updates(p0, u) ** 2)

    eps = 1e-3
    fd = (after_step(0.1 + eps) - after_step(0.1 - eps)) / (2 * eps)
    np.testing.assert_allclose(float(fflow.grad(after_step)(0.1)), float(fd), rtol=1e-3)


def test_vmap_over_a_batch_of_models():
    tx = optim.adam(1e-2)
    ps = jnp.asarray(np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32))
    gs = jnp.asarray(np.random.default_rng(1).normal(size=(3, 4)).astype(np.float32))

    def one(p, g):
        u, _ = tx.update(g, tx.init(p), p)
        return optim.apply_updates(p, u)

    batched = fflow.vmap(one)(ps, gs)
    for i in range(3):
        np.testing.assert_allclose(np.asarray(batched[i]), np.asarray(one(ps[i], gs[i])), rtol=1e-6)
