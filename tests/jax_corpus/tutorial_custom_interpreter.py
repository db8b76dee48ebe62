# JAX tutorial "Writing custom Jaxpr interpreters": an evaluator and an inverse transform
import jax
import jax.numpy as jnp
from jax import lax
from jax.extend import core


def f(x):
    return jnp.exp(jnp.tanh(x))


closed_jaxpr = jax.make_jaxpr(f)(jnp.ones(5))
n_invars = len(closed_jaxpr.jaxpr.invars)
prims = [eqn.primitive.name for eqn in closed_jaxpr.jaxpr.eqns]


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
        bind_params = eqn.primitive.get_bind_params(eqn.params)
        outvals = eqn.primitive.bind(*invals, **bind_params)
        if not eqn.primitive.multiple_results:
            outvals = [outvals]
        list(map(write, eqn.outvars, outvals))
    return list(map(read, jaxpr.outvars))


evaluated = eval_jaxpr(closed_jaxpr.jaxpr, closed_jaxpr.literals, jnp.ones(5))

inverse_registry = {}
inverse_registry[lax.exp_p] = jnp.log
inverse_registry[lax.tanh_p] = jnp.arctanh


def inverse(fun):
    @jax.jit
    def wrapped(*args, **kwargs):
        closed_jaxpr = jax.make_jaxpr(fun)(*args, **kwargs)
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
        if eqn.primitive not in inverse_registry:
            raise NotImplementedError(f"{eqn.primitive} does not have registered inverse.")
        outval = inverse_registry[eqn.primitive](*invals)
        list(map(write, eqn.invars, [outval]))
    return list(map(read, jaxpr.invars))


f_inv = inverse(f)
x = jnp.linspace(-1.0, 1.0, 5)
result = (
    n_invars,
    prims,
    evaluated,
    f_inv(f(x)),
    jax.vmap(f_inv)(f(x)),
    jax.jit(jax.vmap(inverse(jnp.exp)))(jnp.arange(1.0, 4.0)),
    len(closed_jaxpr.in_avals),
    closed_jaxpr.out_avals[0].shape,
)
