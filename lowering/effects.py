"""Which equations have effects or nested programs (used by every pass and backend)."""

import weakref

from fflow.core import Program


def is_effectful(eqn):
    """An effect (trait "effect"), or control flow / a call whose body has one."""
    if "effect" in eqn.primitive.traits:
        return True
    return any(_program_has_effects(p) for p in subprograms(eqn))


_effects_cache = weakref.WeakKeyDictionary()  # program -> bool


def _program_has_effects(program):
    hit = _effects_cache.get(program)
    if hit is None:
        hit = _effects_cache[program] = any(is_effectful(e) for e in program.eqns)
    return hit


def subprograms(eqn):
    """The programs among `eqn`'s params (bodies of control flow and calls)."""
    out = []
    for value in eqn.params.values():
        if isinstance(value, Program):
            out.append(value)
        elif isinstance(value, (tuple, list)):
            out.extend(v for v in value if isinstance(v, Program))
    return out


def has_subprograms(eqn):
    return bool(subprograms(eqn))
