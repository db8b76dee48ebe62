"""Sums of zero-padded pieces that tile an axis become one `concatenate`.

The gradient of `q, k, v = qkv[..., :d], qkv[..., d:2d], qkv[..., 2d:]` is
`pad(ct_q) + pad(ct_k) + pad(ct_v)`: three full-size zero buffers and two passes
of adds where one concatenation writes each value once (measured on the transformer
block step: the pads and their adds took ~3 ms of the step on a quiet machine).
The result is the sum's: every position has one term that is not padding (x + 0 is x,
except that a -0.0 stays -0.0 where the sum gave +0.0; the two compare equal).
"""

from fflow.primitives.binary import add_p
from fflow.primitives.shape import concatenate_p, pad_p

from fflow.core import Literal, Var


def _piece(e, uses):
    """(axis, low, high, x) of a pad of one used-once value along a single axis with
    zeros, or None."""
    if e is None or e.primitive is not pad_p or uses.get(e.outputs[0]) != 1:
        return None
    x, value = e.inputs
    if type(value) is not Literal or value.value != 0 or type(x) is not Var:
        return None
    axes = [k for k, (lo, hi, it) in enumerate(e.params["padding_config"]) if lo or hi or it]
    if len(axes) != 1:
        return None
    lo, hi, it = e.params["padding_config"][axes[0]]
    if it or lo < 0 or hi < 0:
        return None
    return axes[0], lo, hi, x


def use_counts(program):
    """How many times each Var is read (by equations and as a program output)."""
    uses = {}
    for v in [v for e in program.eqns for v in e.inputs] + list(program.outvars):
        if type(v) is Var:
            uses[v] = uses.get(v, 0) + 1
    return uses


def fold_pad_sums(program):
    """`add(pad(a), pad(b))` whose pieces are adjacent along one axis -> one pad of
    `concatenate([a, b])` (no pad at all once the pieces cover the axis)."""
    uses = use_counts(program)
    producer, dead = {}, set()
    eqns = []
    changed = False
    for e in program.eqns:
        new = [e]
        if e.primitive is add_p and all(type(v) is Var for v in e.inputs):
            pa, pb = (producer.get(v) for v in e.inputs)
            a, b = _piece(pa, uses), _piece(pb, uses)
            if a is not None and b is not None and a[0] == b[0]:
                if a[1] > b[1]:
                    (a, pa), (b, pb) = (b, pb), (a, pa)
                axis, lo, _, x = a
                _, _, hi, y = b
                if lo + x.aval.shape[axis] == b[1] and x.aval.dtype == y.aval.dtype:
                    parts = _flat(x, axis, producer, uses, dead) + _flat(
                        y, axis, producer, uses, dead
                    )
                    new = _joined(e, pa, axis, lo, hi, x, y, parts)
                    dead.update((id(pa), id(pb)))
                    changed = True
        for n in new:
            for o in n.outputs:
                producer[o] = n
        eqns.extend(new)
    if not changed:
        return program
    eqns = [e for e in eqns if id(e) not in dead]
    return program.replace(eqns=eqns)


def _flat(x, axis, producer, uses, dead):
    # a used-once concatenate along the same axis (an earlier pair) joins this one
    e = producer.get(x)
    if e is not None and e.primitive is concatenate_p and e.params["dimension"] == axis:
        if uses.get(x, 1) == 1:  # (vars made here are used once)
            dead.add(id(e))
            return list(e.inputs)
    return [x]


def _joined(add, pad, axis, lo, hi, x, y, parts):
    out = add.outputs[0]
    shape = list(x.aval.shape)
    shape[axis] += y.aval.shape[axis]
    if lo == 0 and hi == 0:
        return [
            add.replace(
                primitive=concatenate_p, inputs=parts, params={"dimension": axis}, outputs=[out]
            )
        ]
    cat = Var(x.aval.update(shape=tuple(shape)))
    config = [(0, 0, 0)] * x.aval.ndim
    config[axis] = (lo, hi, 0)
    first = add.replace(
        primitive=concatenate_p, inputs=parts, params={"dimension": axis}, outputs=[cat]
    )
    second = pad.replace(
        inputs=[cat, pad.inputs[1]], params={"padding_config": tuple(config)}, outputs=[out]
    )
    return [first, second]


__all__ = ["fold_pad_sums"]
