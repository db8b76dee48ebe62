"""IR passes shared by the backends: DCE, CSE, constant folding, elementwise fusion
grouping and buffer liveness (the last two in schedule.py, re-exported here).

The passes never change what a program computes, bit for bit:

* constant folding only evaluates equations whose inputs are all known, with the
  primitive's own implementation (so `1 + x*0` keeps `x`'s NaN; no algebra);
* DCE and CSE keep every equation of an effectful primitive (trait "effect",
  e.g. `fflow.debug.print`), in order.

Backends consume a *schedule*: the program's equations in order, where runs of
elementwise equations are replaced by `FusionGroup`s, plus a `Liveness` table
saying after which step each value (and each buffer, counting views) is dead.
"""

import time

import numpy as np
from fflow.lowering.effects import has_subprograms, is_effectful, subprograms
from fflow.primitives.convert import convert_element_type_p
from fflow.primitives.dot import dot_general_p
from fflow.primitives.shape import broadcast_in_dim_p, transpose_p

from fflow.core import Literal, Var

FOLD_MAX_SIZE = 1024  # fold array-valued results only while they stay small


# -- DCE ------------------------------------------------------------------------------


def dce(program):
    """Drop equations none of whose outputs is used (effectful ones always stay)."""
    live = {v for v in program.outvars if type(v) is Var}
    kept = []
    for eqn in reversed(program.eqns):
        if is_effectful(eqn) or any(v in live for v in eqn.outputs):
            kept.append(eqn)
            live.update(v for v in eqn.inputs if type(v) is Var)
    kept.reverse()
    used = [(v, c) for v, c in zip(program.constvars, program.consts) if v in live]
    return program.replace(eqns=kept, constvars=[v for v, _ in used], consts=[c for _, c in used])


# -- CSE ------------------------------------------------------------------------------


def _literal_key(lit):
    value = np.asarray(lit.value)
    # bytes, not ==: keeps 0.0 and -0.0 apart and makes NaN equal to itself
    return ("lit", value.dtype.str, value.tobytes(), lit.aval.weak_type)


def _params_key(params):
    items = []
    for k in sorted(params):
        v = params[k]
        if isinstance(v, np.ndarray):
            return None
        if isinstance(v, list):
            v = tuple(v)
        items.append((k, v))
    key = tuple(items)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def cse(program):
    """Merge equations that apply the same primitive to the same inputs and params."""
    rename = {}
    seen = {}
    eqns = []

    def sub(v):
        return v if type(v) is Literal else rename.get(v, v)

    def key_of(v):
        return _literal_key(v) if type(v) is Literal else v.id

    # identical constants (by identity) are one value already; fold equal consts too
    const_key = {}
    for v, c in zip(program.constvars, program.consts):
        arr = np.asarray(c) if not hasattr(c, "_trace") else None
        if arr is None or arr.size > FOLD_MAX_SIZE and not _is_splat(arr):
            continue
        k = (arr.dtype.str, arr.shape, _splat_bytes(arr))
        if k in const_key:
            rename[v] = const_key[k]
        else:
            const_key[k] = v

    for eqn in program.eqns:
        inputs = [sub(v) for v in eqn.inputs]
        eqn = eqn.replace(inputs=inputs) if inputs != eqn.inputs else eqn
        # effects run every time; rematerialised checkpoints must not merge with the
        # forward computation they recompute (prevent_cse)
        opaque = is_effectful(eqn) or eqn.params.get("prevent_cse", False)
        pkey = None if opaque else _params_key(eqn.params)
        if pkey is not None:
            key = (eqn.primitive, tuple(key_of(v) for v in inputs), pkey)
            prev = seen.get(key)
            if prev is not None and all(
                a.aval == b.aval for a, b in zip(prev.outputs, eqn.outputs)
            ):
                for a, b in zip(eqn.outputs, prev.outputs):
                    rename[a] = b
                continue
            seen[key] = eqn
        eqns.append(eqn)
    outvars = [sub(v) for v in program.outvars]
    return dce(program.replace(eqns=eqns, outvars=outvars))


def _is_splat(arr):
    return arr.ndim > 0 and all(s == 0 for s in arr.strides)


def _splat_bytes(arr):
    if _is_splat(arr):
        return ("splat", arr.reshape(-1)[:1].tobytes())
    return arr.tobytes()


# -- constant folding -----------------------------------------------------------------


def fold_constants(program):
    """Evaluate equations whose inputs are all constants, with the primitive's impl.

    Scalar results become literals; small array results (or broadcast scalars, kept
    as zero-stride views) become constants. Nothing is simplified algebraically.
    """
    known = {}
    for v, c in zip(program.constvars, program.consts):
        if not hasattr(c, "_trace"):
            arr = np.asarray(c)
            if arr.size <= FOLD_MAX_SIZE or _is_splat(arr):
                known[v] = arr
    new_consts = []
    eqns = []
    replace = {}

    def sub(v):
        return v if type(v) is Literal else replace.get(v, v)

    for eqn in program.eqns:
        inputs = [sub(v) for v in eqn.inputs]
        eqn = eqn.replace(inputs=inputs) if inputs != eqn.inputs else eqn
        folded = _try_fold(eqn, known)
        if folded is None:
            eqns.append(eqn)
            continue
        for var, value in zip(eqn.outputs, folded):
            if var.aval.shape == ():
                replace[var] = Literal(value, var.aval)
            else:
                known[var] = value
                new_consts.append((var, value))
    outvars = [sub(v) for v in program.outvars]
    return program.replace(
        eqns=eqns,
        outvars=outvars,
        constvars=list(program.constvars) + [v for v, _ in new_consts],
        consts=list(program.consts) + [c for _, c in new_consts],
    )


def _try_fold(eqn, known):
    prim = eqn.primitive
    if prim.impl is None or is_effectful(eqn) or has_subprograms(eqn):
        return None
    vals = []
    for v in eqn.inputs:
        if type(v) is Literal:
            vals.append(np.asarray(v.value, v.aval.dtype))
        elif v in known:
            vals.append(known[v])
        else:
            return None
    if any(v.aval.size > FOLD_MAX_SIZE for v in eqn.outputs):
        if prim is broadcast_in_dim_p and vals[0].size == 1:
            # a broadcast scalar stays a zero-stride view (no memory, no work)
            scalar = np.asarray(vals[0], eqn.outputs[0].aval.dtype).reshape(())
            return [np.broadcast_to(scalar, eqn.outputs[0].aval.shape)]
        splat = "elementwise" in prim.traits and all(a.ndim == 0 or _is_splat(a) for a in vals)
        if not splat:
            return None
        # an elementwise op of broadcast scalars is a broadcast scalar
        shape = eqn.outputs[0].aval.shape
        vals = [a.reshape(-1)[:1].reshape(()) if a.ndim else a for a in vals]
        out = _eval(prim, vals, eqn.params)
        if out is None:
            return None
        return [np.broadcast_to(np.asarray(out, eqn.outputs[0].aval.dtype), shape)]
    out = _eval(prim, vals, eqn.params)
    if out is None:
        return None
    outs = list(out) if prim.multiple_results else [out]
    result = []
    for var, o in zip(eqn.outputs, outs):
        o = np.asarray(o)
        if o.dtype != var.aval.dtype or o.shape != var.aval.shape:
            return None
        result.append(o)
    return result


def _eval(prim, vals, params):
    try:
        with np.errstate(all="ignore"):
            return prim.impl(*vals, **params)
    except Exception:  # leave it to run time, where the error names the user's line
        return None


# -- exact cast round trips -----------------------------------------------------------


def _widens_exactly(src, dst):
    src, dst = np.dtype(src), np.dtype(dst)
    if src == dst:
        return True
    if src.kind == "f" or src.name == "bfloat16":
        return dst.kind == "f" and dst.itemsize > src.itemsize and dst.name != "bfloat16"
    if src.kind in "iu" and dst.kind in "iu":
        return np.can_cast(src, dst, "safe")
    return False


def fold_cast_round_trips(program):
    """`convert(convert(x: T -> W), T)` with W wider than T (exact) is `x`, bit for bit.

    grad(amp(f)) produces these pairs (an upcast's transpose meets a downcast).
    """
    producer = {}
    replace = {}

    def sub(v):
        return v if type(v) is Literal else replace.get(v, v)

    eqns = []
    for e in program.eqns:
        inputs = [sub(v) for v in e.inputs]
        e = e.replace(inputs=inputs) if inputs != e.inputs else e
        if e.primitive is convert_element_type_p and type(inputs[0]) is Var:
            inner = producer.get(inputs[0])
            out = e.outputs[0]
            if inner is not None and type(inner.inputs[0]) is Var:
                x = inner.inputs[0]
                mid = inner.outputs[0].aval.dtype
                if x.aval.dtype == out.aval.dtype and _widens_exactly(x.aval.dtype, mid):
                    if x.aval.weak_type == out.aval.weak_type:
                        replace[out] = x
                        continue
            producer[out] = e
        eqns.append(e)
    if not replace:
        return program
    return dce(program.replace(eqns=eqns, outvars=[sub(v) for v in program.outvars]))


# -- dot followed by transpose ----------------------------------------------------------


def fold_dot_transpose(program):
    """`transpose(dot(a, b))` of a 2-D matmul -> `dot(b, a)` (a contiguous result).

    Reverse mode produces `dot(g, x)` with a transpose for weight gradients; doing
    the product the other way round saves the strided copy that reading the
    transposed view costs later.
    """
    uses = use_counts(program)
    producer = {}
    for e in program.eqns:
        if e.primitive is dot_general_p and _plain_matmul(e) and uses.get(e.outputs[0]) == 1:
            producer[e.outputs[0]] = e
    if not producer:
        return program
    dead = set()
    eqns = []
    for e in program.eqns:
        src = e.inputs[0] if e.inputs else None
        if (
            e.primitive is transpose_p
            and tuple(e.params["permutation"]) == (1, 0)
            and src in producer
        ):
            dot = producer[src]
            (lc, rc), _ = dot.params["dimension_numbers"]
            params = dict(dot.params, dimension_numbers=((tuple(rc), tuple(lc)), ((), ())))
            eqns.append(dot.replace(inputs=dot.inputs[::-1], params=params, outputs=e.outputs))
            dead.add(id(dot))
        else:
            eqns.append(e)
    eqns = [e for e in eqns if id(e) not in dead]
    # the swapped dot now sits where the transpose was: still after both operands
    return program.replace(eqns=eqns)


def _plain_matmul(e):
    (lc, rc), (lb, rb) = e.params["dimension_numbers"]
    a, b = e.inputs
    return not lb and len(lc) == 1 and a.aval.ndim == 2 and b.aval.ndim == 2


# -- the pipeline ---------------------------------------------------------------------


class PassReport:
    """What the passes did (read by `fflow.explain`)."""

    def __init__(self):
        self.times = {}
        self.counts = {}

    def run(self, name, fn, program):
        t0 = time.perf_counter()
        out = fn(program)
        self.times[name] = time.perf_counter() - t0
        self.counts[name] = len(out.eqns)
        return out


def optimize(program, report=None):
    """DCE, constant folding, CSE (which ends with DCE) — in that order."""
    report = report or PassReport()
    report.counts["input"] = len(program.eqns)
    program = report.run("dce", dce, program)
    program = report.run("fold", fold_constants, program)
    program = report.run("casts", fold_cast_round_trips, program)
    program = report.run("cse", cse, program)
    program = report.run("dot_t", fold_dot_transpose, program)
    program = report.run("pad_sums", fold_pad_sums, program)
    return program, report


from fflow.lowering.pad_sums import fold_pad_sums, use_counts  # noqa: E402

# fusion grouping and liveness live in schedule.py (it imports the helpers above)
from fflow.lowering.schedule import (  # noqa: E402
    FusionGroup,
    Liveness,
    default_may_alias,
    fusion_groups,
    is_fusible,
    liveness,
    step_inputs,
    step_outputs,
)

__all__ = [
    "dce",
    "cse",
    "fold_constants",
    "fold_cast_round_trips",
    "fold_dot_transpose",
    "optimize",
    "PassReport",
    "is_effectful",
    "has_subprograms",
    "subprograms",
    "fusion_groups",
    "FusionGroup",
    "is_fusible",
    "step_inputs",
    "step_outputs",
    "Liveness",
    "liveness",
    "default_may_alias",
]
