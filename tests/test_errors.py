"""Errors a user can cause name the user's own line and say what to do."""

import os

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp
from fflow import lax
from fflow.errors import ConcretizationError, ShapeError, UnexpectedTracerError

HERE = os.path.abspath(__file__)


def _user_line(excinfo):
    """The deepest line of this file in the traceback: where the user's code failed."""
    lines = [e.lineno + 1 for e in excinfo.traceback if os.path.abspath(str(e.path)) == HERE]
    return lines[-1]


def _assert_names_line(excinfo):
    msg = str(excinfo.value)
    line = _user_line(excinfo)
    assert f"{HERE}:{line}" in msg, f"expected {os.path.basename(HERE)}:{line} in:\n{msg}"


# -- shapes ----------------------------------------------------------------------------


def test_shape_mismatch_eager_numpy_layer():
    with pytest.raises(ShapeError, match="broadcast") as e:
        jnp.ones(3) + jnp.ones(4)
    _assert_names_line(e)


def test_shape_mismatch_eager_lax():
    with pytest.raises(ShapeError, match=r"shapes \(3,\) and \(4,\)") as e:
        lax.add(jnp.ones(3), jnp.ones(4))
    _assert_names_line(e)


def _model(w, x):
    h = jnp.tanh(x @ w)
    return jnp.dot(h, jnp.ones(5))  # 4 != 5: the line the error must name


@pytest.mark.parametrize("wrap", ["eager", "jit", "grad", "jit_grad"])
def test_shape_mismatch_inside_transformed_function(wrap):
    w, x = np.ones((3, 4), np.float32), np.ones((2, 3), np.float32)
    f = {
        "eager": _model,
        "jit": fflow.jit(_model),
        "grad": fflow.grad(lambda w, x: jnp.sum(_model(w, x))),
        "jit_grad": fflow.jit(fflow.grad(lambda w, x: jnp.sum(_model(w, x)))),
    }[wrap]
    with pytest.raises(ShapeError) as e:
        f(w, x)
    _assert_names_line(e)
    assert "jnp.dot(h, jnp.ones(5))" in str(e.value)


def test_dtype_mismatch_in_lax_names_line():
    with pytest.raises(TypeError, match="dtype") as e:
        fflow.jit(lambda a, b: lax.mul(a, b))(np.ones(2, np.float32), np.ones(2, np.int32))
    _assert_names_line(e)


# -- grad misuse -----------------------------------------------------------------------


def test_grad_of_non_scalar_output():
    with pytest.raises(TypeError, match="scalar output") as e:
        fflow.grad(lambda x: jnp.sin(x))(jnp.ones(3))
    _assert_names_line(e)
    assert "Fix:" in str(e.value) and "jacrev" in str(e.value)


def test_grad_of_tuple_output():
    with pytest.raises(TypeError, match="has_aux"):
        fflow.grad(lambda x: (jnp.sum(x), x))(jnp.ones(3))


def test_grad_wrt_integer_input():
    with pytest.raises(TypeError, match="int32") as e:
        fflow.grad(lambda x: jnp.sum(x * 2.0))(jnp.arange(3))
    _assert_names_line(e)
    assert "astype" in str(e.value)
    # argnums points at the offending argument
    with pytest.raises(TypeError, match="argument 1"):
        fflow.grad(lambda x, i: x * i, argnums=(0, 1))(1.0, 2)
    # a non-differentiated integer argument is fine
    assert float(fflow.grad(lambda x, i: x * i)(1.0, 2)) == 2.0


# -- concrete values under jit ----------------------------------------------------------


def _branchy(x):
    if x > 0:  # a traced bool: the line the error must name
        return x
    return -x


def test_tracer_as_bool_under_jit():
    with pytest.raises(ConcretizationError) as e:
        fflow.jit(_branchy)(1.0)
    _assert_names_line(e)
    msg = str(e.value)
    assert "bool" in msg and "lax.cond" in msg and "static_argnums" in msg
    # eagerly, and under grad, Python control flow on values works
    assert float(_branchy(jnp.asarray(-2.0))) == 2.0
    assert float(fflow.grad(_branchy)(-2.0)) == -1.0


def test_tracer_as_int_under_jit():
    with pytest.raises(ConcretizationError) as e:
        fflow.jit(lambda x, n: x * sum(range(n)))(1.0, 3)
    _assert_names_line(e)
    assert "static_argnums" in str(e.value)
    f = fflow.jit(lambda x, n: x * sum(range(n)), static_argnums=1)
    assert float(f(1.0, 3)) == 3.0


def test_tracer_as_int_and_float_under_jit():
    with pytest.raises(ConcretizationError, match="int"):
        fflow.jit(lambda x: jnp.ones(4)[int(x)])(2)
    with pytest.raises(ConcretizationError, match="float"):
        fflow.jit(lambda x: float(x))(1.0)


# -- leaked tracers ---------------------------------------------------------------------


def test_leaked_tracer_from_jit_used_later():
    leaked = []

    def f(x):
        leaked.append(x * 2)  # the tracer escapes here
        return x

    fflow.jit(f)(1.0)
    with pytest.raises(UnexpectedTracerError, match="leaked tracer") as e:
        leaked[0] + 1
    msg = str(e.value)
    _assert_names_line(e)  # where it is used
    assert "created at" in msg and "(f)" in msg  # and where it was created
    with pytest.raises(UnexpectedTracerError):
        fflow.jit(lambda y: y + leaked[0])(1.0)


def test_leaked_tracer_from_grad_used_later():
    leaked = []

    def f(x):
        leaked.append(jnp.sin(x))
        return x * 2.0

    fflow.grad(f)(1.0)
    with pytest.raises(UnexpectedTracerError, match="escaped its transformation") as e:
        jnp.cos(leaked[0])
    _assert_names_line(e)


# -- static arguments -------------------------------------------------------------------


@pytest.mark.parametrize(
    "value,kind", [([1, 2], "list"), ({"a": 1}, "dict"), (np.ones(2), "ndarray")]
)
def test_unhashable_static_argument(value, kind):
    f = fflow.jit(lambda x, s: x * 2.0, static_argnums=1)
    with pytest.raises(TypeError, match="unhashable") as e:
        f(1.0, value)
    _assert_names_line(e)
    assert kind in str(e.value) and "static" in str(e.value)


def test_unhashable_static_argname():
    f = fflow.jit(lambda x, s=None: x * 2.0, static_argnames="s")
    with pytest.raises(TypeError, match="unhashable"):
        f(1.0, s=[1])
    assert float(f(1.0, s=(1,))) == 2.0


def test_custom_rule_closing_over_a_differentiated_value():
    def outer(y):
        @fflow.custom_jvp
        def f(a):
            return a * 2.0

        f.defjvp(lambda p, t: (p[0] * 2.0, t[0] * y))  # closes over y, being differentiated
        return f(y)

    for transform in (fflow.grad, lambda g: lambda y: fflow.jvp(g, (y,), (1.0,))):
        with pytest.raises(UnexpectedTracerError, match="explicit arguments") as e:
            transform(outer)(3.0)
        _assert_names_line(e)
