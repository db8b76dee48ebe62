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
step gets what this one returned. The fastest plan that fits wins.
"""

import math

from fflow.errors import user_error

# (this module imports nothing of shard's: the planner's problem decodes its own SBP
# codes, and shard.py says how a state array is split)


def _local_bytes(aval, nd, hierarchy):
    n = math.prod(aval.shape) if aval.shape else 1
    pieces = 1
    for h, s in zip(hierarchy, nd):
        if s.is_split() and aval.shape:
            pieces *= min(h, aval.shape[s.axis]) or 1
    return -(-n // pieces) * aval.dtype.itemsize


def peak_memory(prob, sig_idx):
    """(peak bytes on one device, index of the equation where it is reached)."""
    n = len(prob.cands)
    h = prob.h
    have = prob.labels_of(sig_idx)
    delta = [0] * (n + 2)  # bytes that become live at step t (freed after their last)

    def live(a, b, nbytes):
        delta[a] += nbytes
        delta[b + 1] -= nbytes

    last = {}
    wants = {}
    for k in range(n):
        for i, w in zip(prob.eqn_ins[k], prob.cin[k][sig_idx[k]]):
            last[i] = k
            if w != have[i]:
                lo, hi = wants.get((i, w), (k, k))
                wants[(i, w)] = (min(lo, k), max(hi, k))
    outs = set(prob.out_ids)
    defined = {}
    for k in range(n):
        for i in prob.eqn_outs[k]:
            defined[i] = k
    for i, aval in enumerate(prob.avals):
        if have[i] is None:
            continue
        nbytes = _local_bytes(aval, prob.nd_of(have[i]), h)
        if i in defined:
            end = n if i in outs else last.get(i, defined[i])
            live(defined[i], end, nbytes)
        elif i < prob.n_inputs:
            live(0, n, nbytes)  # inputs, constants: held for the whole call
        elif i in last:
            live(last[i], last[i], nbytes)  # a literal, where it is read
    for (i, w), (lo, hi) in wants.items():
        live(lo, hi, _local_bytes(prob.avals[i], prob.nd_of(w), h))
    peak, at, cur = 0, 0, 0
    for t in range(n + 1):
        cur += delta[t]
        if cur > peak:
            peak, at = cur, t
    return peak, at


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


def fit_budget(
    make, split_of, in_sbps, out_specs, in_avals, out_avals, free_out, arg_of_leaf, limit, pl
):
    """The fastest ShardedProgram over the storage ladder whose peak fits `limit`.

    `make(in_sbps, out_specs)` plans one; `split_of(shape, hierarchy)` is how a state array
    is stored split (None: it cannot be); `arg_of_leaf[i]` is the positional argument of
    input leaf i, None where the user gave its SBP; `free_out[j]`: output j unannotated.
    """
    h = tuple(pl.hierarchy)
    free = [i for i, a in enumerate(arg_of_leaf) if a is not None]
    tried = []
    for rung in storage_ladder(arg_of_leaf, free, None):
        ins, outs = list(in_sbps), list(out_specs)
        by_aval = {}
        for j, a in enumerate(out_avals):
            if free_out[j]:
                by_aval.setdefault((a.shape, a.dtype), []).append(j)
        for i in sorted(rung):
            nd = split_of(in_avals[i].shape, h)
            if nd is None:
                continue
            ins[i] = nd
            js = by_aval.get((in_avals[i].shape, in_avals[i].dtype))
            if js:
                outs[js.pop(0)] = nd  # the next step gets this state as it came in
        sp = make(ins, outs)
        sp.peak_memory = peak_memory(sp.plan.problem, sp.plan.sig_index)[0]
        sp.memory_limit = limit
        sp.storage_rung = len(tried)
        tried.append(sp)
    fits = [sp for sp in tried if sp.peak_memory <= limit]
    if not fits:
        low = min(sp.peak_memory for sp in tried)
        raise user_error(
            ValueError,
            f"shard: no plan fits memory_limit={limit} bytes per device; the smallest "
            f"needs {low} bytes (with every unannotated state argument stored split). "
            "Fix: raise memory_limit, use more devices, or annotate more inputs as split.",
        )
    return min(fits, key=lambda sp: sp.plan.time)
