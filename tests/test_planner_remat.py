"""`checkpoint` inside `shard`: grad recomputes the block instead of saving its
intermediates (fewer residual bytes between the known and the linear program), with
the gradients of the unsharded function."""

import numpy as np

import fflow
import fflow.numpy as jnp
from fflow.sharding import B, S

PL2 = fflow.placement("cpu", [0, 1])


def block(w, x):
    for _ in range(3):
        x = jnp.tanh(x @ w)
    return x


def loss_plain(w, x):
    return jnp.sum(block(w, x) ** 2)


def loss_ck(w, x):
    return jnp.sum(fflow.checkpoint(block)(w, x) ** 2)


def _residual_bytes(sharded, *args):
    sp = sharded.plan(*args)
    (jsp,) = [v for k, v in sp.derived.items() if k[0] == "jvp"]
    (hit,) = [v for k, v in jsp.derived.items() if k[0] == "pe"]
    usp, n_res = hit[1], hit[3]
    return sum(
        int(np.prod(v.aval.shape)) * v.aval.dtype.itemsize for v in usp.program.invars[:n_res]
    )


def test_checkpoint_under_shard_lowers_residual_bytes_same_gradients():
    rng = np.random.default_rng(0)
    w = (rng.normal(size=(16, 16)) * 0.3).astype(np.float32)
    x = rng.normal(size=(8, 16)).astype(np.float32)
    ref_w, ref_x = fflow.grad(loss_plain, argnums=(0, 1))(w, x)
    sizes = {}
    for fn in (loss_plain, loss_ck):
        f = fflow.shard(fn, PL2, in_sbp=(B, S(0)))
        gw, gx = fflow.grad(f, argnums=(0, 1))(w, x)
        np.testing.assert_allclose(np.asarray(gw), np.asarray(ref_w), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(gx), np.asarray(ref_x), rtol=1e-5, atol=1e-6)
        sizes[fn.__name__] = _residual_bytes(f, w, x)
    # saved: the block's inputs (w, x) and the output it needs, not all three tanh layers
    assert sizes["loss_ck"] < sizes["loss_plain"]
