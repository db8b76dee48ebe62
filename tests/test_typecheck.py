"""The typechecker accepts every program fflow builds and rejects corrupted ones."""

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp
from fflow.core import ShapedArray, Var
from fflow.typecheck import ProgramTypeError, check_program

FUNCTIONS = [
    lambda x: jnp.sin(x) * 2 + x[1:].mean(),
    lambda x: jnp.sum(jnp.tanh(x @ x.T), axis=0),
    lambda x: jnp.concatenate([x, jnp.exp(x)])[::2].reshape(-1),
    lambda x: jnp.where(x > 0, x, -x).max(),
]


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_traced_and_differentiated_programs_typecheck(fn):
    x = jnp.asarray(np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3))
    check_program(fflow.make_jaxpr(fn)(x))
    check_program(fflow.make_jaxpr(fflow.grad(lambda v: jnp.sum(fn(v))))(x))


def test_wrong_output_aval_is_rejected():
    program = fflow.make_jaxpr(lambda x: jnp.sin(x))(jnp.ones(3))
    program.eqns[0].outputs[0].aval = ShapedArray((4,), np.float32)
    with pytest.raises(ProgramTypeError, match="shape rule gives f32\\[3\\]"):
        check_program(program)


def test_use_before_definition_is_rejected():
    program = fflow.make_jaxpr(lambda x: jnp.cos(jnp.sin(x)))(jnp.ones(3))
    program.eqns[1].inputs[0] = Var(ShapedArray((3,), np.float32))
    with pytest.raises(ProgramTypeError, match="used before it is defined"):
        check_program(program)


def test_eval_shape_matches_real_output():
    fn = FUNCTIONS[1]
    x = jnp.ones((2, 3))
    s = fflow.eval_shape(fn, x)
    out = fn(x)
    assert s.shape == out.shape and s.dtype == out.dtype
