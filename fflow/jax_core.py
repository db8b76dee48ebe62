"""`jax.core` / `jax.extend.core` names for custom interpreters and new primitives.

A program from `fflow.make_jaxpr` is JAX's ClosedJaxpr and Jaxpr in one object:
`.jaxpr`, `.consts`/`.literals`, `.in_avals`, `.out_avals`, `.invars`,
`.constvars`, `.outvars` and `.eqns`; each equation has `.primitive`, `.params`,
`.invars` and `.outvars`; a `Literal` has `.val` and `.aval`.

Example (JAX's "writing custom interpreters" pattern):
    >>> import fflow, fflow.numpy as jnp
    >>> from fflow.jax_core import Literal, eval_jaxpr
    >>> closed = fflow.make_jaxpr(lambda x: jnp.exp(jnp.tanh(x)))(jnp.ones(2))
    >>> [e.primitive.name for e in closed.jaxpr.eqns]
    ['tanh', 'exp']
    >>> eval_jaxpr(closed.jaxpr, closed.literals, jnp.zeros(2))[0].tolist()
    [1.0, 1.0]
"""

from fflow import core as _core
from fflow.core import Eqn as JaxprEqn
from fflow.core import Literal, ShapedArray, Tracer, Var, aval_of_value
from fflow.core import Program as ClosedJaxpr
from fflow.core import Program as Jaxpr
from fflow.errors import ConcretizationError

get_aval = aval_of_value
AbstractValue = ShapedArray
DropVar = Var


class Primitive(_core.Primitive):
    """A user-defined primitive (JAX's `jax.extend.core.Primitive`).

    Unlike fflow's own primitives it is not entered in fflow's registry, so a name
    may be reused (as JAX allows). Define `def_impl` (called with NumPy arrays) and
    `def_abstract_eval` (returns `ShapedArray`s); register JVP / transpose / batching
    rules through `fflow.interpreters.ad` and `.batching`.
    """

    def __init__(self, name, multiple_results=False):  # noqa: D107
        self.name = name
        self.multiple_results = multiple_results
        self.impl = None
        self.abstract_eval = None
        self.traits = set()
        self.amp_class = "follow"

    def def_effectful_abstract_eval(self, fn):
        self.abstract_eval = lambda *avals, **params: fn(*avals, **params)[0]
        return fn


def eval_jaxpr(jaxpr, consts, *args, propagate_source_info=True):
    """Evaluate a program's equations on the current trace (JAX's `core.eval_jaxpr`)."""
    env = {}

    def read(v):
        return v.value if type(v) is Literal else env[v]

    for v, x in zip(jaxpr.constvars, consts):
        env[v] = x
    if len(args) != len(jaxpr.invars):
        raise TypeError(f"eval_jaxpr: {len(jaxpr.invars)} inputs expected, got {len(args)}")
    for v, x in zip(jaxpr.invars, args):
        env[v] = x
    for eqn in jaxpr.eqns:
        outs = eqn.primitive.bind(*[read(v) for v in eqn.inputs], **eqn.params)
        if not eqn.primitive.multiple_results:
            outs = [outs]
        env.update(zip(eqn.outputs, outs))
    return [read(v) for v in jaxpr.outvars]


def jaxpr_as_fun(closed_jaxpr):
    """A function evaluating `closed_jaxpr` on flat arguments (returns a list)."""
    return lambda *args: eval_jaxpr(closed_jaxpr, closed_jaxpr.consts, *args)


def new_jaxpr_eqn(invars, outvars, primitive, params, effects=None, source_info=None):
    return JaxprEqn(primitive, invars, params, outvars, source_info)


def concrete_or_error(force, val, context=""):
    """`val` made concrete (an error names the tracer when it is abstract)."""
    if isinstance(val, Tracer):
        raise ConcretizationError(val, "a concrete value" + (f" ({context})" if context else ""))
    return val if force is None else force(val)


__all__ = [
    "AbstractValue",
    "ClosedJaxpr",
    "DropVar",
    "Jaxpr",
    "JaxprEqn",
    "Literal",
    "Primitive",
    "ShapedArray",
    "Tracer",
    "Var",
    "concrete_or_error",
    "eval_jaxpr",
    "get_aval",
    "jaxpr_as_fun",
    "new_jaxpr_eqn",
]
