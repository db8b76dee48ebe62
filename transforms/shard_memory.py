"""Per-device memory of a plan, from liveness, and storage strategies under a budget.

A device holds, at each equation: every input and constant (the caller holds them
for the whole call: parameters, optimizer state, the batch), every value computed
and not yet dead (its last consumer or the end, for outputs), and every converted
copy between the first and the last consumer that reads it. Each is counted at its
local size under the plan's SBP (split: one piece; broadcast and partial: whole).
The peak over the program is what `memory_limit=` bounds.

Under a budget, `shard` also chooses how unannotated state is stored
(`storage_ladder`): everything as given (broadcast: data parallelism), then the
last unannotated positional argument split (the optimizer state of
`step(params, opt_state, batch)`: ZeRO-1; gradients then reduce-scatter into it,
ZeRO-2), then the one before it as well (the parameters: ZeRO-3 / FSDP), each
matching output (same shape and dtype, in order) stored the same way so the next
step gets what this one returned. "Split" is over every mesh axis (shard.py
`_split_state`), so each device holds 1/p of the state on a 2-D mesh too. The
first rung whose plan fits wins: in the cost model it is also the fastest that fits
(`fit_budget`); rungs that cannot fit by `values_floor` are not planned.
"""

import math

from fflow.primitives.sbp_constraint import sbp_constraint_p
from fflow.transforms.shard_fsdp import eager_conversions, is_alias, local_bytes

from fflow.core import Literal
from fflow.errors import user_error

# (this module imports nothing of shard's: the planner's problem decodes its own SBP
# codes, and shard.py says how a state array is split)


_local_bytes = local_bytes  # (shard_print.py's name for it)


def peak_memory(prob, sig_idx):
    """(peak bytes on one device, index of the equation where it is reached)."""
    spans = buffers(prob, sig_idx)
    end = 3 * len(prob.cands) + 1
    delta = [0] * (end + 2)  # bytes that become live at slot t (freed after their last)
    for lo, hi, nbytes, _ in spans:
        delta[lo] += nbytes
        delta[hi + 1] -= nbytes
    peak, at, cur = 0, 0, 0
    for t in range(end + 1):
        cur += delta[t]
        if cur > peak:
            peak, at = cur, t
    return peak, min(at // 3, len(prob.cands))


def live_at(prob, sig_idx, t):
    """The buffers live on one device while equation t runs, largest first: (bytes, var
    id, N-D SBP it is held in, first and last equation)."""
    out = [
        (nbytes, key if type(key) is int else key[0], prob.nd_of(code), lo // 3, hi // 3)
        for lo, hi, nbytes, (key, code) in buffers(prob, sig_idx)
        if lo <= 3 * t + 1 <= hi
    ]
    return sorted(out, key=lambda b: -b[0])


def buffers(prob, sig_idx):
    """Every buffer one device holds under a plan: (first slot, last slot, bytes, (var id
    or (var id, code) of a converted copy, code)). Equation k has three slots, in the
    order the device runs them: 3k its inputs' conversions, 3k+1 the equation, 3k+2
    the conversions done as soon as its outputs exist (`eager_conversions`)."""
    n = len(prob.cands)
    h = prob.h
    have = prob.labels_of(sig_idx)
    out = []

    def live(a, b, nbytes, key, code):
        out.append((a, b, nbytes, (key, code)))

    def size(i, code):
        return local_bytes(prob.avals[i], prob.nd_of(code), h)

    eager = eager_conversions(prob, sig_idx, have)  # converted as soon as computed
    defined = {i: k for k in range(n) for i in prob.eqn_outs[k]}
    # buffers: a var (int id) as held, or a converted copy (var id, code) between its
    # first and last reader; an SBP constraint's output is the buffer it reads
    span = {}
    root = {}

    def touch(key, t):
        lo, hi = span.get(key, (t, t))
        span[key] = (min(lo, t), max(hi, t))

    for k in range(n):
        for i, w in zip(prob.eqn_ins[k], prob.cin[k][sig_idx[k]]):
            if w == have[i]:
                touch(root.get(i, i), 3 * k + 1)
                continue
            if i in eager:
                touch((i, w), 3 * defined[i] + 2)
            elif (i, w) not in span:
                touch(root.get(i, i), 3 * k)  # read by the conversion, before its first reader
                touch((i, w), 3 * k)
            touch((i, w), 3 * k + 1)
        if is_alias(prob, k):
            (o,) = prob.eqn_outs[k]
            i, w = prob.eqn_ins[k][0], prob.cin[k][sig_idx[k]][0]
            root[o] = root.get(i, i) if w == have[i] else (i, w)
    end = 3 * n + 1
    for i, r in zip(prob.out_ids, prob.out_req_codes):
        touch(root.get(i, i), end)
        w = prob.out_want(i, r, have[i])
        if w != have[i]:  # converted for the caller once the program is done
            touch((i, w), 3 * defined[i] + 2 if i in eager else end)
            touch((i, w), end)
    for i in range(len(prob.avals)):
        if have[i] is None or i in root:
            continue
        if i in defined:
            born = 3 * defined[i] + 1
            last = born + 1 if i in eager else span.get(i, (0, born))[1]
            live(born, max(last, born), size(i, have[i]), i, have[i])
        elif i < prob.n_inputs:
            live(0, end, size(i, have[i]), i, have[i])  # inputs, constants: all call long
        elif i in span:
            live(*span[i], size(i, have[i]), i, have[i])  # a literal, where it is read
    for key, (lo, hi) in span.items():
        if type(key) is tuple:
            live(lo, hi, size(*key), key, key[1])
    return out


def values_floor(program, devices):
    """A lower bound, over every plan of `program` on `devices` devices, of the bytes one
    device holds besides the inputs and constants at the moment the most is held (the
    peak of every plan is at least this plus the inputs' local bytes; `fit_budget`
    skips a storage rung whose bound is over the budget without planning it).

    Each value computed is held, by `buffers`' rules, from the slot its equation runs
    to its last reader's (the end for an output), in its own SBP or a converted copy;
    an SBP constraint's output is its input's buffer; every buffer of a value holds at
    least ceil(elements / devices) elements. Conversions' extra copies only add, so
    summing those minima over the values live at each slot bounds every plan's count.
    0 for a program with call-like equations (custom_jvp/vjp, checkpoint, nested
    shard): the planner inlines them, and values inside have other lifetimes."""
    eqns = program.eqns
    if any({"call", "sharded_call"} & e.primitive.traits for e in eqns):
        return 0
    root = {}  # SBP constraint output -> the var whose buffer it is
    first, last, size = {}, {}, {}
    for k, e in enumerate(eqns):
        for v in e.inputs:
            if type(v) is not Literal:
                last[root.get(v, v)] = 3 * k + 1
        if e.primitive is sbp_constraint_p and type(e.inputs[0]) is not Literal:
            root[e.outputs[0]] = root.get(e.inputs[0], e.inputs[0])
            continue
        for o in e.outputs:
            n = math.prod(o.aval.shape)
            first[o] = 3 * k + 1
            size[o] = -(-n // devices) * o.aval.dtype.itemsize
    end = 3 * len(eqns) + 1
    for v in program.outvars:
        if type(v) is not Literal:
            last[root.get(v, v)] = end
    delta = [0] * (end + 2)
    for v, lo in first.items():
        delta[lo] += size[v]
        delta[max(last.get(v, lo), lo) + 1] -= size[v]
    cur = peak = 0
    for d in delta:
        cur += d
        peak = max(peak, cur)
    return peak


def storage_ladder(arg_of_leaf, free, _unused=None):
    """The sets of unannotated leaves to store split, rung by rung: none, then those of
    the last argument that has any, then also the argument before it, ..."""
    args = sorted({arg_of_leaf[i] for i in free}, reverse=True)
    rungs = [set()]
    chosen = set()
    for a in args:
        chosen = chosen | {i for i in free if arg_of_leaf[i] == a}
        rungs.append(set(chosen))
    return rungs


# memory weights tried, in seconds per byte held per device relative to the plan's step
# time per byte of all values held whole (transforms/shard_fsdp.py `weigh_memory`)
MEMORY_FACTORS = (1.0, 8.0)

# the search options of rungs that split state (`fit_budget`)
LADDER_SEARCH = {"propagated": False, "viterbi_refined": False}


def fit_budget(
    make,
    split_of,
    in_sbps,
    out_specs,
    in_avals,
    out_avals,
    free_out,
    arg_of_leaf,
    limit,
    pl,
    program=None,
):
    """The first ShardedProgram up the storage ladder whose peak fits `limit`.

    `make(in_sbps, out_specs, per_use)` plans one (`per_use`: the input leaves to gather
    per use, transforms/shard_fsdp.py); `split_of(shape, hierarchy)` is how a state
    array is stored split (None: it cannot be); `arg_of_leaf[i]` is the positional
    argument of input leaf i, None where the user gave its SBP; `free_out[j]`: output
    j unannotated. When no rung fits, the last one is planned again with the leaves
    it split beyond the first split rung (the parameters) gathered per use (FSDP):
    more communication, so only when the budget forces it; then with memory weights.

    The first that fits is the fastest that fits: in the cost model each step up
    costs at least as much time. A plan of a rung is a plan of the rung below (the
    state read whole instead of split: slicing a broadcast value moves nothing, and
    the outputs that rung leaves free may stay split); a per-use plan is a plain one
    with more gathers; a memory weight trades time for bytes. So later rungs are not
    planned once one fits. A rung whose inputs plus `values_floor(program)` (the
    global program `make` plans) exceed `limit` cannot fit and is not planned either.

    A rung that splits state is planned without the search's start where splits only
    propagate from the inputs (shard_plan.py `_propagated`, meant for weights the user
    annotated): from state the ladder split it explores computing on the stored
    pieces, which was never the plan kept on any of the bench's 32 budgets at 24
    layers (4, 8, 2x2, 2x4 devices; same plans with and without it), at about a
    third of each plan's time. Its Viterbi starts are refined only where one is the
    best start: refining them was a third of a 2-D mesh's tight-budget planning, and
    the 32 plans kept were the same without it but one (0.01% fewer bytes).
    """
    h = tuple(pl.hierarchy)
    floor = 0 if program is None else values_floor(program, math.prod(h))
    free = [i for i, a in enumerate(arg_of_leaf) if a is not None]
    ladder = storage_ladder(arg_of_leaf, free, None)
    tried = []
    floors = []  # lower bounds of the peaks of the rungs not planned

    def attempt(rung, per_use=(), weight=0.0):
        ins, outs = list(in_sbps), list(out_specs)
        by_aval = {}
        for j, a in enumerate(out_avals):
            if free_out[j]:
                by_aval.setdefault((a.shape, a.dtype), []).append(j)
        split = set()
        for i in sorted(rung):
            nd = split_of(in_avals[i].shape, h)
            if nd is None:
                continue
            split.add(i)
            ins[i] = nd
            js = by_aval.get((in_avals[i].shape, in_avals[i].dtype))
            if js:
                outs[js.pop(0)] = nd  # the next step gets this state as it came in
        low = floor + sum(local_bytes(a, nd, h) for a, nd in zip(in_avals, ins))
        if low > limit:
            floors.append(low)
            return None
        # (state the ladder split: a lighter search, see above)
        search = LADDER_SEARCH if split else {}
        sp = make(ins, outs, sorted(split & set(per_use)), weight, **search)
        sp.peak_memory = peak_memory(sp.plan.problem, sp.plan.sig_index)[0]
        sp.memory_limit = limit
        sp.storage_rung = ladder.index(rung)  # (the rung of the storage ladder)
        sp.gathered_per_use = bool(per_use)
        tried.append(sp)
        return sp

    for rung in ladder:
        sp = attempt(rung)
        if sp is not None and sp.peak_memory <= limit:
            return sp
    if len(ladder) > 1:
        first = ladder[1] if len(ladder) > 2 else set()
        per_use = ladder[-1] - first
        sp = attempt(ladder[-1], per_use)
        # still too big: the time-optimal plan holds too much (activations replicated,
        # partial sums at full size); steer the search by memory, harder each time
        if sp is not None:  # (else no plan of this rung fits: its floor is over)
            prob = sp.plan.problem
            held = sum(local_bytes(prob.avals[i], (), h) for outs in prob.eqn_outs for i in outs)
            for factor in MEMORY_FACTORS:
                if sp.peak_memory <= limit:
                    break
                sp = attempt(ladder[-1], per_use, factor * sp.plan.time / max(held, 1))
            if sp.peak_memory <= limit:
                return sp
        low = min([sp.peak_memory for sp in tried] or floors)
        raise user_error(
            ValueError,
            f"shard: no plan fits memory_limit={limit} bytes per device; the smallest "
            f"needs {'' if tried else 'at least '}{low} bytes (with every unannotated "
            "state argument stored split, parameters gathered per use). Fix: raise "
            "memory_limit, use more devices, or annotate more inputs as split.",
        )
