"""The typechecker: re-derives every aval of a program from its primitives' shape rules.

Transforms and passes that build programs by hand can call `check_program` to
catch a wrong aval, a variable used before it is defined, or one defined twice.

Example:
    >>> import fflow, fflow.numpy as jnp
    >>> from fflow.typecheck import check_program
    >>> check_program(fflow.make_jaxpr(lambda x: jnp.sin(x) * 2)(1.0))
"""

from fflow.core import Literal, Program, ShapedArray


class ProgramTypeError(Exception):
    """A program whose equations do not type-check."""


def _same_type(a, b):
    # weak-typedness is advisory: it only steers promotion of Python scalars
    return a.shape == b.shape and a.dtype == b.dtype


def check_program(program):
    """Raise ProgramTypeError if any equation's outputs differ from its shape rule's."""
    defined = set()

    def define(v, where):
        if v in defined:
            raise ProgramTypeError(f"{where}: variable {v} is defined twice")
        defined.add(v)

    for v in program.constvars:
        define(v, "constvars")
    for v in program.invars:
        define(v, "invars")
    if len(program.consts) not in (0, len(program.constvars)):
        raise ProgramTypeError(
            f"{len(program.constvars)} constvars but {len(program.consts)} const values"
        )
    for i, eqn in enumerate(program.eqns):
        where = f"equation {i} ({eqn.primitive.name}" + (
            f" at {eqn.source_info})" if eqn.source_info else ")"
        )
        for v in eqn.inputs:
            if type(v) is not Literal and v not in defined:
                raise ProgramTypeError(f"{where}: input {v} is used before it is defined")
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(sub, Program):
                    check_program(sub)
        in_avals = [v.aval for v in eqn.inputs]
        try:
            expected = eqn.primitive.abstract_eval(*in_avals, **eqn.params)
        except Exception as e:  # the shape rule itself rejects the inputs
            raise ProgramTypeError(f"{where}: shape rule failed: {e}") from e
        if isinstance(expected, ShapedArray):
            expected = [expected]
        expected = list(expected)
        if len(expected) != len(eqn.outputs):
            raise ProgramTypeError(
                f"{where}: {len(eqn.outputs)} outputs, the shape rule gives {len(expected)}"
            )
        for v, aval in zip(eqn.outputs, expected):
            if not _same_type(v.aval, aval):
                raise ProgramTypeError(
                    f"{where}: output typed {v.aval.str_short()} but the shape rule gives "
                    f"{aval.str_short()}"
                )
            define(v, where)
    for v in program.outvars:
        if type(v) is not Literal and v not in defined:
            raise ProgramTypeError(f"output {v} is not defined by the program")
