"""fflow.test_util.check_grads itself: it passes on correct derivatives and fails on
wrong first- or second-order ones, in forward and in reverse mode."""

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp
from fflow import lax
from fflow.test_util import check_grads

X = (np.array([0.3, -0.8, 1.4]),)


def _sin_with_rule(rule):
    @fflow.custom_jvp
    def f(x):
        return jnp.sin(x)

    f.defjvps(rule)
    return f


def test_passes_on_correct_derivatives_to_third_order():
    check_grads(lambda x: jnp.sin(x) * jnp.exp(x), X, order=3)
    check_grads(_sin_with_rule(lambda t, ans, x: t * jnp.cos(x)), X, order=3)


def test_catches_a_wrong_first_derivative_in_both_modes():
    wrong = _sin_with_rule(lambda t, ans, x: 1.01 * t * jnp.cos(x))
    with pytest.raises(AssertionError, match="JVP"):
        check_grads(wrong, X, order=1, modes=("fwd",))
    with pytest.raises(AssertionError, match="VJP"):
        check_grads(wrong, X, order=1, modes=("rev",))


def test_catches_a_wrong_second_derivative_only_at_order_two():
    # right first derivative, but its own derivative is dropped by stop_gradient
    f = _sin_with_rule(lambda t, ans, x: t * lax.stop_gradient(jnp.cos(x)))
    check_grads(f, X, order=1)
    with pytest.raises(AssertionError):
        check_grads(f, X, order=2, modes=("fwd",))
    with pytest.raises(AssertionError):
        check_grads(f, X, order=2, modes=("rev",))


def test_catches_a_wrong_custom_vjp():
    @fflow.custom_vjp
    def f(x):
        return x * x

    f.defvjp(lambda x: (f(x), x), lambda x, g: (2.02 * x * g,))
    with pytest.raises(AssertionError, match="VJP"):
        check_grads(f, X, order=1, modes=("rev",))


def test_pytrees_float32_and_integer_arguments():
    def f(d, n):
        return {"y": jnp.tanh(d["a"]) * d["b"] * n, "z": (d["a"] ** 2,)}

    d = {"a": np.array([0.5, -1.0], np.float32), "b": np.array([2.0, 0.25], np.float32)}
    check_grads(f, (d, np.int32(3)), order=2)
    check_grads(f, (d, 3), order=1, atol=1e-2, rtol=1e-2, eps=1e-2)


def test_rejects_unknown_modes():
    with pytest.raises(ValueError, match="modes"):
        check_grads(jnp.sin, X, order=1, modes=("forward",))
