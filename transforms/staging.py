"""Staging: tracing Python functions into programs, and evaluating programs.

`StagingTrace` records every primitive applied to its tracers as an equation. In
partial-evaluation mode (used by `linearize`) an equation whose inputs are all
known (none of them is this trace's tracer) is computed right away on the parent
trace instead, so only the unknown (tangent) part is staged.
"""

import numpy as np

import fflow.errors as errors
from fflow import core, dtypes
from fflow.array import Array, root_trace
from fflow.core import Eqn, Literal, Program, ShapedArray, Var, aval_of_value, set_current_trace
from fflow.errors import user_source_info

# prim -> rule(trace, args, params) -> outputs, for primitives whose inputs are
# partly known and partly unknown and that want to split themselves (scan, cond,
# checkpoint). The default stages the whole equation.
partial_eval_rules = {}


class StagingTracer(core.Tracer):
    __slots__ = ("_aval", "_var", "_source_info")  # `_var`: x.var() is the variance

    def __init__(self, trace, aval, var, source_info=None):
        self._trace = trace
        self._aval = aval
        self._var = var
        self._source_info = source_info

    @property
    def aval(self):
        return self._aval


class StagingTrace(core.Trace):
    """Records equations. `partial_eval=True` computes known-only equations eagerly."""

    def __init__(self, parent=None, partial_eval=False):
        super().__init__(parent)
        self.partial_eval = partial_eval
        self.invars = []
        self.eqns = []
        self.const_vars = {}  # id(value) -> (var, value)
        self._keep_alive = []

    def new_arg(self, aval):
        var = Var(aval)
        self.invars.append(var)
        return StagingTracer(self, aval, var)

    def var_of(self, x):
        if isinstance(x, StagingTracer) and x._trace is self:
            return x._var
        if isinstance(x, core.Tracer):
            core.check_not_leaked(x, self)
        if isinstance(x, np.generic) or (isinstance(x, np.ndarray) and x.ndim == 0):
            # before the Python-scalar check: np.float64 subclasses float; a 0-d array
            # is copied (captured now, as JAX does: later writes to it do not show)
            x = dtypes.canonical_array(np.array(x))
            return Literal(x[()], ShapedArray((), x.dtype))
        if isinstance(x, (bool, int, float, complex)):
            return Literal(x)
        if getattr(x, "_weak", False) and type(x).__name__ == "Array" and x.ndim == 0:
            # a weakly typed scalar (a Python number kept weak): a literal, not a constant
            if x._sharding is None and type(x._value) is np.ndarray:
                return Literal(x._value, ShapedArray((), x.dtype, weak_type=True))
        entry = self.const_vars.get(id(x))
        if entry is None:
            value = x
            if not isinstance(x, (core.Tracer, Array)):
                # a closed-over NumPy array is captured when traced (as in JAX): a later
                # write into it must not change the compiled function; x64 off narrows it
                value = dtypes.canonical_array(np.array(x))
                self._keep_alive.append(x)  # its id keys const_vars
            entry = (Var(aval_of_value(value)), value)
            self.const_vars[id(x)] = entry
        return entry[0]

    def process_primitive(self, prim, args, params):
        if self.partial_eval:
            if not any(isinstance(a, StagingTracer) and a._trace is self for a in args):
                with set_current_trace(self.parent):
                    return prim.bind(*args, **params)
            rule = partial_eval_rules.get(prim)
            if rule is not None:
                return rule(self, args, params)
        return self.stage(prim, args, params)

    def stage(self, prim, args, params, out_avals=None):
        """Record `prim(*args)` as an equation and return its output tracers."""
        invars = [self.var_of(a) for a in args]
        if out_avals is None:
            out_avals = prim.abstract_eval(*[v.aval for v in invars], **params)
        info = user_source_info()
        if prim.multiple_results:
            outvars = [Var(a) for a in out_avals]
            self.eqns.append(Eqn(prim, invars, params, outvars, info))
            return [StagingTracer(self, v.aval, v, info) for v in outvars]
        outvar = Var(out_avals)
        self.eqns.append(Eqn(prim, invars, params, [outvar], info))
        return StagingTracer(self, outvar.aval, outvar, info)

    def to_program(self, outs):
        """Close the trace: a Program from this trace's invars to `outs`."""
        outvars = [self.var_of(o) for o in outs]
        constvars = [var for var, _ in self.const_vars.values()]
        consts = [value for _, value in self.const_vars.values()]
        return Program(self.invars, constvars, self.eqns, outvars, consts)


def trace_to_program(fun, in_avals, parent=None):
    """Trace `fun` (flat args -> flat list of outputs) on abstract inputs."""
    trace = StagingTrace(parent)
    args = [trace.new_arg(a) for a in in_avals]
    try:
        with set_current_trace(trace):
            outs = fun(*args)
        program = trace.to_program(list(outs))
    finally:
        trace.finish()
    return program


def eval_program(program, consts, args):
    """Evaluate `program` by re-binding its equations on the current trace."""
    env = {}
    for v, x in zip(program.constvars, consts):
        env[v] = x
    for v, x in zip(program.invars, args):
        env[v] = x

    def read(v):
        if type(v) is not Literal:
            return env[v]
        # a weak literal (a Python scalar) stays weak when re-bound (vmap broadcasts it)
        return Array(np.asarray(v.value), True) if v.aval.weak_type else v.value

    for eqn in program.eqns:
        invals = [read(v) for v in eqn.inputs]
        with _at_source(eqn.source_info):
            outs = eqn.primitive.bind(*invals, **eqn.params)
        if eqn.primitive.multiple_results:
            for v, x in zip(eqn.outputs, outs):
                env[v] = x
        else:
            env[eqn.outputs[0]] = outs
    return [read(v) for v in program.outvars]


# primitive -> make(eqn): a runner `run(*args) -> outputs` for a program that is that
# one equation, or None (transforms/shard.py registers shard_call: jit of shard on
# global arrays calls the sharded program without re-binding)
direct_runners = {}


def run_at_root(program):
    """A callable evaluating `program` on concrete values at the root trace (jit's
    executable for programs on global arrays, and in jit_interpret mode)."""
    eqns = program.eqns
    make = direct_runners.get(eqns[0].primitive) if len(eqns) == 1 else None
    if make is not None and eqns[0].inputs == program.invars and not program.constvars:
        if eqns[0].outputs == program.outvars and (run := make(eqns[0])) is not None:
            return run

    def run(*args):
        with set_current_trace(root_trace):
            return eval_program(program, program.consts, args)

    return run


class _at_source:
    """While re-binding a staged equation, errors and new equations keep its user line."""

    __slots__ = ("info", "prev")

    def __init__(self, info):
        self.info = info

    def __enter__(self):

        self.prev = errors.forced_source_info
        if self.info is not None:
            errors.forced_source_info = self.info

    def __exit__(self, *exc):

        errors.forced_source_info = self.prev


__all__ = [
    "StagingTrace",
    "StagingTracer",
    "trace_to_program",
    "eval_program",
    "run_at_root",
    "partial_eval_rules",
]
