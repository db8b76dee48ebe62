"""fflow.example_libraries (jax.example_libraries.stax / optimizers) against independent
references: optax's optimizers on the same gradients, NumPy for the layers, and JAX's
recorded numbers in the corpus program example_libraries_mnist_style."""

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp
from fflow.example_libraries import optimizers, stax


def test_layers_match_numpy():
    init, apply = stax.serial(stax.Dense(4), stax.Relu, stax.Dense(2), stax.LogSoftmax)
    shape, params = init(fflow.random.PRNGKey(0), (-1, 3))
    assert shape == (-1, 2) and [np.shape(p[0]) if p else None for p in params] == [(3, 4), None, (4, 2), None]  # fmt: skip
    x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    (w1, b1), _, (w2, b2), _ = [tuple(np.asarray(a) for a in p) for p in params]
    h = np.maximum(x @ w1 + b1, 0) @ w2 + b2
    want = h - np.log(np.exp(h).sum(-1, keepdims=True))
    np.testing.assert_allclose(apply(params, x), want, rtol=1e-5, atol=1e-6)
    cat_init, cat_apply = stax.serial(
        stax.FanOut(2), stax.parallel(stax.Identity, stax.Tanh), stax.FanInConcat()
    )
    cat_shape, cat_params = cat_init(fflow.random.PRNGKey(1), (5, 3))
    assert cat_shape == (5, 6)
    np.testing.assert_allclose(
        cat_apply(cat_params, x), np.concatenate([x, np.tanh(x)], -1), rtol=1e-6
    )


@pytest.mark.parametrize("name", ["sgd", "momentum", "adam", "rmsprop"])
def test_optimizers_match_optax(name):
    optax = pytest.importorskip("optax")
    import fflow.compat

    ours = {"sgd": optimizers.sgd(0.1), "momentum": optimizers.momentum(0.1, 0.9),
            "adam": optimizers.adam(0.01), "rmsprop": optimizers.rmsprop(0.01, 0.9, 1e-8)}[name]  # fmt: skip
    fflow.compat.install()
    try:
        import jax  # noqa: F401  (optax on fflow)

        ref = {"sgd": optax.sgd(0.1), "momentum": optax.sgd(0.1, momentum=0.9),
               "adam": optax.adam(0.01), "rmsprop": optax.rmsprop(0.01, decay=0.9, eps=1e-8)}[name]  # fmt: skip
    finally:
        fflow.compat.uninstall()
    init, update, get_params = ours
    p = {"w": np.float32([1.0, -2.0]), "b": np.float32(0.5)}
    state, ref_state, q = init(p), ref.init(p), p
    for i in range(4):
        g = {"w": np.float32([0.3, -0.1]) * (i + 1), "b": np.float32(0.2 - i)}
        state = fflow.jit(update)(i, g, state)
        upd, ref_state = ref.update(g, ref_state, q)
        q = {k: q[k] + upd[k] for k in q}
    for k in p:
        np.testing.assert_allclose(get_params(state)[k], q[k], rtol=1e-5, atol=1e-6)


def test_update_checks_the_tree():
    init, update, _ = optimizers.sgd(0.1)
    with pytest.raises(TypeError, match="tree"):
        update(0, {"a": jnp.ones(2)}, init({"w": jnp.ones(2)}))
