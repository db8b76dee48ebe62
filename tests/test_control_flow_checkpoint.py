"""checkpoint inside scan: the residuals saved per iteration shrink to the carry."""

import numpy as np
from fflow.transforms import autodiff as ad

import fflow
import fflow.numpy as jnp
from fflow import lax

H, N = 32, 20
rng = np.random.default_rng(0)
W = rng.standard_normal((H, H)).astype(np.float32) / 8
XS = rng.standard_normal((N, H)).astype(np.float32)


def cell(w, h, x):
    a = w @ h + x
    b = jnp.tanh(a)
    c = jnp.sin(b) * b
    d = jnp.exp(-c * c)
    return d + 0.5 * h


def loss(w, remat):
    step_cell = fflow.checkpoint(cell) if remat else cell

    def step(h, x):
        return step_cell(w, h, x), None

    h, _ = lax.scan(step, jnp.zeros(H, np.float32), XS)
    return jnp.sum(h)


def per_step_residual_bytes(remat):
    """Bytes of the linearized program's residuals that are stacked per iteration
    (leading axis N), not counting the scanned-over input XS itself."""
    _, program = ad.linearize_flat(lambda w: [loss(w, remat)], [W])
    total = 0
    for c in program.consts:
        c = np.asarray(c)
        if c.ndim >= 1 and c.shape[0] == N and not (c.shape == XS.shape and np.array_equal(c, XS)):
            total += c.nbytes
    return total


def test_checkpointed_scan_body_saves_only_the_carry_per_step():
    plain = per_step_residual_bytes(remat=False)
    remat = per_step_residual_bytes(remat=True)
    carry_bytes = N * H * 4
    assert remat == carry_bytes  # one f32[N, H] stack: the carry at each step
    assert plain >= 4 * carry_bytes  # every intermediate of the cell, per step


def test_checkpointed_scan_gradients_match():
    g_plain = fflow.grad(loss)(W, False)
    g_remat = fflow.grad(loss)(W, True)
    np.testing.assert_allclose(np.asarray(g_remat), np.asarray(g_plain), rtol=1e-5, atol=1e-6)
    g_jit = fflow.jit(fflow.grad(loss), static_argnums=1)(W, True)
    np.testing.assert_allclose(np.asarray(g_jit), np.asarray(g_plain), rtol=1e-5, atol=1e-6)


def test_loop_invariant_residuals_are_not_stacked():
    def loss_t(w):
        def step(h, x):
            wt = w.T * 2.0  # depends only on the loop's consts
            return jnp.tanh(h @ wt + x), None

        return jnp.sum(lax.scan(step, jnp.zeros(H, np.float32), XS)[0])

    _, program = ad.linearize_flat(lambda w: [loss_t(w)], [W])
    shapes = [np.shape(c) for c in program.consts]
    assert (N, H, H) not in shapes  # not one copy of w.T per step
    assert shapes.count((H, H)) >= 1
    g = fflow.grad(loss_t)(W)
    eps = 1e-2
    e = np.zeros_like(W)
    e[1, 2] = eps
    num = (float(loss_t(W + e)) - float(loss_t(W - e))) / (2 * eps)
    np.testing.assert_allclose(float(g[1, 2]), num, rtol=2e-2, atol=1e-3)
