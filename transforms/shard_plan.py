"""The SBP planner: one signature per equation, minimising communication bytes.

Inputs carry the user's SBPs (or their global arrays' SBPs); outputs either have
a requested SBP or keep what their producer gives (partial values are finished
to broadcast unless partial outputs are allowed, as for eager global arrays).
`with_sbp` constraints are equations with exactly one signature.

Two passes: a greedy pass in topological order that picks, for each equation,
the signature whose inputs are cheapest to box from what the producers made
("match producers first"; ties prefer an exact match), then, for small programs,
an exhaustive branch-and-bound search over all signature choices that starts
from the greedy cost and keeps the plan with the fewest bytes.
"""

import numpy as np
from fflow.transforms.shard_boxing import boxing_bytes
from fflow.transforms.shard_rules import Sig, signatures

from fflow.core import Literal
from fflow.sharding import B

SEARCH_NODE_LIMIT = 20000


class Plan:
    """The chosen SBP of every var and signature of every equation, with the total bytes."""

    def __init__(self, var_sbp, eqn_sigs, out_sbps, total_bytes):
        self.var_sbp = var_sbp
        self.eqn_sigs = eqn_sigs
        self.out_sbps = out_sbps
        self.bytes = total_bytes


def _sbp_of(var_sbp, v, ndim):
    if type(v) is Literal:
        return (B,) * ndim
    return var_sbp[v]


def finish_partial(nd):
    """Partial SBPs become broadcast (what a caller expects from an unannotated output)."""
    return tuple(B if s.is_partial() else s for s in nd)


class _Problem:
    def __init__(self, program, pl, in_sbps, out_sbps, allow_partial_out, constraint_prim):
        self.program = program
        self.pl = pl
        self.h = pl.hierarchy
        self.out_req = out_sbps
        self.allow_partial_out = allow_partial_out
        self.init = {}
        for v, s in zip(program.invars, in_sbps):
            self.init[v] = tuple(s)
        for v in program.constvars:
            self.init[v] = (B,) * pl.ndim
        self.cands = []
        for eqn in program.eqns if constraint_prim is not None else ():
            if eqn.primitive is constraint_prim:
                nd = eqn.params["sbp"]
                self.cands.append([Sig((nd,), (nd,))])
                continue
            in_avals = [v.aval for v in eqn.inputs]
            out_avals = [v.aval for v in eqn.outputs]
            self.cands.append(signatures(eqn.primitive, in_avals, out_avals, eqn.params, self.h))

    def in_cost(self, var_sbp, eqn, sig):
        nbytes = mism = 0
        for v, want in zip(eqn.inputs, sig.ins):
            have = _sbp_of(var_sbp, v, len(self.h))
            if have != want:
                mism += 1
                nbytes += boxing_bytes(v.aval.shape, v.aval.dtype, self.h, have, want)
        return nbytes, mism

    def final_sbps(self, var_sbp):
        outs = []
        for v, req in zip(self.program.outvars, self.out_req):
            have = _sbp_of(var_sbp, v, len(self.h))
            if req is None:
                req = have if self.allow_partial_out else finish_partial(have)
            outs.append(tuple(req))
        return outs

    def out_cost(self, var_sbp):
        nbytes = mism = 0
        for v, want in zip(self.program.outvars, self.final_sbps(var_sbp)):
            have = _sbp_of(var_sbp, v, len(self.h))
            if have != want:
                mism += 1
                nbytes += boxing_bytes(v.aval.shape, v.aval.dtype, self.h, have, want)
        return nbytes, mism


def plan_program(program, pl, in_sbps, out_sbps, allow_partial_out=False, search=True):
    """Plan `program` (global view) on placement `pl`; returns a Plan."""
    from fflow.transforms.shard import sbp_constraint_p

    prob = _Problem(program, pl, in_sbps, out_sbps, allow_partial_out, sbp_constraint_p)
    var_sbp, sigs, cost = _greedy(prob)
    if search and len(program.eqns) <= 40:
        found = _search(prob, cost)
        if found is not None:
            var_sbp, sigs, cost = found
    return Plan(var_sbp, sigs, prob.final_sbps(var_sbp), cost[0])


def fixed_plan(program, pl, in_sbps, out_sbps, sigs):
    """A Plan with the given signature per equation (no search)."""
    prob = _Problem(program, pl, in_sbps, out_sbps, True, None)
    var_sbp = dict(prob.init)
    total = 0
    for eqn, sig in zip(program.eqns, sigs):
        total += prob.in_cost(var_sbp, eqn, sig)[0]
        for v, s in zip(eqn.outputs, sig.outs):
            var_sbp[v] = s
    total += prob.out_cost(var_sbp)[0]
    return Plan(var_sbp, list(sigs), prob.final_sbps(var_sbp), total)


def _greedy(prob):
    var_sbp = dict(prob.init)
    sigs = []
    total = [0, 0]
    for eqn, cands in zip(prob.program.eqns, prob.cands):
        best, best_key = None, None
        for i, sig in enumerate(cands):
            nbytes, mism = prob.in_cost(var_sbp, eqn, sig)
            key = (nbytes, mism, i)
            if best_key is None or key < best_key:
                best, best_key = sig, key
        sigs.append(best)
        total[0] += best_key[0]
        total[1] += best_key[1]
        for v, s in zip(eqn.outputs, best.outs):
            var_sbp[v] = s
    ob, om = prob.out_cost(var_sbp)
    return var_sbp, sigs, (total[0] + ob, total[1] + om)


def _search(prob, bound):
    """Branch and bound over signature choices; None if nothing beats `bound` in budget."""
    eqns = prob.program.eqns
    best = [None, bound]
    budget = [SEARCH_NODE_LIMIT]
    var_sbp = dict(prob.init)
    chosen = []

    def rec(k, cost):
        if budget[0] <= 0:
            return
        budget[0] -= 1
        if k == len(eqns):
            ob, om = prob.out_cost(var_sbp)
            total = (cost[0] + ob, cost[1] + om)
            if total < best[1]:
                best[0] = (dict(var_sbp), list(chosen), total)
                best[1] = total
            return
        eqn = eqns[k]
        scored = []
        for sig in prob.cands[k]:
            nbytes, mism = prob.in_cost(var_sbp, eqn, sig)
            scored.append(((cost[0] + nbytes, cost[1] + mism), sig))
        scored.sort(key=lambda t: t[0])
        for c, sig in scored:
            if c >= best[1]:
                break
            chosen.append(sig)
            for v, s in zip(eqn.outputs, sig.outs):
                var_sbp[v] = s
            rec(k + 1, c)
            chosen.pop()

    rec(0, (0, 0))
    return best[0]


def total_bytes_of(plan):
    return int(np.int64(plan.bytes))
