"""Jaxpr introspection as JAX's "writing custom interpreters" tutorial uses it: a
ClosedJaxpr-shaped program, equations with .primitive/.params/.invars/.outvars,
Literal.val, lax.*_p, and jax.extend.core.Primitive with JVP and batching rules.
References: the untransformed functions and NumPy."""

from functools import wraps

import numpy as np

import fflow
import fflow.numpy as jnp
from fflow import lax
from fflow.extend import core
from fflow.interpreters import ad, batching


def _f(x):
    return jnp.exp(jnp.tanh(x))


def test_closed_jaxpr_fields():
    closed = fflow.make_jaxpr(_f)(jnp.ones(5))
    jaxpr = closed.jaxpr
    assert [e.primitive for e in jaxpr.eqns] == [lax.tanh_p, lax.exp_p]
    assert jaxpr.invars == [jaxpr.eqns[0].invars[0]]
    assert jaxpr.outvars == jaxpr.eqns[1].outvars
    assert closed.in_avals[0].shape == (5,) and closed.out_avals[0].dtype == np.float32
    assert closed.consts == closed.literals == []
    assert all(isinstance(e.params, dict) for e in jaxpr.eqns)
    lit = fflow.make_jaxpr(lambda x: x * 2.0)(1.0).eqns[0].invars[1]
    assert type(lit) is core.Literal and float(lit.val) == 2.0


# the tutorial's interpreter, verbatim but for the imports
def eval_jaxpr(jaxpr, consts, *args):
    env = {}

    def read(var):
        if type(var) is core.Literal:
            return var.val
        return env[var]

    def write(var, val):
        env[var] = val

    list(map(write, jaxpr.invars, args))
    list(map(write, jaxpr.constvars, consts))
    for eqn in jaxpr.eqns:
        invals = list(map(read, eqn.invars))
        outvals = eqn.primitive.bind(*invals, **eqn.params)
        if not eqn.primitive.multiple_results:
            outvals = [outvals]
        list(map(write, eqn.outvars, outvals))
    return list(map(read, jaxpr.outvars))


inverse_registry = {lax.exp_p: jnp.log, lax.tanh_p: jnp.arctanh}


def inverse(fun):
    @wraps(fun)
    def wrapped(*args, **kwargs):
        closed_jaxpr = fflow.make_jaxpr(fun)(*args, **kwargs)
        out = inverse_jaxpr(closed_jaxpr.jaxpr, closed_jaxpr.literals, *args)
        return out[0]

    return wrapped


def inverse_jaxpr(jaxpr, consts, *args):
    env = {}

    def read(var):
        if type(var) is core.Literal:
            return var.val
        return env[var]

    def write(var, val):
        env[var] = val

    list(map(write, jaxpr.outvars, args))
    list(map(write, jaxpr.constvars, consts))
    for eqn in jaxpr.eqns[::-1]:
        invals = list(map(read, eqn.outvars))
        outval = inverse_registry[eqn.primitive](*invals)
        list(map(write, eqn.invars, [outval]))
    return list(map(read, jaxpr.invars))


def test_custom_interpreters_tutorial():
    closed = fflow.make_jaxpr(_f)(jnp.ones(5))
    x = np.linspace(-1, 1, 5).astype(np.float32)
    np.testing.assert_allclose(eval_jaxpr(closed.jaxpr, closed.literals, x)[0], _f(x), rtol=1e-6)
    np.testing.assert_allclose(core.eval_jaxpr(closed.jaxpr, closed.consts, x)[0], _f(x), rtol=1e-6)
    y = _f(x)
    np.testing.assert_allclose(inverse(_f)(y), x, atol=1e-5)
    np.testing.assert_allclose(fflow.jit(inverse(_f))(y), x, atol=1e-5)
    # the inverse of the inverse program is the function again
    inv_closed = fflow.make_jaxpr(inverse(_f))(y)
    assert [e.primitive.name for e in inv_closed.eqns] == ["log", "atanh"]


def test_user_primitive_with_rules():
    multiply_add_p = core.Primitive("multiply_add")
    multiply_add_p.def_impl(lambda x, y, z: np.add(np.multiply(x, y), z))
    multiply_add_p.def_abstract_eval(lambda x, y, z: core.ShapedArray(x.shape, x.dtype))
    ad.defjvp(
        multiply_add_p,
        lambda t, x, y, z: t * y,
        lambda t, x, y, z: x * t,
        lambda t, x, y, z: t,
    )

    def batch(args, dims):
        d = next(d for d in dims if d is not None)
        moved = [jnp.moveaxis(a, b, 0) if b is not None else a for a, b in zip(args, dims)]
        return multiply_add_p.bind(*moved), 0 if d is not None else None

    batching.primitive_batchers[multiply_add_p] = batch

    def sq_add(a, b):
        return multiply_add_p.bind(a, a, b)

    assert float(sq_add(2.0, 10.0)) == 14.0
    assert float(fflow.jit(sq_add)(2.0, 10.0)) == 14.0
    assert float(fflow.grad(sq_add)(2.0, 10.0)) == 4.0
    assert float(fflow.jit(fflow.grad(sq_add, argnums=(0, 1)))(2.0, 10.0)[1]) == 1.0
    v = fflow.vmap(sq_add)(jnp.arange(3.0), jnp.ones(3))
    np.testing.assert_allclose(v, np.arange(3.0) ** 2 + 1)
    assert "multiply_add" in str(fflow.make_jaxpr(sq_add)(2.0, 1.0))
