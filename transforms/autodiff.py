"""Forward and reverse mode: the JVP trace, linearize (JVP + partial evaluation)
and transposition of linear programs. `vjp` = linearize + transpose, so only
linear primitives need transpose rules.

Tables: `jvp_rules[prim](primals, tangents, **params) -> (primal_out, tangent_out)`
and `transpose_rules[prim](ct, *inputs, **params) -> cts per input`, where linear
inputs arrive as `UndefinedPrimal` and absent cotangents are `None` or `Zero`.
"""

from fflow.transforms.staging import StagingTrace, _at_source

from fflow import core
from fflow import lax_ops as lax
from fflow.core import Literal, aval_of_value, set_current_trace
from fflow.errors import FflowError, user_error

jvp_rules = {}
transpose_rules = {}


class Zero:
    """A symbolic zero tangent/cotangent: no array is ever built for it."""

    __slots__ = ("aval",)

    def __init__(self, aval):
        self.aval = aval

    def __repr__(self):
        return f"Zero({self.aval.str_short()})"


class UndefinedPrimal:
    """Stands for a linear input of an equation during transposition."""

    __slots__ = ("aval",)

    def __init__(self, aval):
        self.aval = aval

    def __repr__(self):
        return f"UndefinedPrimal({self.aval.str_short()})"


def is_undefined(x):
    return type(x) is UndefinedPrimal


def zeros_like_aval(aval):
    return lax.full(aval.shape, 0, aval.dtype)


def instantiate(t):
    return zeros_like_aval(t.aval) if type(t) is Zero else t


def tangent_aval(aval):
    """Tangents of integer/bool values are float0 in JAX; fflow keeps a zero of the same type."""
    return aval.strip_weak_type()


def add_tangents(x, y):
    if type(x) is Zero:
        return y
    if type(y) is Zero:
        return x
    return lax.add(x, y)


# ----------------------------------------------------------------------------
# Registrar helpers


def defjvp(prim, *jvp_fns):
    """Register a JVP from one function per input: `jvp_fn(t_i, *primals, **params)`.

    A `None` entry means the output does not depend on that input differentiably.
    """

    def rule(primals, tangents, **params):
        out = prim.bind(*primals, **params)
        t_out = Zero(tangent_aval(aval_of_value(out)))
        for fn, t in zip(jvp_fns, tangents):
            if fn is not None and type(t) is not Zero:
                t_out = add_tangents(t_out, fn(t, *primals, **params))
        return out, t_out

    jvp_rules[prim] = rule
    return rule


def defjvp_with_output(prim, fn):
    """JVP that reuses the primal output: `fn(out, primals, tangents, **params)`."""

    def rule(primals, tangents, **params):
        out = prim.bind(*primals, **params)
        return out, fn(out, primals, tangents, **params)

    jvp_rules[prim] = rule
    return rule


def deflinear(prim, transpose_rule):
    """A primitive linear in all of its inputs: JVP applies it to the tangents."""

    def rule(primals, tangents, **params):
        out = prim.bind(*primals, **params)
        if all(type(t) is Zero for t in tangents):
            return out, Zero(tangent_aval(aval_of_value(out)))
        return out, prim.bind(*[instantiate(t) for t in tangents], **params)

    jvp_rules[prim] = rule
    transpose_rules[prim] = transpose_rule
    prim.traits.add("linear")
    return rule


def defzero(prim):
    """Outputs with zero derivative everywhere (comparisons, integer ops, argmax...)."""

    def rule(primals, tangents, **params):
        out = prim.bind(*primals, **params)
        if prim.multiple_results:
            return out, [Zero(tangent_aval(aval_of_value(o))) for o in out]
        return out, Zero(tangent_aval(aval_of_value(out)))

    jvp_rules[prim] = rule
    prim.traits.add("zero_derivative")
    return rule


# ----------------------------------------------------------------------------
# The JVP trace


class JVPTracer(core.Tracer):
    __slots__ = ("primal", "tangent")

    def __init__(self, trace, primal, tangent):
        self._trace = trace
        self.primal = primal
        self.tangent = tangent

    @property
    def aval(self):
        return aval_of_value(self.primal)

    def concrete_value(self):
        p = self.primal
        if isinstance(p, core.Tracer):
            return p.concrete_value()
        return p


class JVPTrace(core.Trace):
    def lift(self, x):
        if isinstance(x, JVPTracer) and x._trace is self:
            return x.primal, x.tangent
        if isinstance(x, core.Tracer):
            core.check_not_leaked(x, self)
        return x, Zero(tangent_aval(aval_of_value(x)))

    def process_primitive(self, prim, args, params):
        primals, tangents = [], []
        for a in args:
            p, t = self.lift(a)
            primals.append(p)
            tangents.append(t)
        if all(type(t) is Zero for t in tangents):
            with set_current_trace(self.parent):
                return prim.bind(*primals, **params)
        rule = jvp_rules.get(prim)
        if rule is None:
            raise user_error(
                NotImplementedError,
                f"fflow has no differentiation rule for the primitive {prim.name!r}.",
            )
        with set_current_trace(self.parent):
            out, t_out = rule(primals, tangents, **params)
        if prim.multiple_results:
            return [self.box(o, t) for o, t in zip(out, t_out)]
        return self.box(out, t_out)

    def box(self, primal, tangent):
        if type(tangent) is Zero:
            return primal
        return JVPTracer(self, primal, tangent)


# fun, primals -> fun: rewrites a function's equations need before reverse mode
# differentiates them (transforms/attention_rewrite.py: hand-written attention -> the
# fused primitive, whose backward is one kernel). Forward mode keeps the equations,
# except inside linearize (scan's and cond's reverse mode go through their JVP).
before_differentiation = []


def _prepare(fun, primals, reverse):
    t = core.current_trace()
    while not reverse and t is not None:
        reverse, t = isinstance(t, StagingTrace) and t.partial_eval, t.parent
    for hook in before_differentiation if reverse else ():
        fun = hook(fun, primals)
    return fun


def jvp_flat(fun, primals, tangents):
    """Forward mode on flat lists: returns (primals_out, tangents_out) with Zeros."""
    fun = _prepare(fun, primals, reverse=False)
    trace = JVPTrace()
    try:
        with set_current_trace(trace):
            ins = [trace.box(p, t) for p, t in zip(primals, tangents)]
            outs = fun(*ins)
        pairs = [trace.lift(o) for o in outs]
    finally:
        trace.finish()
    return [p for p, _ in pairs], [t for _, t in pairs]


# ----------------------------------------------------------------------------
# Linearize and transpose


def linearize_flat(fun, primals):
    """Returns (primals_out, linear_program) where the program maps tangents in to
    tangents out; its consts are the residuals (known values)."""
    fun = _prepare(fun, primals, reverse=True)
    lin = StagingTrace(partial_eval=True)
    jvp_trace = JVPTrace(parent=lin)
    try:
        tangents_in = [lin.new_arg(tangent_aval(aval_of_value(p))) for p in primals]
        with set_current_trace(jvp_trace):
            ins = [jvp_trace.box(p, t) for p, t in zip(primals, tangents_in)]
            outs = fun(*ins)
        pairs = [jvp_trace.lift(o) for o in outs]
        jvp_trace.finish()
        primals_out = [p for p, _ in pairs]
        for p in primals_out:
            if isinstance(p, core.Tracer) and p._trace is lin:
                raise FflowError(
                    "linearize: a primal output depends on a staged tangent computation; "
                    "a primitive in this function needs a partial-evaluation rule."
                )
        tangents_out = []
        for _, t in pairs:
            if type(t) is Zero:
                t = _zero_for_program(t.aval, lin)
            tangents_out.append(t)
        program = lin.to_program(tangents_out)
    finally:
        jvp_trace.finish()
        lin.finish()
    return primals_out, program


def _zero_for_program(aval, lin):
    # A zero output tangent still needs a var; a literal-backed full keeps it linear-free.
    with set_current_trace(lin.parent):
        return zeros_like_aval(aval)


def backward_pass(program, cts_out):
    """Transpose a linear program: cotangents of its outputs -> of its inputs.

    Equations that do not depend on linear inputs (residual recomputation, as in
    `checkpoint`) are evaluated forward first.
    """

    env = dict(zip(program.constvars, program.consts))
    linear = set(program.invars)
    linear_eqns = []
    for eqn in program.eqns:
        if any(type(v) is not Literal and v in linear for v in eqn.inputs):
            linear.update(eqn.outputs)
            linear_eqns.append(eqn)
        else:
            invals = [v.value if type(v) is Literal else env[v] for v in eqn.inputs]
            outs = eqn.primitive.bind(*invals, **eqn.params)
            if eqn.primitive.multiple_results:
                env.update(zip(eqn.outputs, outs))
            else:
                env[eqn.outputs[0]] = outs

    ct_env = {}

    def write_ct(v, ct):
        if type(v) is Literal or v not in linear or ct is None or type(ct) is Zero:
            return
        ct_env[v] = add_tangents(ct_env[v], ct) if v in ct_env else ct

    for v, ct in zip(program.outvars, cts_out):
        write_ct(v, ct)

    for eqn in reversed(linear_eqns):
        cts = [ct_env.pop(v, None) for v in eqn.outputs]
        if all(ct is None for ct in cts):
            continue
        cts = [Zero(v.aval) if ct is None else ct for v, ct in zip(eqn.outputs, cts)]
        invals = [
            UndefinedPrimal(v.aval)
            if type(v) is not Literal and v in linear
            else (v.value if type(v) is Literal else env[v])
            for v in eqn.inputs
        ]
        rule = transpose_rules.get(eqn.primitive)
        if rule is None:
            raise FflowError(
                f"reverse-mode differentiation needs a transpose rule for "
                f"{eqn.primitive.name!r}, which is not linear or has none"
                + (f" (at {eqn.source_info})" if eqn.source_info else "")
            )
        ct_arg = cts if eqn.primitive.multiple_results else cts[0]
        # backward equations (and errors, NaN reports) keep the forward user line
        with _at_source(eqn.source_info):
            cts_in = rule(ct_arg, *invals, **eqn.params)
        for v, ct in zip(eqn.inputs, cts_in):
            write_ct(v, ct)
    return [ct_env.get(v, Zero(v.aval)) for v in program.invars]


def vjp_flat(fun, primals):
    primals_out, program = linearize_flat(fun, primals)

    def vjp_fn(cts):
        return backward_pass(program, cts)

    return primals_out, vjp_fn, program


def check_differentiable_input(x, argnum):
    aval = aval_of_value(x)
    if not (aval.dtype.kind in "fc" or aval.dtype.name == "bfloat16"):
        raise user_error(
            TypeError,
            f"grad requires real- or complex-valued inputs, but argument {argnum} has "
            f"dtype {aval.dtype.name}. Fix: pass a float array (x.astype(float)) or "
            f"exclude it from argnums.",
        )


def check_scalar_output(out, what="grad"):
    aval = aval_of_value(out)
    if aval.shape != ():
        raise user_error(
            TypeError,
            f"{what} requires a scalar output, but the function returned shape "
            f"{aval.shape} ({aval.str_short()}). Fix: reduce it (e.g. .sum() or .mean()), "
            f"or use vjp / jacrev for non-scalar outputs.",
        )
    if not (aval.dtype.kind in "fc" or aval.dtype.name == "bfloat16"):
        raise user_error(
            TypeError,
            f"{what} requires a float output, but the function returned {aval.str_short()}.",
        )


def ones_like_value(x):
    aval = aval_of_value(x)
    return lax.full(aval.shape, 1, aval.dtype)


__all__ = [
    "jvp_rules",
    "transpose_rules",
    "Zero",
    "UndefinedPrimal",
    "defjvp",
    "deflinear",
    "defzero",
    "jvp_flat",
    "linearize_flat",
    "backward_pass",
    "vjp_flat",
]
