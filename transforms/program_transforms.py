"""Program-to-program transforms used by primitives with nested programs
(cond, while, scan): fast NumPy evaluation, closing over consts, JVP, partial
evaluation (known/unknown split for linearize) and transposition of a program.

Nested programs are *closed*: they have no consts; whatever their Python function
closed over is passed as explicit leading operands of the equation.
"""

import numpy as np
from fflow.transforms import autodiff as ad
from fflow.transforms.staging import StagingTrace, eval_program, trace_to_program

from fflow import core
from fflow.core import Literal, Program, Var, set_current_trace


def eval_numpy(program, args):
    """Evaluate a closed program on NumPy arrays by calling each primitive's impl.

    This is the eager path of the control-flow primitives: no tracing, no Array
    boxing, one dict lookup and one impl call per equation.
    """
    env = dict(zip(program.invars, args))
    if program.constvars:
        env.update(zip(program.constvars, (np.asarray(c) for c in program.consts)))
    for eqn in program.eqns:
        invals = [
            np.asarray(v.value, v.aval.dtype) if type(v) is Literal else env[v] for v in eqn.inputs
        ]
        out = eqn.primitive.impl(*invals, **eqn.params)
        if eqn.primitive.multiple_results:
            env.update(zip(eqn.outputs, out))
        else:
            env[eqn.outputs[0]] = out
    return [
        np.asarray(v.value, v.aval.dtype) if type(v) is Literal else env[v] for v in program.outvars
    ]


def close(program):
    """(closed program taking its constvars as leading invars, the const values)."""
    if not program.constvars:
        return program, []
    closed = Program(
        list(program.constvars) + list(program.invars), [], program.eqns, program.outvars
    )
    return closed, list(program.consts)


def trace_closed(fun, in_avals):
    """Trace `fun` (flat args -> flat outs) to a closed program and its consts."""
    return close(trace_to_program(fun, in_avals))


def call(program, args):
    """Evaluate a closed program on the current trace (its program rewrite)."""
    return eval_program(program, [], list(args))


def pad_invars(program, before=(), after=()):
    """The program with unused leading/trailing invars of the given avals."""
    pre = [Var(a) for a in before]
    post = [Var(a) for a in after]
    return program.replace(invars=pre + list(program.invars) + post)


def permute(program, in_order=None, out_order=None):
    """Reorder invars / outvars by index lists."""
    invars = program.invars if in_order is None else [program.invars[i] for i in in_order]
    outvars = program.outvars if out_order is None else [program.outvars[i] for i in out_order]
    return program.replace(invars=invars, outvars=outvars)


def prune(program):
    """Drop the equations the outputs do not need (no primitive here has effects)."""
    needed = {v for v in program.outvars if type(v) is not Literal}
    keep = []
    for eqn in reversed(program.eqns):
        if any(o in needed for o in eqn.outputs):
            keep.append(eqn)
            needed.update(v for v in eqn.inputs if type(v) is not Literal)
    return program.replace(eqns=keep[::-1])


# ----------------------------------------------------------------------------
# JVP


def jvp_program(program, nonzeros, instantiate):
    """JVP of a closed program.

    The new program maps (primals, tangents of the `nonzeros` inputs) to
    (primal outs, tangents of the nonzero outs). Returns (program, consts,
    out_nonzeros); an output tangent is nonzero if the JVP produced one or it is
    listed in `instantiate`.
    """
    n = len(program.invars)
    if isinstance(instantiate, bool):
        instantiate = [instantiate] * len(program.outvars)
    in_avals = program.in_avals
    t_avals = [ad.tangent_aval(a) for a, nz in zip(in_avals, nonzeros) if nz]
    out_nz = []

    def f(*args):
        primals, tangents = list(args[:n]), iter(args[n:])
        ts = [
            next(tangents) if nz else ad.Zero(ad.tangent_aval(a))
            for a, nz in zip(in_avals, nonzeros)
        ]
        outs, touts = ad.jvp_flat(lambda *xs: call(program, xs), primals, ts)
        out_nz.clear()
        kept = []
        for t, inst in zip(touts, instantiate):
            if type(t) is ad.Zero and not inst:
                out_nz.append(False)
                continue
            out_nz.append(True)
            kept.append(ad.instantiate(t) if type(t) is ad.Zero else t)
        return list(outs) + kept

    prog, consts = trace_closed(f, list(in_avals) + t_avals)
    return prog, consts, list(out_nz)


# ----------------------------------------------------------------------------
# Partial evaluation


class Split:
    """A closed program split into a known and an unknown part.

    known:   (known_consts..., known inputs) -> (known outputs..., residuals...)
    unknown: (residuals..., unknown inputs) -> unknown outputs
    `residuals` are the values the unknown part needs from the known part, as
    tracers of the known trace (`res_tracers`) — or concrete/outer values.
    """

    __slots__ = (
        "known",
        "known_consts",
        "unknown",
        "out_unknowns",
        "residuals",
        "res_avals",
        "res_kinds",
    )


def partial_eval_program(program, unknowns, instantiate):
    """Split `program` given which inputs are unknown.

    Known equations are recorded in a known program; unknown ones (and, through
    `partial_eval_rules`, the unknown parts of nested control flow) in an unknown
    program. `Split.res_kinds[i]` says where residual i comes from: ("outer", None)
    for a value from outside the program (a constant or an outer tracer),
    ("input", k) for the k-th known input itself, ("computed", None) otherwise.
    """
    if isinstance(instantiate, bool):
        instantiate = [instantiate] * len(program.outvars)
    known_trace = StagingTrace()
    unknown_trace = StagingTrace(parent=known_trace, partial_eval=True)
    try:
        args = []
        known_in = []
        for a, uk in zip(program.in_avals, unknowns):
            if uk:
                args.append(unknown_trace.new_arg(a))
            else:
                t = known_trace.new_arg(a)
                known_in.append(t)
                args.append(t)
        with set_current_trace(unknown_trace):
            outs = call(program, args)
        out_uk = [unknown_trace.is_own(o) or bool(inst) for o, inst in zip(outs, instantiate)]
        known_outs = [o for o, uk in zip(outs, out_uk) if not uk]
        unknown_outs = [o for o, uk in zip(outs, out_uk) if uk]
        uk_prog = unknown_trace.to_program(unknown_outs)
        residuals = list(uk_prog.consts)
        known_prog = known_trace.to_program(known_outs + residuals)
    finally:
        unknown_trace.finish()
        known_trace.finish()
    split = Split()
    split.known, split.known_consts = close(known_prog)
    split.unknown = Program(
        list(uk_prog.constvars) + list(uk_prog.invars), [], uk_prog.eqns, uk_prog.outvars
    )
    split.out_unknowns = out_uk
    split.residuals = residuals
    split.res_avals = [v.aval for v in uk_prog.constvars]
    kinds = []
    for r in residuals:
        if not is_tracer_of(r, known_trace):
            kinds.append(("outer", None))
            continue
        idx = next((i for i, t in enumerate(known_in) if t._var is r._var), None)
        kinds.append(("computed", None) if idx is None else ("input", idx))
    split.res_kinds = kinds
    return split


# ----------------------------------------------------------------------------
# Transposition


def transpose_program(program, linear, cts_avals=None):
    """Transpose a closed program that is linear in the inputs marked `linear`.

    Returns a closed program (non-linear inputs..., output cotangents...) ->
    (cotangents of the linear inputs...) with zeros instantiated, and its consts.
    """
    lin_vars = [v for v, lin in zip(program.invars, linear) if lin]
    res_vars = [v for v, lin in zip(program.invars, linear) if not lin]
    res_avals = [v.aval for v in res_vars]
    out_avals = cts_avals or [ad.tangent_aval(v.aval) for v in program.outvars]

    def f(*args):
        res, cts = args[: len(res_vars)], args[len(res_vars) :]
        prog = Program(lin_vars, res_vars, program.eqns, program.outvars, list(res))
        cts_in = ad.backward_pass(prog, list(cts))
        return [
            ad.zeros_like_aval(ad.tangent_aval(v.aval)) if type(c) is ad.Zero else c
            for v, c in zip(lin_vars, cts_in)
        ]

    return trace_closed(f, res_avals + list(out_avals))


def instantiate_ct(ct, aval):
    if ct is None or type(ct) is ad.Zero:
        return ad.zeros_like_aval(ad.tangent_aval(aval))
    return ct


def is_tracer_of(x, trace):
    return isinstance(x, core.Tracer) and x._trace is trace


__all__ = [
    "eval_numpy",
    "close",
    "trace_closed",
    "call",
    "pad_invars",
    "permute",
    "jvp_program",
    "partial_eval_program",
    "transpose_program",
]
