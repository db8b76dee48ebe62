"""Control flow under `shard`: scans of a few dozen steps are unrolled before planning.

The SPMD runtimes exchange data at collective equations of a device's top-level
program, so a loop body cannot communicate inside a per-device scan. Unrolling
gives the planner every step's equations: a scan over stacked layer weights gets
the same plan per layer as the unrolled model (Megatron's all-reduces included),
and gradient accumulation over micro-batches keeps partial-sum gradients through
the loop with one all-reduce at the end. Longer scans (and `cond` / `while_loop`)
still run whole on every device (their signatures are all-broadcast).
"""

from fflow.primitives.scan import scan_p
from fflow.transforms import program_transforms as pt
from fflow.transforms.staging import trace_to_program

from fflow import lax_ops as lax
from fflow.core import Literal

MAX_UNROLL = 64  # steps; beyond this the program would grow too large to plan


def _unrollable(eqn):
    return eqn.primitive is scan_p and eqn.params["length"] <= MAX_UNROLL


def has_unrollable(program):
    return any(_unrollable(e) for e in program.eqns)


def unroll_scans(program):
    """`program` with every scan of at most MAX_UNROLL steps unrolled (nested ones too)."""
    if not has_unrollable(program):
        return program

    def run(*args):
        env = dict(zip(program.constvars, program.consts))
        env.update(zip(program.invars, args))

        def read(v):
            return v.value if type(v) is Literal else env[v]

        for eqn in program.eqns:
            ins = [read(v) for v in eqn.inputs]
            if _unrollable(eqn):
                outs = _unrolled(ins, **eqn.params)
            else:
                out = eqn.primitive.bind(*ins, **eqn.params)
                outs = out if eqn.primitive.multiple_results else [out]
            env.update(zip(eqn.outputs, outs))
        return [read(v) for v in program.outvars]

    return trace_to_program(run, [v.aval for v in program.invars])


def _unrolled(args, *, jaxpr, num_consts, num_carry, length, reverse=False, unroll=1):
    body = unroll_scans(jaxpr)
    consts = list(args[:num_consts])
    carry = list(args[num_consts : num_consts + num_carry])
    xs = list(args[num_consts + num_carry :])
    n_ys = len(jaxpr.outvars) - num_carry
    ys = [[None] * length for _ in range(n_ys)]
    for i in reversed(range(length)) if reverse else range(length):
        x_i = [lax.index_in_dim(x, i, 0, keepdims=False) for x in xs]
        outs = pt.call(body, consts + carry + x_i)
        carry = list(outs[:num_carry])
        for k, y in enumerate(outs[num_carry:]):
            ys[k][i] = lax.expand_dims(y, (0,))
    stacked = [lax.concatenate(per_step, 0) for per_step in ys]
    return carry + stacked
