"""fflow.debug.print under jit/vmap/grad, and debug_nans naming the user's line."""

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp
from fflow.debug import NanError


def test_print_under_jit_runs_at_call_time(capsys):
    @fflow.jit
    def f(x):
        fflow.debug.print("x = {}", x)
        return x * 2

    f(jnp.arange(3.0))
    f(jnp.arange(3.0) + 1)
    out = capsys.readouterr().out.splitlines()
    assert out == ["x = [0. 1. 2.]", "x = [1. 2. 3.]"]


def test_print_of_a_dead_value_is_kept(capsys):
    @fflow.jit
    def f(x):
        y = jnp.sin(x) * 0 + 5  # only the print uses y
        fflow.debug.print("y={y}", y=y)
        return x

    f(jnp.zeros(2))
    assert capsys.readouterr().out.strip() == "y=[5. 5.]"


def test_print_under_vmap_prints_each_lane(capsys):
    fflow.vmap(lambda x: fflow.debug.print("lane {}", x) or x)(jnp.arange(3))
    assert capsys.readouterr().out.splitlines() == ["lane 0", "lane 1", "lane 2"]
    fflow.jit(fflow.vmap(lambda x: fflow.debug.print("j {}", x) or x))(jnp.arange(2))
    assert capsys.readouterr().out.splitlines() == ["j 0", "j 1"]


def test_print_under_grad_prints_the_primal_once(capsys):
    def f(x):
        fflow.debug.print("primal {}", x)
        return x * x

    g = fflow.grad(f)(3.0)
    assert float(g) == 6.0
    assert capsys.readouterr().out.splitlines() == ["primal 3.0"]
    fflow.jit(fflow.grad(f))(jnp.float32(2.0))
    assert capsys.readouterr().out.splitlines() == ["primal 2.0"]


@pytest.fixture
def debug_nans():
    fflow.config.update("debug_nans", True)
    yield
    fflow.config.update("debug_nans", False)


def test_debug_nans_forward_names_primitive_and_line(debug_nans):
    def f(x):
        y = x * 2
        z = jnp.log(y)  # NAN_LINE
        return z + 1

    with pytest.raises(NanError) as info:
        fflow.jit(f)(jnp.asarray([-1.0, 1.0]))
    msg = str(info.value)
    assert "'log'" in msg and "NAN_LINE" in msg and "test_debug.py" in msg


def test_debug_nans_backward_names_the_forward_line(debug_nans):
    def f(x):
        s = jnp.sqrt(x)  # SQRT_LINE
        return jnp.sum(s)

    # sqrt(0) is fine forward, its derivative 0.5/sqrt(0) is inf; inf*0 -> NaN
    def g(x):
        return f(x) * 0.0

    with pytest.raises(NanError) as info:
        fflow.jit(fflow.grad(g))(jnp.asarray([0.0, 1.0]))
    assert "SQRT_LINE" in str(info.value)
    with pytest.raises(NanError) as info:
        fflow.grad(g)(jnp.asarray([0.0, 1.0]))  # eager backward pass too
    assert "SQRT_LINE" in str(info.value)


def test_debug_nans_off_returns_nan():
    out = fflow.jit(lambda x: jnp.log(x))(jnp.asarray([-1.0]))
    assert np.isnan(np.asarray(out)).all()


def test_debug_nans_eager_operators(debug_nans):
    x = jnp.asarray([0.0, 1.0])
    with pytest.raises(NanError, match="'mul'"):
        _ = x * jnp.asarray([np.inf, 1.0])  # EAGER_MUL
    fflow.config.update("debug_nans", False)
    out = x * jnp.asarray([np.inf, 1.0])  # fast path again, no check
    assert np.isnan(np.asarray(out)[0])


def test_print_inside_a_dead_scan_body_still_runs(capsys):
    from fflow import lax_control

    def f(x):
        def body(c, xi):
            fflow.debug.print("step {}", xi)
            return c + xi, c

        return lax_control.scan(body, 0.0, x)[0]

    fflow.jit(fflow.grad(f))(jnp.arange(3.0))  # the forward scan's values are unused
    assert capsys.readouterr().out.splitlines() == ["step 0.0", "step 1.0", "step 2.0"]
