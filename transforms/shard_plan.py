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

from fflow.transforms.shard_boxing import plan_boxing
from fflow.transforms.shard_rules import Sig, signatures

from fflow.core import Literal
from fflow.sharding import B

SEARCH_NODE_LIMIT = 4000
FREE_CONVERSION = 1e-3
TIE_WEIGHT = 1e-7  # far below one conversion even summed over a large program


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

    def in_cost(self, var_sbp, eqn, sig, boxed=()):
        """(bytes, conversions) to give `eqn` the inputs of `sig`; pairs in `boxed`
        (var, sbp) are already converted for an earlier consumer and cost nothing."""
        nbytes = mism = 0
        here = []  # an operand used twice (x * x) converts once
        for v, want in zip(eqn.inputs, sig.ins):
            have = _sbp_of(var_sbp, v, len(self.h))
            if have != want and (v, want) not in boxed:
                if type(v) is not Literal:
                    if (v, want) in here:
                        continue
                    here.append((v, want))
                b, m = _conversion_cost(v, have, want, self.h)
                nbytes, mism = nbytes + b, mism + m
        return nbytes, mism + self.replicated(sig)

    def replicated(self, sig):
        """A tie-breaker below one conversion: the share of each output every device
        computes, so work is split (not replicated) whenever that costs no bytes."""
        share = 0.0
        for nd in sig.outs:
            pieces = 1
            for h, s in zip(self.h, nd):
                if s.is_split():
                    pieces *= h
            share += 1.0 / pieces
        return share * TIE_WEIGHT

    def final_sbps(self, var_sbp):
        outs = []
        for v, req in zip(self.program.outvars, self.out_req):
            have = _sbp_of(var_sbp, v, len(self.h))
            if req is None:
                req = have if self.allow_partial_out else finish_partial(have)
            outs.append(tuple(req))
        return outs

    def out_cost(self, var_sbp, boxed=()):
        nbytes = mism = 0
        seen = set(boxed)
        for v, want in zip(self.program.outvars, self.final_sbps(var_sbp)):
            have = _sbp_of(var_sbp, v, len(self.h))
            if have != want and (v, want) not in seen:
                seen.add((v, want))
                b, m = _conversion_cost(v, have, want, self.h)
                nbytes, mism = nbytes + b, mism + m
        return nbytes, mism

    def total(self, sigs):
        """Exact (bytes, conversions) of a full choice; each (var, sbp) converts once."""
        var_sbp = dict(self.init)
        boxed = set()
        nbytes = mism = 0
        for eqn, sig in zip(self.program.eqns, sigs):
            b, m = self.in_cost(var_sbp, eqn, sig, boxed)
            nbytes, mism = nbytes + b, mism + m
            boxed.update(_pairs(var_sbp, eqn, sig, len(self.h)))
            for v, o in zip(eqn.outputs, sig.outs):
                var_sbp[v] = o
        b, m = self.out_cost(var_sbp, boxed)
        return var_sbp, (nbytes + b, mism + m)


def _conversion_cost(v, have, want, hierarchy):
    """(bytes, latency): each communicating collective counts 1 (fewer, larger messages
    win a tie in bytes: an all-reduce over a reduce-scatter + all-gather), a local
    conversion (slice, pad) counts 1/1000."""
    bp = plan_boxing(v.aval.shape, v.aval.dtype, hierarchy, have, want)
    calls = sum(1 for st in bp.steps if st.bytes)
    return bp.bytes, calls if calls else FREE_CONVERSION


def _pairs(var_sbp, eqn, sig, ndim):
    return [
        (v, want)
        for v, want in zip(eqn.inputs, sig.ins)
        if type(v) is not Literal and _sbp_of(var_sbp, v, ndim) != want
    ]


EXHAUSTIVE_MAX_EQNS = 12
SEARCH_SPACE_LIMIT = 10**7
SWEEP_MAX_EQNS = 400


def plan_program(program, pl, in_sbps, out_sbps, allow_partial_out=False, search=True):
    """Plan `program` (global view) on placement `pl`; returns a Plan."""
    from fflow.transforms.shard import sbp_constraint_p

    prob = _Problem(program, pl, in_sbps, out_sbps, allow_partial_out, sbp_constraint_p)
    # two greedy passes: ties broken towards split work, and towards keeping the
    # producers' SBP (the first is myopic when a later consumer wants another split)
    best = None
    for split_ties in (True, False):
        cand = _greedy(prob, split_ties)
        c_var, c_cost = prob.total(cand)
        if best is None or c_cost < best[2]:
            best = (cand, c_var, c_cost)
    sigs, var_sbp, cost = best
    space = 1
    for c in prob.cands:
        space *= len(c)
    if search and len(program.eqns) <= EXHAUSTIVE_MAX_EQNS and space <= SEARCH_SPACE_LIMIT:
        found = _search(prob, cost)
        if found is not None:
            sigs = found
            var_sbp, cost = prob.total(sigs)
    if search and len(program.eqns) <= SWEEP_MAX_EQNS:
        sigs = _sweep(prob, sigs, cost)
        var_sbp, cost = prob.total(sigs)
    return Plan(var_sbp, sigs, prob.final_sbps(var_sbp), cost[0])


def fixed_plan(program, pl, in_sbps, out_sbps, sigs):
    """A Plan with the given signature per equation (no search)."""
    prob = _Problem(program, pl, in_sbps, out_sbps, True, None)
    var_sbp, cost = prob.total(sigs)
    return Plan(var_sbp, list(sigs), prob.final_sbps(var_sbp), cost[0])


def _greedy(prob, split_ties=True):
    var_sbp = dict(prob.init)
    boxed = set()
    sigs = []
    ndim = len(prob.h)
    for eqn, cands in zip(prob.program.eqns, prob.cands):
        best, best_key = None, None
        for i, sig in enumerate(cands):
            nbytes, mism = prob.in_cost(var_sbp, eqn, sig, boxed)
            key = (nbytes, mism if split_ties else mism - prob.replicated(sig), i)
            if best_key is None or key < best_key:
                best, best_key = sig, key
        sigs.append(best)
        boxed.update(_pairs(var_sbp, eqn, best, ndim))
        for v, s in zip(eqn.outputs, best.outs):
            var_sbp[v] = s
    return sigs


def _search(prob, bound):
    """Exhaustive branch and bound over signature choices (small programs only)."""
    eqns = prob.program.eqns
    ndim = len(prob.h)
    best = [None, bound]
    budget = [SEARCH_NODE_LIMIT]
    var_sbp = dict(prob.init)
    boxed = set()
    chosen = []

    def rec(k, cost):
        if budget[0] <= 0:
            return
        budget[0] -= 1
        if k == len(eqns):
            ob, om = prob.out_cost(var_sbp, boxed)
            total = (cost[0] + ob, cost[1] + om)
            if total < best[1]:
                best[0] = list(chosen)
                best[1] = total
            return
        eqn = eqns[k]
        scored = []
        for sig in prob.cands[k]:
            nbytes, mism = prob.in_cost(var_sbp, eqn, sig, boxed)
            scored.append(((cost[0] + nbytes, cost[1] + mism), sig))
        scored.sort(key=lambda t: t[0])
        for c, sig in scored:
            if c >= best[1]:
                break
            new_pairs = [p for p in _pairs(var_sbp, eqn, sig, ndim) if p not in boxed]
            boxed.update(new_pairs)
            chosen.append(sig)
            saved = [(v, var_sbp.get(v)) for v in eqn.outputs]
            for v, s in zip(eqn.outputs, sig.outs):
                var_sbp[v] = s
            rec(k + 1, c)
            for v, old in saved:
                if old is None:
                    var_sbp.pop(v, None)
                else:
                    var_sbp[v] = old
            chosen.pop()
            boxed.difference_update(new_pairs)

    rec(0, (0, 0))
    return best[0]


def _sweep(prob, sigs, cost, rounds=2):
    """Local improvement: change one equation's signature when that lowers the exact cost.

    Candidates are screened by the change at the equation and its consumers, then
    confirmed by the exact total.
    """
    eqns = prob.program.eqns
    consumers = {}
    for k, eqn in enumerate(eqns):
        for v in eqn.inputs:
            if type(v) is not Literal:
                consumers.setdefault(v, []).append(k)
    outset = {v for v in prob.program.outvars if type(v) is not Literal}
    sigs = list(sigs)
    var_sbp, cost = prob.total(sigs)
    for _ in range(rounds):
        improved = False
        for k in reversed(range(len(eqns))):
            if len(prob.cands[k]) < 2:
                continue
            eqn = eqns[k]
            users = sorted({c for v in eqn.outputs for c in consumers.get(v, [])})
            touches_out = any(v in outset for v in eqn.outputs)

            ctx = (prob, eqns, sigs, var_sbp, eqn, users, touches_out)
            here = _local_cost(ctx, sigs[k])
            for sig in prob.cands[k]:
                if sig is sigs[k] or _local_cost(ctx, sig) >= here:
                    continue
                trial = sigs[:k] + [sig] + sigs[k + 1 :]
                t_var, t_cost = prob.total(trial)
                if t_cost < cost:
                    sigs, var_sbp, cost = trial, t_var, t_cost
                    here = _local_cost((prob, eqns, sigs, var_sbp, eqn, users, touches_out), sig)
                    improved = True
        if not improved:
            break
    return sigs


def _local_cost(ctx, sig):
    """(bytes, conversions) at one equation and its consumers if it took `sig`."""
    prob, eqns, sigs, var_sbp, eqn, users, touches_out = ctx
    env = dict(var_sbp)
    for v, s in zip(eqn.outputs, sig.outs):
        env[v] = s
    b, m = prob.in_cost(env, eqn, sig)
    for c in users:
        cb, cm = prob.in_cost(env, eqns[c], sigs[c])
        b, m = b + cb, m + cm
    if touches_out:
        ob, om = prob.out_cost(env)
        b, m = b + ob, m + om
    return (b, m)
