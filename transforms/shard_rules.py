"""SBP signatures: which input/output SBPs each primitive accepts (the `sbp_rules` table).

`sbp_rules[prim](in_avals, out_avals, **params)` returns a list of 1-D signatures
`Sig(ins, outs, local)`: one SBP per input and per output, for one mesh axis.
`local`, when given, is the per-device kernel `local(ctx, *xs)` that computes the
device's output from its local inputs (e.g. a gather with the shard's offset);
without it the device applies the primitive itself with shape parameters made
local. All-broadcast is always valid and added by `signatures()`. N-D signatures
are products of 1-D ones over mesh axes, filtered by the local shapes that every
device would see.

Families get their rules by trait ("elementwise", "reduction", "cumulative",
"shape", "indexing"); primitive files register specific rules with `def_sbp`.
"""

import functools
import itertools
from collections import namedtuple

import numpy as np

from fflow.core import ShapedArray
from fflow.sbp import B, P, Split, local_box, partial_max, partial_min

sbp_rules = {}
# primitives with no signature beyond all-broadcast, on purpose (with the reason)
broadcast_only = {}
# param name holding the output shape, replaced by the local shape on each device
shape_params = {}

Sig = namedtuple("Sig", ["ins", "outs", "local"], defaults=[None])


def def_sbp(prim, rule=None, *, shape_param=None):
    """Register `rule` as prim's SBP rule (usable as a decorator)."""
    if shape_param is not None:
        shape_params[prim] = shape_param
    if rule is None:
        return functools.partial(def_sbp, prim)
    sbp_rules[prim] = rule
    return rule


def def_broadcast_only(prim, reason):
    broadcast_only[prim] = reason


def _all_b(in_avals, out_avals):
    return Sig((B,) * len(in_avals), (B,) * len(out_avals))


# ----------------------------------------------------------------------------
# Family rules

# Primitive.sbp_partial -> the partial SBP of that kind
_PARTIAL = {"sum": P, "max": partial_max, "min": partial_min}


def _is_float(dtype):
    return dtype.kind == "f" or dtype.name == "bfloat16"


def elementwise_rule(prim, in_avals, out_avals, **params):
    (out,) = out_avals
    sigs = []
    for k in range(out.ndim):
        ins = tuple(Split(k) if a.ndim == out.ndim else B for a in in_avals)
        sigs.append(Sig(ins, (Split(k),)))
    n = len(in_avals)
    traits = prim.traits  # the facts are declared on the primitives (primitives/*.py)
    linear = "linear" in traits
    if "cast" in traits:
        # float -> float casts commute with sums, but a narrowing cast of each partial
        # (f32 -> f16) rounds every device's part: sum in the wider type instead
        src, dst = in_avals[0].dtype, out.dtype
        linear = _is_float(src) and _is_float(dst) and dst.itemsize >= src.itemsize
    if linear:
        sigs.append(Sig((P,) * n, (P,)))
    if "monotone_up" in traits and n == 1:  # increasing: commutes with max and min
        sigs += [Sig((partial_max,), (partial_max,)), Sig((partial_min,), (partial_min,))]
    if "monotone_down" in traits and n == 1:
        sigs += [Sig((partial_max,), (partial_min,)), Sig((partial_min,), (partial_max,))]
    if prim.sbp_partial in ("max", "min") and n == 2:
        pm = partial_max if prim.sbp_partial == "max" else partial_min
        sigs += [Sig((pm, pm), (pm,)), Sig((pm, B), (pm,)), Sig((B, pm), (pm,))]
    if "linear_in_each" in traits:
        sigs += [Sig((P, B), (P,)), Sig((B, P), (P,))]
    if "linear_in_first" in traits:
        sigs.append(Sig((P, B), (P,)))
    if "linear_in_cases" in traits:
        sigs.append(Sig((B,) + (P,) * (n - 1), (P,)))
    return sigs


def reduction_rule(prim, in_avals, out_avals, *, axes, **params):
    (x,) = in_avals
    kept = [i for i in range(x.ndim) if i not in axes]
    sigs = [Sig((Split(k),), (Split(kept.index(k)),)) for k in kept]
    partial_of = _PARTIAL.get(prim.sbp_partial)
    if partial_of is not None:
        sigs += [Sig((Split(a),), (partial_of,)) for a in axes]
        sigs.append(Sig((partial_of,), (partial_of,)))
    return sigs


def cumulative_rule(prim, in_avals, out_avals, *, axis, reverse=False):
    (x,) = in_avals
    sigs = [Sig((Split(k),), (Split(k),)) for k in range(x.ndim) if k != axis]
    partial = _PARTIAL.get(prim.sbp_partial)
    if partial is not None:
        sigs.append(Sig((partial,), (partial,)))
    return sigs


_family_rules = {
    "elementwise": elementwise_rule,
    "reduction": reduction_rule,
    "cumulative": cumulative_rule,
}


def rule_of(prim):
    rule = sbp_rules.get(prim)
    if rule is not None:
        return rule
    for trait, fam in _family_rules.items():
        if trait in prim.traits:
            return functools.partial(fam, prim)
    return None


def passthrough_partials(sigs, n_extra_b=0):
    """Append P -> P, P(max) -> P(max), P(min) -> P(min) (ops that commute with all three)."""
    for a in (P, partial_max, partial_min):
        sigs.append(Sig((a,) + (B,) * n_extra_b, (a,)))
    return sigs


# all-broadcast on purpose, by trait (families of primitives; single primitives call
# def_broadcast_only next to their definition)
broadcast_only_traits = {
    "named_axis": "named-axis collectives (psum, ...) belong to vmap, which removes them "
    "before shard plans a program",
    "collective": "a per-device collective; shard inserts it, never plans it",
}
CALL_REPLICATED = (
    "a call: shard plans its body (inlined, see shard_exec.inline_calls); only a call "
    "without a traced body runs whole on every device"
)


def broadcast_only_reason(prim):
    if prim in broadcast_only:
        return broadcast_only[prim]
    for trait, reason in broadcast_only_traits.items():
        if trait in prim.traits:
            return reason
    return None


def has_signatures(prim):
    return rule_of(prim) is not None or broadcast_only_reason(prim) is not None


# ----------------------------------------------------------------------------
# N-D signatures


class LocalCtx:
    """What a device knows when running one equation: its boxes in logical coordinates."""

    __slots__ = ("in_boxes", "out_boxes", "in_avals", "out_avals", "params", "out_sbps")

    def __init__(self, in_boxes, out_boxes, in_avals, out_avals, params, out_sbps):
        self.in_boxes = in_boxes
        self.out_boxes = out_boxes
        self.in_avals = in_avals
        self.out_avals = out_avals
        self.params = params
        self.out_sbps = out_sbps

    def out_shape(self, i=0):
        return tuple(b - a for a, b in self.out_boxes[i])


_sig_cache = {}


def _key(prim, in_avals, out_avals, params, hierarchy):
    try:
        key = (prim, tuple(in_avals), tuple(out_avals), hierarchy, freeze(params))
        hash(key)
        return key
    except TypeError:
        return None


def freeze(x):
    """`x` (primitive params) as nested tuples, for a cache key; TypeError if it holds an array."""
    if isinstance(x, dict):
        return tuple(sorted((k, freeze(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple)):
        return tuple(freeze(v) for v in x)
    if isinstance(x, np.ndarray):
        raise TypeError("unhashable")
    return x


def signatures(prim, in_avals, out_avals, params, hierarchy):
    """Valid N-D signatures (tuples of per-mesh-axis SBP per input/output) for one eqn.

    Size-1 mesh axes take B only (every SBP is the same there). The first entry
    is all-broadcast.
    """
    key = _key(prim, in_avals, out_avals, params, hierarchy)
    if key is not None and key in _sig_cache:
        return _sig_cache[key]
    rule = rule_of(prim)
    one_d = [_all_b(in_avals, out_avals)]
    if rule is not None:
        for sig in rule(in_avals, out_avals, **params):
            if sig not in one_d:
                one_d.append(sig)
    per_axis = [one_d if h > 1 else one_d[:1] for h in hierarchy]
    out = []
    for combo in itertools.product(*per_axis):
        locals_ = {s.local for s in combo if s.local is not None}
        if len(locals_) > 1:
            continue
        ins = tuple(tuple(s.ins[i] for s in combo) for i in range(len(in_avals)))
        outs = tuple(tuple(s.outs[i] for s in combo) for i in range(len(out_avals)))
        local = next(iter(locals_)) if locals_ else None
        if _valid(prim, in_avals, out_avals, params, hierarchy, ins, outs, local):
            out.append(Sig(ins, outs, local))
    if key is not None:
        _sig_cache[key] = out
    return out


def _fits(aval, nd, hierarchy):
    for s in nd:
        if s.is_split() and not 0 <= s.axis < aval.ndim:
            return False
    for axis in range(aval.ndim):
        pieces = int(np.prod([h for h, s in zip(hierarchy, nd) if s == Split(axis)] or [1]))
        if pieces > 1 and aval.shape[axis] < pieces:
            return False
    return True


def _valid(prim, in_avals, out_avals, params, hierarchy, ins, outs, local):
    for a, nd in zip(list(in_avals) + list(out_avals), list(ins) + list(outs)):
        if not _fits(a, nd, hierarchy):
            return False
    if local is not None or prim.abstract_eval is None:
        return True
    # every device's local shapes must agree with the primitive applied locally
    for coords in itertools.product(*[range(h) for h in hierarchy]):
        local_in = [
            ShapedArray(_shape(a, nd, hierarchy, coords), a.dtype, a.weak_type)
            for a, nd in zip(in_avals, ins)
        ]
        local_out = [_shape(a, nd, hierarchy, coords) for a, nd in zip(out_avals, outs)]
        p = localize_params(prim, params, local_out)
        try:
            got = prim.abstract_eval(*local_in, **p)
        except Exception:  # noqa: BLE001  (a shape error means: not valid here)
            return False
        got = got if prim.multiple_results else [got]
        if [tuple(g.shape) for g in got] != local_out:
            return False
    return True


def _shape(aval, nd, hierarchy, coords):
    return tuple(b - a for a, b in local_box(aval.shape, nd, hierarchy, coords))


def localize_params(prim, params, local_out_shapes):
    name = shape_params.get(prim)
    if name is None:
        return params
    p = dict(params)
    p[name] = tuple(local_out_shapes[0])
    return p


def apply_local(prim, sig, ctx, xs, params):
    """Run one equation on one device (binds on the current trace)."""
    if sig.local is not None:
        out = sig.local(ctx, *xs)
        return out
    p = localize_params(prim, params, [ctx.out_shape(i) for i in range(len(ctx.out_boxes))])
    return prim.bind(*xs, **p)


__all__ = [
    "sbp_rules",
    "Sig",
    "def_sbp",
    "signatures",
]
