"""ZeRO-3 / FSDP support of the planner: parameters gathered per use, gradients
reduce-scattered as they are computed, and a memory weight for the search.

Gather per use (`gather_per_use`): a parameter stored split is read by the forward
pass of its layer and again, much later, by the backward pass. Converted once, its
gathered copy would be shared by both readers and stay live the whole step (every
layer's full weights at once). FSDP instead all-gathers it just before each use and
frees the copy after the use. Here each group of readers (readers with no matmul of
other values between them, before the optimizer tail) reads the parameter through
two SBP constraints: a copy in the stored SBP (the stored piece itself: nothing
moves, nothing is allocated), then that copy gathered to broadcast. So each group
pays its own all-gather (priced by the cost model like any conversion) and its
gathered value lives from the group's first reader to its last
(transforms/shard_memory.py counts it so; the executor frees it there,
transforms/shard_exec.py). The gradients (values shaped as such a parameter that
cross into the optimizer tail) get a constraint to the stored SBP right where they
are computed: reduce-scattered at once (ZeRO-2), the full partial sum freed.

Shrinking conversions (`eager_conversions`): a value all of whose readers want one
other SBP that holds fewer bytes per device (a partial sum reduce-scattered, a
broadcast value sliced) is converted right after it is computed, so the larger
value is freed at once instead of living until its first reader.

Memory weight (`weigh_memory`): the planner minimises time; under a budget that its
fastest plan misses, `fit_budget` plans again with every candidate signature also
paying seconds per byte its outputs hold per device, so activations stay split.

Example:
    >>> import fflow.numpy as jnp
    >>> from fflow.core import ShapedArray
    >>> from fflow.sbp import split as S
    >>> from fflow.transforms.staging import trace_to_program
    >>> a = ShapedArray((4, 4), jnp.float32)
    >>> prog = trace_to_program(lambda w, x: [(jnp.sin(x @ w) @ x) @ w], [a, a])
    >>> new = gather_per_use(prog, {0: (S(0),)})  # w: stored S(0), used twice
    >>> [e.primitive.name for e in new.eqns]  # doctest: +NORMALIZE_WHITESPACE
    ['sbp_constraint', 'sbp_constraint', 'dot_general', 'sin', 'dot_general',
     'sbp_constraint', 'sbp_constraint', 'dot_general']
"""

import itertools
import math
import weakref

from fflow.primitives.dot import dot_general_p
from fflow.primitives.sbp_constraint import sbp_constraint_p
from fflow.primitives.shape import reshape_p, transpose_p

from fflow.core import Eqn, Literal, Program, Var
from fflow.sbp import B

__all__ = [
    "gather_per_use",
    "source_of",
    "inserted",
    "use_groups",
    "eager_conversions",
    "is_alias",
    "local_bytes",
    "weigh_memory",
]


def local_bytes(aval, nd, hierarchy):
    """Bytes one device holds of `aval` under N-D SBP `nd` (split: its piece, rounded up;
    broadcast and partial: the whole value)."""
    n = math.prod(aval.shape) if aval.shape else 1
    pieces = 1
    for h, s in zip(hierarchy, nd):
        if s.is_split() and aval.shape:
            pieces *= min(h, aval.shape[s.axis]) or 1
    return -(-n // pieces) * aval.dtype.itemsize


def _last_matmul(program):
    return max((k for k, e in enumerate(program.eqns) if e.primitive is dot_general_p), default=-1)


def use_groups(program, var):
    """The equation indices reading `var` before the optimizer tail (the equations after
    the last matmul), in groups: a new group starts where a matmul not reading `var`
    runs between two readers (a layer's forward and its backward)."""
    return _use_groups(_Readers(program), var)


class _Readers:
    """One pass over a program for `use_groups` of many vars: matmuls up to each
    equation, and each var's readers before the optimizer tail."""

    def __init__(self, program):
        self.heavy = list(
            itertools.accumulate(int(e.primitive is dot_general_p) for e in program.eqns)
        )
        self.of = {}
        for k, e in enumerate(program.eqns[: _last_matmul(program) + 1]):
            for v in e.inputs:
                if type(v) is not Literal:
                    ks = self.of.setdefault(v, [])
                    if not ks or ks[-1] != k:  # (a var read twice by one equation)
                        ks.append(k)


def _use_groups(readers, var):
    heavy = readers.heavy
    groups = []
    for k in readers.of.get(var, ()):
        # matmuls strictly between the previous reader and this one
        if groups and heavy[k - 1] - heavy[groups[-1][-1]] == 0:
            groups[-1].append(k)
        else:
            groups.append([k])
    return groups


def gather_per_use(program, stored):
    """`program` with each input `stored` names (invar index -> its stored N-D SBP) read
    through two SBP constraints per group of its readers (`use_groups`), placed just
    before the group's first reader: a copy in the stored SBP (the stored piece
    itself), then that copy gathered to broadcast. Each group thus all-gathers the
    parameter for itself (FSDP: forward and backward each gather it), and the gathered
    copy is dead after the group's last reader. Inputs read by one group are left to
    the planner (one gather, dead after its readers anyway). The same `program` and
    `stored` give the same program object (memory_limit plans it with several memory
    weights; the planner reuses its per-program work)."""
    key = tuple(sorted((i, tuple(nd)) for i, nd in stored.items()))
    memo = _per_use.setdefault(program, {})
    if key not in memo:
        new = _gather_per_use(program, stored)
        memo[key] = None if new is program else new  # (no reference back to the key)
        if new is not program:
            _source[new] = source_of(program)
    got = memo[key]
    return program if got is None else got


_per_use = weakref.WeakKeyDictionary()  # program -> {stored items: gather_per_use's program}
_source = weakref.WeakKeyDictionary()  # gather_per_use's program -> the program it rewrote


def source_of(program):
    """The program `gather_per_use` rewrote into `program` (itself for any other): most
    of their equations are the same objects, so the planner shares per-equation work."""
    return _source.get(program, program)


def _gather_per_use(program, stored):
    copies = {}  # eqn index -> [(input var, copy var, gathered var, sbp)] to put before it
    rename = {}  # (eqn index, input var) -> gathered var
    readers = _Readers(program) if stored else None
    for i, nd in stored.items():
        v = program.invars[i]
        groups = _use_groups(readers, v)
        if len(groups) < 2:
            continue
        for g in groups:
            c, full = Var(v.aval), Var(v.aval)
            copies.setdefault(g[0], []).append((v, c, full, tuple(nd)))
            for k in g:
                rename[(k, v)] = full
    if not copies:
        return program
    split = {}  # (shape, dtype) -> stored SBP of the parameters gathered per use
    for i, nd in stored.items():
        split.setdefault((program.invars[i].aval.shape, program.invars[i].aval.dtype), nd)
    grads = _gradients(program, split)
    eqns = []
    outvars = list(program.outvars)
    for k, e in enumerate(program.eqns):
        for v, c, full, nd in copies.get(k, ()):
            eqns.append(Eqn(sbp_constraint_p, [v], {"sbp": nd}, [c], e.source_info))
            bcast = (B,) * len(nd)
            eqns.append(Eqn(sbp_constraint_p, [c], {"sbp": bcast}, [full], e.source_info))
        if any((k, v) in rename for v in e.inputs if type(v) is not Literal):
            e = e.replace(
                inputs=[v if type(v) is Literal else rename.get((k, v), v) for v in e.inputs]
            )
        eqns.append(e)
        for o in e.outputs:
            if o in grads:  # reduce-scattered at once into the stored SBP
                g = Var(o.aval)
                key = (o.aval.shape, o.aval.dtype)
                eqns.append(Eqn(sbp_constraint_p, [o], {"sbp": split[key]}, [g], e.source_info))
                rename.update({(r, o): g for r in grads[o]})
                outvars = [g if w is o else w for w in outvars]
    new = Program(program.invars, program.constvars, eqns, outvars, program.consts)
    made = {e.outputs[0].id for e in eqns if e.primitive is sbp_constraint_p}
    made -= {e.outputs[0].id for e in program.eqns if e.primitive is sbp_constraint_p}
    uses = sum(len(c) for c in copies.values())
    _inserted[new] = (frozenset(made), uses, len(grads))
    return new


_inserted = weakref.WeakKeyDictionary()  # program -> (constraint output ids, uses, grads)


def inserted(program):
    """(ids of the output vars of the SBP constraints `gather_per_use` put into `program`,
    number of parameter uses it gathers, number of gradients it reduce-scatters); empty
    for any other program (shard_print.py lists them apart from the user's with_sbp)."""
    return _inserted.get(program, (frozenset(), 0, 0))


def _gradients(program, split):
    """{var: its readers} of the values crossing into the optimizer tail (computed by the
    last matmul or before, or a reshape/transpose of one, read only after it) shaped
    as a parameter gathered per use:
    the gradients, reduce-scattered where they are computed (ZeRO-2)."""
    last = _last_matmul(program)
    defined = {o: k for k, e in enumerate(program.eqns[: last + 1]) for o in e.outputs}
    for e in program.eqns[last + 1 :]:  # the last gradient, transposed after its matmul
        if e.primitive in (transpose_p, reshape_p) and e.inputs[0] in defined:
            defined.update({o: None for o in e.outputs})
    readers = {}
    for k, e in enumerate(program.eqns):
        for v in e.inputs:
            if type(v) is not Literal and v in defined:
                readers.setdefault(v, []).append(k)
    return {
        v: ks
        for v, ks in readers.items()
        if (v.aval.shape, v.aval.dtype) in split
        and v.aval.dtype.kind == "f"
        and all(k > last for k in ks)
    }


def is_alias(prob, k):
    """Whether equation k's output is its input's buffer as the equation reads it (an SBP
    constraint: the executor passes on the input, converted if it has to be)."""
    return prob.program.eqns[k].primitive is sbp_constraint_p


def eager_conversions(prob, sig_idx, have):
    """{var id: SBP code} of the computed values to convert right after they are made:
    every reader and output wants that one SBP, and it holds fewer bytes per device
    than the value as computed."""

    def size(i, code):
        return local_bytes(prob.avals[i], prob.nd_of(code), prob.h)

    wants = {}
    for k, s in enumerate(sig_idx):
        for i, w in zip(prob.eqn_ins[k], prob.cin[k][s]):
            wants.setdefault(i, set()).add(w)
    for i, r in zip(prob.out_ids, prob.out_req_codes):
        wants.setdefault(i, set()).add(prob.out_want(i, r, have[i]))
    out = {}
    for k in range(len(sig_idx)):
        if prob.program.eqns[k].primitive is sbp_constraint_p:
            continue  # (its output is converted where the constraint says)
        for i in prob.eqn_outs[k]:
            ws = wants.get(i)
            if not ws or len(ws) != 1:
                continue
            (w,) = ws
            if w != have[i] and size(i, w) < size(i, have[i]):
                out[i] = w
    return out


def weigh_memory(prob, weight):
    """Under memory pressure (transforms/shard_memory.py `fit_budget`), every candidate
    signature of the planner's problem `prob` also pays `weight` seconds per byte its
    outputs hold per device, so the search prefers plans that hold less (activations
    split along the batch rather than replicated). Replaces `prob.comp` by the
    weighted costs and returns the added part per equation and candidate (a Plan
    reports its time without it)."""
    cache = {}
    pen = []
    for k, cands in enumerate(prob.cands):
        hit = cache.get(id(cands))  # (equations of one signature list share their costs)
        if hit is None:
            avals = [prob.avals[i] for i in prob.eqn_outs[k]]
            extra = [
                weight * sum(local_bytes(a, prob.nd_of(c), prob.h) for a, c in zip(avals, cout))
                for cout in prob.cout[k]
            ]
            hit = cache[id(cands)] = ([c + e for c, e in zip(prob.comp[k], extra)], extra)
        prob.comp[k] = hit[0]
        pen.append(hit[1])
    return pen
