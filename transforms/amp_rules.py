"""The AMP rule table, and what a primitive's own AMP rule is written with.

`amp_rules[prim]` is `rule(trace, prim, amp_class, tracers, params)` -> physical
output(s), for primitives whose AMP rewrite needs more than "cast the floating inputs
to the class's dtype, bind" (transforms/amp.py's default). Rules sit next to their
primitives (`dot_general` in primitives/dot.py, `convert_element_type` in
primitives/convert.py); this module is low in the layer order so those files can
import it.
"""

from fflow.transforms.amp_policy import FP32, KEEP, LOW

from fflow import dtypes
from fflow.dtypes import float32

amp_rules = {}


class Rounded:
    """A rule's result `value` that is to be rounded to `dtype` when first read."""

    __slots__ = ("value", "dtype")

    def __init__(self, value, dtype):
        self.value = value
        self.dtype = dtype


def widest(dts):
    out = dts[0]
    for d in dts[1:]:
        if d != out:
            out, _ = dtypes.promote_pairs((out, False), (d, False))
    return out


def keep(trace, ins, prim, params):
    """Bind in the dtypes of the un-rewritten program."""
    vals = [trace.cast(t, t.aval.dtype) if t.is_float else t.value for t in ins]
    return prim.bind(*vals, **params)


def target_dtype(trace, cls, ins):
    """The dtype the floating inputs of an equation of class `cls` are cast to, or None."""
    floats = [t for t in ins if t.is_float]
    if not floats:
        return None
    if cls == LOW:
        # float64 was asked for explicitly: AMP leaves it alone (as torch.autocast does)
        if any(t.aval.dtype.itemsize > 4 for t in floats):
            return KEEP
        return trace.policy.compute_dtype
    strong = [t._dtype for t in floats if not t.weak]
    wide = widest(strong or [t._dtype for t in floats])
    if cls == FP32 and wide.itemsize < 4:
        return float32
    return wide
