"""JAX-style pretty-printing of programs, stable enough for golden tests:

    { lambda ; a:f32[]. let b:f32[] = cos a; c:f32[] = sin b in (c,) }

Short programs print on one line; longer ones put one equation per line.
"""

import numpy as np

from fflow import dtypes

# The printer sits below fflow.core (whose Program.__str__ calls it), so it knows
# programs and literals by their fields rather than by their classes.


def _is_program(value):
    return hasattr(value, "eqns") and hasattr(value, "outvars")


def _is_literal(v):
    return hasattr(v, "value") and not hasattr(v, "id")


_ONE_LINE_LIMIT = 100


class _Names:
    def __init__(self):
        self.names = {}

    def __call__(self, v):
        if _is_literal(v):
            return _pp_literal(v)
        name = self.names.get(v)
        if name is None:
            name = _letters(len(self.names))
            self.names[v] = name
        return name


def _letters(i):
    s = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        s = chr(ord("a") + r) + s
    return s


def _pp_literal(lit):
    value = np.asarray(lit.value)
    if value.dtype == np.bool_:
        text = str(bool(value))
    elif value.dtype.kind == "f" or value.dtype.name == "bfloat16":
        text = repr(float(value))
    else:
        text = str(value.item()) if value.shape == () else str(value.tolist())
    return f"{text}:{lit.aval.str_short()}"


def _pp_param(value, names, indent):
    if _is_program(value):
        return _pp(value, names, indent + 2, force_multiline=True)
    if isinstance(value, np.dtype):
        return dtypes.short_name(value)
    if isinstance(value, (list, tuple)) and value and all(_is_program(v) for v in value):
        inner = "\n".join(" " * (indent + 4) + _pp(v, names, indent + 4, True) for v in value)
        return "(\n" + inner + "\n" + " " * (indent + 2) + ")"
    if callable(value) and not isinstance(value, type):
        return getattr(value, "__name__", "fn")
    return str(value)


def _has_program(value):
    if _is_program(value):
        return True
    return isinstance(value, (list, tuple)) and any(_is_program(v) for v in value)


def _pp_eqn(eqn, names, indent):
    outs = " ".join(f"{names(v)}:{v.aval.str_short()}" for v in eqn.outputs)
    params = ""
    if eqn.params:
        parts = [f"{k}={_pp_param(eqn.params[k], names, indent)}" for k in sorted(eqn.params)]
        if any(_has_program(v) for v in eqn.params.values()):
            # nested programs (cond, scan, while...): one param per line, as JAX prints
            pad = " " * (indent + 2)
            params = "[\n" + "\n".join(pad + p for p in parts) + "\n" + " " * indent + "]"
        else:
            params = "[" + " ".join(parts) + "]"
    args = " ".join(names(v) for v in eqn.inputs)
    lhs = outs if outs else "_"
    return f"{lhs} = {eqn.primitive.name}{params}{' ' + args if args else ''}"


def _pp(program, names, indent=0, force_multiline=False):
    consts = " ".join(f"{names(v)}:{v.aval.str_short()}" for v in program.constvars)
    ins = " ".join(f"{names(v)}:{v.aval.str_short()}" for v in program.invars)
    eqns = [_pp_eqn(e, names, indent + 4) for e in program.eqns]
    outs = "(" + "".join(f"{names(v)}, " for v in program.outvars).rstrip(" ") + ")"
    if len(program.outvars) > 1:
        outs = "(" + ", ".join(names(v) for v in program.outvars) + ")"
    head = f"{{ lambda {consts}; {ins}. let"
    one_line = f"{head} {'; '.join(eqns)} in {outs} }}" if eqns else f"{head} in {outs} }}"
    if not force_multiline and len(one_line) <= _ONE_LINE_LIMIT and "\n" not in one_line:
        return one_line
    pad = " " * (indent + 4)
    body = "\n".join(pad + e for e in eqns)
    return f"{head}\n{body}\n{' ' * (indent + 2)}in {outs} }}"


def pp_program(program):
    """The text of `program`."""
    return _pp(program, _Names())
