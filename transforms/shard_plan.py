"""The SBP planner: one signature per equation, minimising the step's time per device.

Inputs carry the user's SBPs (or their global arrays' SBPs); outputs either have
a requested SBP or keep what their producer gives (partial values are finished
to broadcast unless partial outputs are allowed, as for eager global arrays).
`with_sbp` constraints are equations with exactly one signature.

The cost of a plan (transforms/shard_cost.py) is, in seconds on one device, every
equation's compute under its signature plus every conversion: a var converted to
an SBP its consumers want costs latency + bytes/bandwidth once, however many
consumers share it. That total is a sum of per-equation and per-var terms, so
the effect of changing one equation's signature is local (`_State.delta`).

Search (ARCHITECTURE.md, "shard planner", says why):
1. Viterbi over the program: a forward pass in topological order computes, for
   every var and SBP, the cheapest cost of producing it in that SBP (relative to
   its best SBP, so shared producers do not blow up); a backward pass, from the
   outputs up, picks each equation's signature given what its (already decided)
   consumers want, so backward-pass consumers of forward values are seen. Run
   with a few tie-breaking weights on holding partial sums.
2. Greedy "match producers first" in topological order (the old planner).
3. Exhaustive branch and bound for programs of a few equations.
4. Local refinement of the best with exact deltas until nothing improves.
The plan with the lowest exact total wins. Everything runs on integer codes of
N-D SBPs: hashing SBP objects dominated the planner's time.
"""

import contextlib
import gc
import weakref

from fflow.primitives.control_flow import cond_p, while_p
from fflow.primitives.dot import dot_general_p
from fflow.primitives.sbp_constraint import sbp_constraint_p
from fflow.primitives.scan import scan_p
from fflow.transforms.shard_boxing import plan_boxing
from fflow.transforms.shard_cost import (
    boxing_time,
    compute_time,
    eqn_flops,
    hidden_time,
    is_bucketed_reduce,
)
from fflow.transforms.shard_fsdp import source_of, weigh_memory
from fflow.transforms.shard_plan_control import (
    cond_signatures,
    scan_signatures,
    while_signatures,
)
from fflow.transforms.shard_rules import Sig, signatures

from fflow.config import config
from fflow.core import Literal
from fflow.device_profile import default_profile
from fflow.sbp import B, Partial

CONTROL = {scan_p: scan_signatures, while_p: while_signatures, cond_p: cond_signatures}
EXHAUSTIVE_MAX_EQNS = 12
GREEDY_MAX_EQNS = 1000  # beyond this the message-passing starts always beat greedy
SEARCH_NODE_LIMIT = 4000
REFINE_ROUNDS = 6
REFINE_STARTS = 3
REFINE_MARGIN = 0.25  # another start is refined only when it starts this close to the best
# tie-breakers of the forward pass, one run each: holding a partial sum costs this
# share of the all-reduce that would finish it (0.1: finish late when it ties, the
# right call in backward passes; 1: finish early, Megatron's forward)
PARTIAL_PENALTIES = (0.1, 1.0)
# and for programs of at most GREEDY_MAX_EQNS equations (cheap there): 1-layer
# Megatron at 2,16,64 on 2x2 / 2x4 reaches the hand plan (0.448 / 0.554 MB, was 0.496 /
# 0.665 MB at 0.08% more time) only from the 0.0 or 0.5 start
SMALL_PARTIAL_PENALTIES = (0.0, 0.5)
# one more start where splits only propagate (`_propagated`), refined (as the others)
# when it starts within REFINE_MARGIN of the best refined plan
PROPAGATED_START = True
INF = float("inf")
# seconds charged for a conversion that splits a value under keep_in_sbp (where the
# plan follows the kept inputs' splits): large, but finite so deltas stay numbers
NEW_SPLIT = 1e3

# program -> hierarchy -> {id(eqn): (eqn, its signatures())}: a program planned again
# (memory_limit's rungs and weights, with the programs gather_per_use made of it, which
# share most equation objects) skips signatures()'s cache key per equation
_PROGRAM_SIGS = weakref.WeakKeyDictionary()

# N-D SBP tuples <-> small ints, shared by every plan
_NDS = []
_CODES = {}
_KEY = 1 << 20  # codes stay below this


def _code(nd):
    c = _CODES.get(nd)
    if c is None:
        c = len(_NDS)
        _NDS.append(nd)
        _CODES[nd] = c
    return c


def finish_partial(nd):
    """Partial SBPs become broadcast (what a caller expects from an unannotated output)."""
    return tuple(B if s.is_partial() else s for s in nd)


class Plan:
    """The chosen SBP of every var and signature of every equation, with its costs.

    `time` = `compute_time` + `comm_time` (seconds per device per call, from the
    profile); `bytes` = communication bytes per call summed over devices;
    `hidden_time`: seconds of `hidden_count` gradient all-reduces that overlap the
    backward pass (bucketed; not counted in `comm_time`).
    """

    def __init__(self, prob, sig_idx):
        self.problem = prob
        self.sig_index = list(sig_idx)
        self.eqn_sigs = [prob.cands[k][s] for k, s in enumerate(sig_idx)]
        have = prob.labels_of(sig_idx)
        self.var_sbp = {v: _NDS[have[i]] for v, i in prob.vid.items()}
        self.out_sbps = [
            _NDS[prob.out_want(i, r, have[i])] for i, r in zip(prob.out_ids, prob.out_req_codes)
        ]
        self.profile = prob.profile
        self.compute_time = sum(prob.comp[k][s] for k, s in enumerate(sig_idx))
        if prob.pen is not None:  # (the memory weight steered the search; not time)
            self.compute_time -= sum(prob.pen[k][s] for k, s in enumerate(sig_idx))
        self.comm_time = 0.0
        self.bytes = 0
        self.hidden_time = 0.0  # communication overlapping compute (not in comm_time)
        self.hidden_count = 0
        for i, h, w in prob.conversions(sig_idx, have):
            t = prob.bt(i, h, w)
            if t >= NEW_SPLIT:  # (a split keep_in_sbp steered away from: not time)
                t -= NEW_SPLIT
            self.comm_time += t
            self.bytes += prob.bbytes(i, h, w)
            if i in prob.hidden and prob._is_reduce(i, h, w):
                self.hidden_time += max(prob._bt[prob.akid_class[i] + h * _KEY + w] - t, 0.0)
                self.hidden_count += 1
        self.time = self.compute_time + self.comm_time


class _Problem:
    """The program as integers: var ids, per-equation candidate codes and costs."""

    def __init__(
        self,
        program,
        pl,
        in_sbps,
        out_sbps,
        allow_partial_out,
        constrained,
        profile,
        mem_w=0.0,
        keep=None,
    ):
        self.program = program
        self.h = tuple(pl.hierarchy)
        self.nd = len(self.h)
        self.allow_partial_out = allow_partial_out
        self.profile = profile or default_profile(pl)
        self.bcode = _code((B,) * self.nd)
        self.vid = {}
        self.avals = []
        self.init = []  # var id -> fixed code (inputs, constants, literals) or None

        def new_var(aval, init):
            self.avals.append(aval)
            self.init.append(init)
            return len(self.avals) - 1

        for v, s in zip(program.invars, in_sbps):
            self.vid[v] = new_var(v.aval, _code(tuple(s)))
        for v in program.constvars:
            self.vid[v] = new_var(v.aval, self.bcode)
        self.n_inputs = len(self.avals)  # var ids below: held by the caller all call long
        # inputs read only in their own SBP (shard(..., keep_in_sbp=)): var id -> name
        self.kept = {i: name for i, name in enumerate(keep or ()) if name is not None}
        kept_lists = {}  # (id(candidates), restriction) -> the candidates that obey it
        self.eqn_ins, self.eqn_outs, self.cands, self.cin, self.cout, self.comp = (
            [],
            [],
            [],
            [],
            [],
            [],
        )
        codes_of = {}
        sig_memo = _PROGRAM_SIGS.setdefault(source_of(program), {}).setdefault(self.h, {})
        fastest = {}  # id(candidate list) -> (the list, its least compute time)
        self.fastest = []  # per equation
        self.control = []  # equations (loops, cond) with split signatures of their bodies
        for eqn in program.eqns:
            ins = []
            for v in eqn.inputs:
                if type(v) is Literal:
                    ins.append(new_var(v.aval, self.bcode))  # one var per use
                else:
                    ins.append(self.vid[v])
            if constrained and eqn.primitive is sbp_constraint_p:
                nd = eqn.params["sbp"]
                cands = [Sig((nd,), (nd,))]
            else:
                got = sig_memo.get(id(eqn))
                if got is not None and got[0] is eqn:
                    cands = got[1]
                else:
                    in_avals = [v.aval for v in eqn.inputs]
                    out_avals = [v.aval for v in eqn.outputs]
                    cands = signatures(eqn.primitive, in_avals, out_avals, eqn.params, self.h)
                    sig_memo[id(eqn)] = (eqn, cands)
                extra = CONTROL.get(eqn.primitive)  # bodies that need no communication
                if extra is not None:
                    more = extra(eqn, self.h, self.profile, plan_program)
                    if more:
                        cands = cands + more
                        self.control.append(len(self.cands))
            full = cands
            if self.kept:
                cands = self._keep(eqn, ins, cands, kept_lists)
            outs = []
            for v in eqn.outputs:
                self.vid[v] = new_var(v.aval, None)
                outs.append(self.vid[v])
            # signatures() returns one list per (primitive, avals, params): the same
            # equation in every layer shares its codes and compute times
            hit = codes_of.get(id(cands))
            if hit is None:
                flops = eqn_flops(eqn)
                cin = [tuple(_code(x) for x in sig.ins) for sig in cands]
                cout = [tuple(_code(x) for x in sig.outs) for sig in cands]
                comp = [compute_time(eqn, sig, self.h, self.profile, flops) for sig in cands]
                hit = codes_of[id(cands)] = (cands, cin, cout, comp)
            _, cin, cout, comp = hit
            # `_overlap`'s timeline: the cheapest candidate before keep_in_sbp's
            # restriction, so one plan costs the same kept or free
            low = fastest.get(id(full))
            if low is None or low[0] is not full:
                if full is cands:
                    low = (full, min(comp))
                else:
                    f = eqn_flops(eqn)
                    low = (full, min(compute_time(eqn, s, self.h, self.profile, f) for s in full))
                fastest[id(full)] = low
            self.fastest.append(low[1])
            self.eqn_ins.append(ins)
            self.eqn_outs.append(outs)
            self.cands.append(cands)
            self.cin.append(cin)
            self.cout.append(cout)
            self.comp.append(comp)
        self.consumers = [[] for _ in self.avals]
        for k, ins in enumerate(self.eqn_ins):
            for j, i in enumerate(ins):
                self.consumers[i].append((k, j))
        self.out_ids, self.out_req_codes = [], []
        self.out_reqs = [[] for _ in self.avals]  # var id -> [requested code or None]
        for v, req in zip(program.outvars, out_sbps):
            i = new_var(v.aval, self.bcode) if type(v) is Literal else self.vid[v]
            if i >= len(self.out_reqs):
                self.out_reqs.append([])
                self.consumers.append([])
            r = None if req is None else _code(tuple(req))
            self.out_ids.append(i)
            self.out_req_codes.append(r)
            self.out_reqs[i].append(r)
        self.akey = [(a.shape, a.dtype) for a in self.avals]
        self.late, self.crossing, self.last_heavy = _late_vars(program, self)
        self.hidden = self._overlap()
        # where splits only propagate (keep_in_sbp; one start of the free search), a
        # conversion that newly splits a value (slice, reduce-scatter) costs NEW_SPLIT,
        # except into an output or a with_sbp that asks for it
        self.exempt = [bool(r) for r in self.out_reqs]
        for k, eqn in enumerate(program.eqns):
            if eqn.primitive is sbp_constraint_p:
                for i in self.eqn_ins[k]:
                    self.exempt[i] = True
        self._akids = {}
        self.split_classes = set()  # price classes that pay NEW_SPLIT
        self.akid, self.akid_class = self.price_classes(bool(self.kept))
        self.prop_ids = None  # the propagation start's classes (_propagated)
        self._bt = {}
        self._reduce = {}
        self._fin = {}
        self.pen = weigh_memory(self, mem_w) if mem_w else None

    def _keep(self, eqn, ins, cands, lists):
        """The candidates that read every kept input in its own SBP (one list per
        candidate list and restriction, so repeated layers still share their codes);
        none: a user error naming the equation's line and the input."""
        restr = tuple((j, self.init[i]) for j, i in enumerate(ins) if i in self.kept)
        if not restr:
            return cands
        key = (id(cands), restr)
        got = lists.get(key)
        if got is None:
            got = [c for c in cands if all(_code(c.ins[j]) == code for j, code in restr)]
            if not got:
                raise _kept_error(self, eqn, ins, cands, restr)
            lists[key] = got
        return got

    def price_classes(self, propagate):
        """(akid, akid_class): one int per (shape, dtype, late, pays NEW_SPLIT) and per
        var with hidden all-reduce time, so conversion prices are cached under int keys;
        akid_class is the price without the overlap credit, shared by the class."""
        akids = self._akids
        akid, akid_class = [], []
        for i, (k, t) in enumerate(zip(self.akey, self.late)):
            pay = propagate and not self.exempt[i]
            akid.append(
                akids.setdefault(k + (t, pay, i if i in self.hidden else -1), len(akids))
                * _KEY
                * _KEY
            )
            c = akids.setdefault(k + (t, pay, -1), len(akids)) * _KEY * _KEY
            akid_class.append(c)
            if pay:
                self.split_classes.add(c)
        return akid, akid_class

    def _overlap(self):
        """Per gradient (a value crossing into the optimizer tail), the seconds of its
        bucketed all-reduce hidden behind the compute between it and its first reader
        (`hidden_time`). The compute timeline is each equation's cheapest candidate (before
        keep_in_sbp's restriction), so the credit is a constant per var, a plan's total
        stays a sum of local terms, and a plan costs the same kept or free."""
        if not self.crossing or all(h == 1 for h in self.h) or config.grad_bucket_mb <= 0:
            return {}  # nothing crosses, one device, or no buckets: nothing overlaps
        start, t = [], 0.0
        for low in self.fastest:
            start.append(t)
            t += low
        end = t
        full = (Partial("sum"),) * self.nd
        items = []
        for k, outs in enumerate(self.eqn_outs[: self.last_heavy + 1]):
            for i in outs:
                if not self.late[i] or self.avals[i].dtype.kind != "f":
                    continue
                needed = min((c for c, _ in self.consumers[i]), default=None)
                shape, dtype = self.akey[i]
                bp = plan_boxing(shape, dtype, self.h, full, (B,) * self.nd)
                secs = boxing_time(bp, self.h, self.profile, bucketed=self.crossing)
                ready = start[k] + self.fastest[k]
                items.append((i, ready, end if needed is None else start[needed], secs))
        return {i: s for i, s in hidden_time(items, self.profile.overlap).items() if s > 0}

    def nd_of(self, code):
        return _NDS[code]

    # -- costs -------------------------------------------------------------------
    def bt(self, i, have, want):
        """Seconds to convert var i from code `have` to `want`."""
        if have == want:
            return 0.0
        pair = have * _KEY + want
        key = self.akid[i] + pair
        t = self._bt.get(key)
        if t is None:
            base = self.akid_class[i] + pair
            t = self._bt.get(base)
            if t is None:
                shape, dtype = self.akey[i]
                bp = plan_boxing(shape, dtype, self.h, _NDS[have], _NDS[want])
                # a bucket holds at most the values crossing into the tail (the gradients)
                members = self.crossing if self.late[i] else 0
                t = boxing_time(bp, self.h, self.profile, bucketed=members)
                if not t and bp.steps:
                    t = 1e-12  # a local conversion (slice, pad): free, but not nothing
                if self.akid_class[i] in self.split_classes and _new_split(_NDS[have], _NDS[want]):
                    t += NEW_SPLIT
                self._bt[base] = t
            hidden = self.hidden.get(i)
            if hidden and self._is_reduce(i, have, want):
                t = max(t - hidden, 1e-12)
            self._bt[key] = t
        return t

    def _is_reduce(self, i, have, want):
        r = self._reduce.get((self.akid_class[i], have, want))
        if r is None:
            shape, dtype = self.akey[i]
            bp = plan_boxing(shape, dtype, self.h, _NDS[have], _NDS[want])
            r = self._reduce[(self.akid_class[i], have, want)] = is_bucketed_reduce(bp)
        return r

    def bbytes(self, i, have, want):
        shape, dtype = self.akey[i]
        return plan_boxing(shape, dtype, self.h, _NDS[have], _NDS[want]).bytes

    def finish(self, c):
        f = self._fin.get(c)
        if f is None:
            f = self._fin[c] = _code(finish_partial(_NDS[c]))
        return f

    def out_want(self, i, req, have):
        if req is not None:
            return req
        return have if self.allow_partial_out else self.finish(have)

    def var_cost(self, i, have, wants):
        """Seconds to give var i (held as `have`) to every distinct SBP in `wants` (codes,
        or a dict code -> number of consumers) and to the program outputs it is."""
        t = 0.0
        seen = ()
        if type(wants) is dict:
            wants = [w for w, n in wants.items() if n > 0]
        for w in wants:
            if w != have and w not in seen:
                t += self.bt(i, have, w)
                seen += (w,)
        if not self.out_reqs[i]:
            return t
        for r in self.out_reqs[i]:
            w = self.out_want(i, r, have)
            if w != have and w not in seen:
                t += self.bt(i, have, w)
                seen += (w,)
        return t

    def labels_of(self, sig_idx):
        have = list(self.init)
        for k, s in enumerate(sig_idx):
            for i, c in zip(self.eqn_outs[k], self.cout[k][s]):
                have[i] = c
        return have

    def conversions(self, sig_idx, have):
        """Every (var id, have, want) conversion of a full plan (each pair once)."""
        wants = [[] for _ in self.avals]
        for k, s in enumerate(sig_idx):
            for i, w in zip(self.eqn_ins[k], self.cin[k][s]):
                wants[i].append(w)
        out = []
        for i, ws in enumerate(wants):
            seen = set()
            for w in ws + [self.out_want(i, r, have[i]) for r in self.out_reqs[i]]:
                if w != have[i] and w not in seen:
                    seen.add(w)
                    out.append((i, have[i], w))
        return out

    def total(self, sig_idx):
        have = self.labels_of(sig_idx)
        t = sum(self.comp[k][s] for k, s in enumerate(sig_idx))
        return t + sum(self.bt(i, h, w) for i, h, w in self.conversions(sig_idx, have))


def _kept_error(prob, eqn, ins, cands, restr):
    """The user error for kept inputs that an equation cannot read in their SBPs."""
    names = [prob.kept[ins[j]] for j, _ in restr]
    given = " and ".join(f"{n} as {_fmt_nd(_NDS[c])}" for n, (_, c) in zip(names, restr))
    can = sorted(
        {", ".join(n + " " + _fmt_nd(s.ins[j]) for n, (j, _) in zip(names, restr)) for s in cands}
    )
    more = f" (and {len(can) - 6} more)" if len(can) > 6 else ""
    info = eqn.source_info
    where = ""
    if info is not None:
        text = info.line_text()
        where = f"\n  at {info}" + (f"\n    {text}" if text else "")
    return ValueError(
        f"shard(..., keep_in_sbp=...): `{eqn.primitive.name}` cannot read {given}, the "
        f"annotated SBP{'s' if len(restr) > 1 else ''} kept by keep_in_sbp; it reads "
        f"{'them' if len(restr) > 1 else 'it'} as: {'; '.join(can[:6])}{more}.{where}\n"
        f"Fix: annotate {' / '.join(names)} in in_sbp with SBPs it can read, or leave "
        f"{'one of them' if len(restr) > 1 else 'it'} free to be converted "
        f"(keep_in_sbp=False for that argument)."
    )


def _new_split(have, want):
    """Whether converting `have` to `want` splits a value along a mesh axis that holds
    it whole or as partial sums (a slice or a reduce-scatter, not an all-to-all)."""
    return any(w.is_split() and not h.is_split() for h, w in zip(have, want))


def _fmt_nd(nd):
    return "(" + ", ".join(str(s) for s in nd) + ")"


def _late_vars(program, prob):
    """(per var id: read only after the program's last matmul, number of such values
    computed by then). A training step's tail is its optimizer update; the values
    crossing into it are the gradients, whose all-reduces the runtimes fuse into
    buckets (transforms/shard_buckets.py), so each pays a share of one latency. A
    program whose only crossing value is its output pays the whole latency."""
    last = -1
    for k, eqn in enumerate(program.eqns):
        if eqn.primitive is dot_general_p:  # (convolutions are dot_generals too)
            last = k
    late = [
        last >= 0 and bool(cons or reqs) and all(k > last for k, _ in cons)
        for cons, reqs in zip(prob.consumers, prob.out_reqs)
    ]
    crossing = sum(late[i] for outs in prob.eqn_outs[: last + 1] for i in outs)
    return late, crossing, last


def plan_program(
    program,
    pl,
    in_sbps,
    out_sbps,
    allow_partial_out=False,
    search=True,
    profile=None,
    memory_weight=0.0,
    keep=None,
    propagated=True,
    viterbi_refined=True,
):
    """Plan `program` (global view) on placement `pl`; returns a Plan (memory budgets are
    handled one level up, transforms/shard_memory.py; `memory_weight`: seconds per byte
    of equation output held per device, added to the search's costs, shard_fsdp.py;
    `keep`: per input, None or its name where every equation must read it in its own
    SBP, `shard(..., keep_in_sbp=)`; `propagated=False`: without the start where splits
    only propagate, `_propagated`, as fit_budget plans state the ladder split;
    `viterbi_refined=False`: a Viterbi start is refined only where it is the best start,
    as fit_budget plans those rungs too)."""
    with gc_paused():
        return _plan(
            program, pl, in_sbps, out_sbps, allow_partial_out, search, profile,
            memory_weight, keep, propagated, viterbi_refined,
        )  # fmt: skip


@contextlib.contextmanager
def gc_paused():
    """Python's cyclic garbage collector off for the block, back on after (if it was on).
    Tracing and planning allocate millions of small acyclic tuples, dicts and vars, all
    freed by reference counting; the collections they trigger rescanned the growing heap
    again and again: 2.8 of a 2x2 memory_limit bench row's CPU s (4083 collections)."""
    on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if on:
            gc.enable()


def _plan(
    program, pl, in_sbps, out_sbps, allow_partial_out, search, profile, memory_weight, keep,
    propagated, viterbi_refined,
):  # fmt: skip
    prob = _Problem(
        program, pl, in_sbps, out_sbps, allow_partial_out, True, profile, memory_weight, keep
    )
    prob.propagated = propagated
    prob.viterbi_refined = viterbi_refined
    found = _searched(prob, search)
    if prob.control and search:
        # the loops' split signatures change what is cheap around them; the search can
        # get stuck with a loop split where running it whole is cheaper (a tiny cond
        # under grad: 227 us vs 77 us), so search once more with every loop whole
        saved = [(prob.cands[k], prob.cin[k], prob.cout[k], prob.comp[k]) for k in prob.control]
        for k in prob.control:
            prob.cands[k], prob.cin[k] = prob.cands[k][:1], prob.cin[k][:1]
            prob.cout[k], prob.comp[k] = prob.cout[k][:1], prob.comp[k][:1]
        whole = _searched(prob, search)
        for k, (a, b, c, d) in zip(prob.control, saved):
            prob.cands[k], prob.cin[k], prob.cout[k], prob.comp[k] = a, b, c, d
        found += whole
    if len(found) == 1:
        return Plan(prob, found[0])
    return Plan(prob, min(found, key=prob.total))


def _searched(prob, search):
    """The search's refined plans (see the module docstring)."""
    program = prob.program
    small = len(program.eqns) <= GREEDY_MAX_EQNS
    found = [_greedy(prob)] if not search or small else []
    viterbi = set()  # (indices of the Viterbi starts in found)
    if search:
        for pp in PARTIAL_PENALTIES + (SMALL_PARTIAL_PENALTIES if small else ()):
            fwd = _forward(prob, pp)
            found += [_viterbi(prob, fwd), _lookahead(prob, fwd)]
            viterbi.add(len(found) - 2)
        if len(program.eqns) <= EXHAUSTIVE_MAX_EQNS:
            exact = _search(prob, min(prob.total(s) for s in found))
            if exact is not None:
                found.append(exact)
        # refine the most promising distinct starts (refinement is most of the
        # planner's time); the best start is not always the best after refinement
        # (Megatron, 4 layers at d=256, H200: the lookahead start 15% above the
        # Viterbi one refines to the hand plan, the Viterbi one stays 15% above it)
        scored = sorted({tuple(s): (prob.total(s), n) for n, s in enumerate(found)}.values())
        best = scored[0][0]
        if not prob.viterbi_refined:
            scored = scored[:1] + [x for x in scored[1:] if x[1] not in viterbi]
        starts = [n for t, n in scored[:REFINE_STARTS] if t <= best * (1 + REFINE_MARGIN)]
        found = [_refine(prob, found[n]) for n in starts]
        if not prob.kept and PROPAGATED_START and prob.propagated:
            # refined where it starts close to the best refined plan: where it won, it
            # started at 0.81-1.22x it (24 layers on 8 devices: 1.747 vs 2.041 ms, refined
            # to 1.743; 4 layers 8,512,512 on 2x2, the hand plan: 1.22x, refined 1.899 ->
            # 1.892 ms), where it lost at 1.33-2.4x (data-parallel rows, memory rungs)
            bound = min(map(prob.total, found)) * (1 + REFINE_MARGIN)
            prop = _propagated(prob, bound)
            if prob.total(prop) <= bound:
                found.append(_refine(prob, prop))
    return found


def _propagated(prob, bound=INF):
    """A start where splits only propagate from the inputs' SBPs (as keep_in_sbp plans,
    and as JAX's sharding propagation would): the message-passing starts with NEW_SPLIT
    on every conversion that newly splits a value (refined by the caller with the true
    costs). Megatron from weight annotations, 2
    layers at 4,128,256 on 4 devices: the other starts refine to 170.1 us (a layernorm
    backward reduce-scattered and all-gathered back in every block, as the forward
    layernorms ran batch-split), this one to 149.0 us. 24 layers (8958 equations):
    2.242 -> 1.921 ms on 4 devices, 2.041 -> 1.743 ms on 8 (the kept plans: 1.922,
    1.745 ms), for +0.2-1.2 CPU s. The lookahead decode runs only when the Viterbi one
    costs at most `bound` at the true prices."""
    if prob.prop_ids is None:
        prob.prop_ids = prob.price_classes(True)

    def priced(fn, *args):  # fn under the propagation prices
        saved = prob.akid, prob.akid_class
        prob.akid, prob.akid_class = prob.prop_ids
        try:
            return fn(*args)
        finally:
            prob.akid, prob.akid_class = saved

    fwd = priced(_forward, prob, 1.0)
    first = priced(_viterbi, prob, fwd)
    if prob.total(first) > bound:
        return first
    return min([first, priced(_lookahead, prob, fwd)], key=lambda s: priced(prob.total, s))


def fixed_plan(program, pl, in_sbps, out_sbps, sigs, profile=None):
    """A Plan with the given signature per equation (no search)."""
    prob = _Problem(program, pl, in_sbps, out_sbps, True, False, profile)
    idx = []
    for k, sig in enumerate(sigs):
        idx.append(prob.cands[k].index(sig) if sig in prob.cands[k] else _add_cand(prob, k, sig))
    return Plan(prob, idx)


def _add_cand(prob, k, sig):
    eqn = prob.program.eqns[k]
    prob.cands[k] = list(prob.cands[k]) + [sig]
    prob.cin[k].append(tuple(_code(x) for x in sig.ins))
    prob.cout[k].append(tuple(_code(x) for x in sig.outs))
    prob.comp[k].append(compute_time(eqn, sig, prob.h, prob.profile))
    return len(prob.cands[k]) - 1


# ----------------------------------------------------------------------------
# Viterbi: forward costs per (var, SBP), backward decisions


def _forward(prob, partial_penalty=0.0):
    """Cost-to-come: per var the cheapest way to produce it in each SBP (relative to its
    best), and per equation and candidate the cost of running it with its inputs
    received that way. Returns (rel, receive, eqn_cost).

    A transformer's layers repeat the same equations on vars of the same shapes, and
    the relative costs of the residual stream settle after a layer or two; so the
    work is keyed by what it depends on: an equation's candidate list and, per
    operand, its price class (`akid`) and its interned cost table. A repeated
    equation reuses the costs (exactly the same numbers) instead of recomputing."""
    n_eqns = len(prob.cands)
    tables = {}  # content -> the one dict with it (so id() names a cost table)

    def canon(d):
        key = tuple(sorted(d.items()))
        return tables.setdefault(key, d)

    rel = [None if c is None else canon({c: 0.0}) for c in prob.init]
    best_in = {}
    order = {}  # id(table) -> its (regret, code) pairs, cheapest first
    bt_get = prob._bt.get
    akid = prob.akid

    def receive(i, want):
        r = rel[i]
        key = (akid[i] + want, id(r))
        c = best_in.get(key)
        if c is None:
            pairs = order.get(id(r))
            if pairs is None:
                pairs = order[id(r)] = sorted((x, s) for s, x in r.items())
            c = INF
            base = akid[i] + want
            for x, s in pairs:
                if x >= c:
                    break  # conversions cost >= 0: no later label can win
                if s == want:
                    t = x
                else:  # prob.bt, its cache read inline (the planner's hottest call)
                    t = bt_get(base + s * _KEY)
                    t = x + (prob.bt(i, s, want) if t is None else t)
                if t < c:
                    c = t
            best_in[key] = c
        return c

    memo = {}
    eqn_cost = []
    for k in range(n_eqns):
        ins = prob.eqn_ins[k]
        outs_ids = prob.eqn_outs[k]
        key = (
            id(prob.cin[k]),
            id(prob.comp[k]),
            tuple([(akid[i], id(rel[i])) for i in ins]),
            tuple([akid[i] for i in outs_ids]),
        )
        hit = memo.get(key)
        if hit is not None:
            eqn_cost.append(hit[0])
            for i, r in zip(outs_ids, hit[1]):
                rel[i] = r
            continue
        costs = []
        for want, comp in zip(prob.cin[k], prob.comp[k]):
            c = comp
            for i, w in zip(ins, want):
                c += receive(i, w)
            costs.append(c)
        eqn_cost.append(costs)
        for j, i in enumerate(outs_ids):
            per = {}
            for outs, c in zip(prob.cout[k], costs):
                o = outs[j]
                if c < per.get(o, INF):
                    per[o] = c
            if partial_penalty:
                for o in per:
                    f = prob.finish(o)
                    if f != o:
                        per[o] += partial_penalty * prob.bt(i, o, f)
            low = min(per.values())
            # under NEW_SPLIT prices a label whose cheapest way in is a new split is
            # left out (a consumer that wants it pays the split where it converts):
            # its cost-to-come, 1e3 s minus what each layer's compute saves, never
            # repeats, so no later layer would share its tables or memo entries
            # (Megatron, 24 layers on 4 devices: 2766 -> 708 lookahead messages)
            rel[i] = canon({o: c - low for o, c in per.items() if c - low < NEW_SPLIT / 2})
        memo[key] = (costs, [rel[i] for i in outs_ids])
    return rel, receive, eqn_cost


def _viterbi(prob, fwd):
    """Forward costs (`_forward`), then decisions from the outputs up."""
    _, _, eqn_cost = fwd
    n_eqns = len(prob.cands)
    sig_idx = [0] * n_eqns
    wanted = [() for _ in prob.avals]
    memo = {}  # a repeated equation (same costs, same wants downstream) decides alike
    for k in reversed(range(n_eqns)):
        outs_ids = prob.eqn_outs[k]
        key = (
            id(prob.cout[k]),
            id(eqn_cost[k]),
            tuple([(prob.akid[i], wanted[i], tuple(prob.out_reqs[i])) for i in outs_ids]),
        )
        best = memo.get(key)
        if best is None:
            best, best_c = 0, INF
            for s, (outs, c) in enumerate(zip(prob.cout[k], eqn_cost[k])):
                for i, o in zip(outs_ids, outs):
                    c += prob.var_cost(i, o, wanted[i])
                if c < best_c:
                    best, best_c = s, c
            memo[key] = best
        sig_idx[k] = best
        for i, w in zip(prob.eqn_ins[k], prob.cin[k][best]):
            if w not in wanted[i]:
                wanted[i] = wanted[i] + (w,)
    return sig_idx


def _lookahead(prob, fwd):
    """Cost-to-go per var and SBP (min-sum messages from the consumers, computed from
    the outputs up, other inputs priced by the forward pass), then decisions in
    program order: each equation takes the candidate cheapest for its exact inputs
    plus what its outputs will cost downstream."""
    rel, receive, _ = fwd
    n_eqns = len(prob.cands)
    bt_get = prob._bt.get
    togo = [dict.fromkeys(r, 0.0) if r is not None else {} for r in rel]
    for i, r in enumerate(prob.out_reqs):
        for req in r:
            for lab in togo[i]:
                togo[i][lab] += prob.bt(i, lab, prob.out_want(i, req, lab))
    tables = {}  # content -> the one dict with it (so id() names a cost-to-go table)
    memo = {}  # as in _forward: a repeated equation sends the same messages
    akids = prob.akid
    for k in reversed(range(n_eqns)):
        outs_ids = prob.eqn_outs[k]
        for i in outs_ids:  # all consumers of k's outputs are done: normalise
            if togo[i]:
                low = min(togo[i].values())
                d = {lab: c - low for lab, c in togo[i].items()}
                togo[i] = tables.setdefault(tuple(sorted(d.items())), d)
        ins = prob.eqn_ins[k]
        key = (
            id(prob.cin[k]),
            id(prob.comp[k]),
            tuple([id(togo[i]) for i in outs_ids]),
            tuple([(akids[i], id(rel[i])) for i in ins]),
        )
        msgs = memo.get(key)
        if msgs is None:
            msgs = memo[key] = _messages(prob, k, togo, receive, bt_get)
        for i, msg in zip(ins, msgs):
            if msg:  # (an input's table is its own until its producer normalises it)
                t = togo[i]
                for lab, m in msg:
                    t[lab] += m
    return _greedy(prob, togo)


def _messages(prob, k, togo, receive, bt_get):
    """Per operand of equation k, [(label, cheapest cost of the rest of k and downstream
    if the operand arrives in that label)] (None for an operand nothing asks about)."""
    ins = prob.eqn_ins[k]
    outs_ids = prob.eqn_outs[k]
    base = []
    for s, (want, outs) in enumerate(zip(prob.cin[k], prob.cout[k])):
        c = prob.comp[k][s]
        for i, o in zip(outs_ids, outs):
            c += togo[i].get(o, 0.0)
        recv = [receive(i, w) for i, w in zip(ins, want)]
        base.append((c + sum(recv), recv))
    msgs = []
    for j, i in enumerate(ins):
        if not togo[i]:
            msgs.append(None)
            continue
        by_want = {}  # the cheapest candidate per SBP it wants operand j in
        for s, want in enumerate(prob.cin[k]):
            c, recv = base[s]
            c -= recv[j]
            if c < by_want.get(want[j], INF):
                by_want[want[j]] = c
        wants = sorted((c, w) for w, c in by_want.items())
        akid = prob.akid[i]
        msg = []
        for lab in togo[i]:
            m = INF
            row = akid + lab * _KEY
            for c, w in wants:
                if c >= m:
                    break  # conversions cost >= 0: no later candidate can win
                if w != lab:  # prob.bt, its cache read inline
                    x = bt_get(row + w)
                    c += prob.bt(i, lab, w) if x is None else x
                if c < m:
                    m = c
            msg.append((lab, m))
        msgs.append(msg)
    return msgs


# ----------------------------------------------------------------------------
# Greedy in topological order


def _greedy(prob, togo=None):
    """Each equation in order takes its cheapest signature given what its inputs have;
    with `togo` (cost still to pay per output label) the choice also looks ahead."""
    have = list(prob.init)
    boxed = [() for _ in prob.avals]  # var -> the SBPs it is already converted to
    sig_idx = []
    memo = {}  # a repeated equation (same operands' state, same togo) decides alike
    for k in range(len(prob.cands)):
        ins = prob.eqn_ins[k]
        outs_ids = prob.eqn_outs[k]
        key = (
            id(prob.cin[k]),
            id(prob.comp[k]),
            tuple([(prob.akid[i], have[i], boxed[i]) for i in ins]),
            None if togo is None else tuple([id(togo[i]) for i in outs_ids]),
        )
        best = memo.get(key)
        if best is None:
            best, best_c = 0, INF
            for s, (want, outs) in enumerate(zip(prob.cin[k], prob.cout[k])):
                c = prob.comp[k][s]
                for i, w in zip(ins, want):
                    if w not in boxed[i]:
                        c += prob.bt(i, have[i], w)
                if togo is not None:
                    for i, o in zip(outs_ids, outs):
                        c += togo[i].get(o, 0.0)
                if c < best_c:
                    best, best_c = s, c
            memo[key] = best
        sig_idx.append(best)
        for i, w in zip(ins, prob.cin[k][best]):
            if w not in boxed[i]:
                boxed[i] += (w,)
        for i, o in zip(prob.eqn_outs[k], prob.cout[k][best]):
            have[i] = o
    return sig_idx


# ----------------------------------------------------------------------------
# Exhaustive branch and bound (a few equations)


def _search(prob, bound):
    n_eqns = len(prob.cands)
    best = [None, bound * (1 - 1e-9)]
    budget = [SEARCH_NODE_LIMIT]
    have = list(prob.init)
    boxed = set()
    chosen = []

    def rec(k, cost):
        if budget[0] <= 0:
            return
        budget[0] -= 1
        if k == n_eqns:
            total = cost
            for i, r in zip(prob.out_ids, prob.out_req_codes):
                w = prob.out_want(i, r, have[i])
                if (i, w) not in boxed:
                    total += prob.bt(i, have[i], w)
            if total < best[1]:
                best[0], best[1] = list(chosen), total
            return
        ins = prob.eqn_ins[k]
        scored = []
        for s, want in enumerate(prob.cin[k]):
            c = cost + prob.comp[k][s]
            for i, w in zip(ins, want):
                if (i, w) not in boxed:
                    c += prob.bt(i, have[i], w)
            scored.append((c, s))
        scored.sort()
        for c, s in scored:
            if c >= best[1]:
                break
            new = [(i, w) for i, w in zip(ins, prob.cin[k][s]) if (i, w) not in boxed]
            boxed.update(new)
            chosen.append(s)
            for i, o in zip(prob.eqn_outs[k], prob.cout[k][s]):
                have[i] = o
            rec(k + 1, c)
            chosen.pop()
            boxed.difference_update(new)

    rec(0, 0.0)
    return best[0]


# ----------------------------------------------------------------------------
# Local refinement with exact deltas


class _State:
    """A full plan with the bookkeeping to price one equation's change exactly."""

    def __init__(self, prob, sig_idx):
        self.prob = prob
        self.sig = list(sig_idx)
        self.have = prob.labels_of(sig_idx)
        self.wants = [{} for _ in prob.avals]  # var id -> {code: number of consumers}
        for k, s in enumerate(sig_idx):
            for i, w in zip(prob.eqn_ins[k], prob.cin[k][s]):
                self.wants[i][w] = self.wants[i].get(w, 0) + 1
        self.vc = [None] * len(prob.avals)  # current conversion cost per var (lazy)
        self.wk = [None] * len(prob.avals)  # per var: (price class, wants, requests)
        self.best_memo = {}  # cone moves: (local_key, rule) -> _best's answer

    def _cur(self, i):
        c = self.vc[i]
        if c is None:
            c = self.vc[i] = self.prob.var_cost(i, self.have[i], self.wants[i])
        return c

    def delta(self, k, s):
        """Exact change of the plan's total if equation k took candidate s."""
        prob = self.prob
        old = self.sig[k]
        d = prob.comp[k][s] - prob.comp[k][old]
        ins = prob.eqn_ins[k]
        a_in, b_in = prob.cin[k][old], prob.cin[k][s]
        done = ()
        for i in ins:
            if i in done:
                continue
            done += (i,)
            w_old = self.wants[i]
            w_new = dict(w_old)
            for u, a, b in zip(ins, a_in, b_in):
                if u == i:
                    w_new[a] -= 1
                    w_new[b] = w_new.get(b, 0) + 1
            d += prob.var_cost(i, self.have[i], w_new) - self._cur(i)
        for i, a, b in zip(prob.eqn_outs[k], prob.cout[k][old], prob.cout[k][s]):
            if a != b:
                d += prob.var_cost(i, b, self.wants[i]) - self._cur(i)
        return d

    def local_key(self, k):
        """Everything `delta(k, .)` reads: equation k's candidate lists and signature,
        which operands are the same var, and per var its price class, SBP, the SBPs
        its consumers want and its output requests."""
        prob = self.prob
        ins = prob.eqn_ins[k]
        wk = self.wk
        parts = [id(prob.cin[k]), id(prob.cout[k]), id(prob.comp[k]), self.sig[k]]
        for i in ins + prob.eqn_outs[k]:
            w = wk[i]
            if w is None:
                w = wk[i] = (
                    prob.akid[i],
                    tuple(sorted((c, n) for c, n in self.wants[i].items() if n)),
                    tuple(prob.out_reqs[i]),
                )
            parts.append(w)
            parts.append(self.have[i])
        if len(set(ins)) < len(ins):
            parts.append(tuple(ins.index(i) for i in ins))
        return tuple(parts)

    def touched(self, k):
        """The conversion seconds of the vars equation k reads and writes (each once)."""
        prob = self.prob
        t = 0.0
        seen = ()
        for i in prob.eqn_ins[k]:
            if i not in seen:
                seen += (i,)
                t += self._cur(i)
        for i in prob.eqn_outs[k]:
            t += self._cur(i)
        return t

    def apply(self, k, s):
        prob = self.prob
        old = self.sig[k]
        for i, a, b in zip(prob.eqn_ins[k], prob.cin[k][old], prob.cin[k][s]):
            self.wants[i][a] -= 1
            self.wants[i][b] = self.wants[i].get(b, 0) + 1
            self.vc[i] = None
            self.wk[i] = None
        for i, b in zip(prob.eqn_outs[k], prob.cout[k][s]):
            self.have[i] = b
            self.vc[i] = None
        self.sig[k] = s

    def neighbours(self, k):
        """Equations whose delta may change when equation k changes."""
        prob = self.prob
        out = set()
        for i in prob.eqn_ins[k]:
            out.update(c for c, _ in prob.consumers[i])
            p = self.producer.get(i)
            if p is not None:
                out.add(p)
        for i in prob.eqn_outs[k]:
            out.update(c for c, _ in prob.consumers[i])
        return out


def _refine(prob, sig_idx):
    st = _State(prob, sig_idx)
    st.producer = {i: k for k, outs in enumerate(prob.eqn_outs) for i in outs}
    memo = {}
    _sweep(st, [k for k in reversed(range(len(prob.cands))) if len(prob.cands[k]) > 1], memo)
    if _cone_moves(st):
        _sweep(st, [k for k in reversed(range(len(prob.cands))) if len(prob.cands[k]) > 1], memo)
    return st.sig


def _sweep(st, todo, memo):
    """Each equation in turn takes its best signature given the rest; neighbours of a
    change are looked at again, until nothing improves. `memo`: local_key -> decision."""
    prob = st.prob
    by_comp = {}  # id(comp list) -> candidate indices, cheapest compute first
    for _ in range(REFINE_ROUNDS):
        changed = set()
        for k in todo:
            # the same equation in the same surroundings (a repeated layer) decides alike
            key = st.local_key(k)
            if key in memo:
                best = memo[key]
                if best is not None:
                    st.apply(k, best)
                    changed.add(k)
                    changed.update(st.neighbours(k))
                continue
            best, best_d = None, -1e-15
            comp = prob.comp[k]
            order = by_comp.get(id(comp))
            if order is None:
                order = by_comp[id(comp)] = sorted(range(len(comp)), key=comp.__getitem__)
            # a change can at best remove every conversion of the vars it touches
            # (each var's cost stays >= 0): delta >= comp[s] - comp[old] - held; the
            # candidates are in compute order, so the first that cannot win ends the scan
            held = comp[st.sig[k]] + st.touched(k)
            for s in order:
                if comp[s] - held >= best_d:
                    break
                if s == st.sig[k]:
                    continue
                d = st.delta(k, s)
                if d < best_d:
                    best, best_d = s, d
            memo[key] = best
            if best is not None:
                st.apply(k, best)
                changed.add(k)
                changed.update(st.neighbours(k))
        if not changed:
            return
        todo = sorted((k for k in changed if len(prob.cands[k]) > 1), reverse=True)


CONE_LIMIT = 48


def _cone_moves(st):
    """Moves one equation at a time cannot make: give var i to all its consumers as L
    (finish a partial sum once instead of in every consumer's chain, or serve every
    consumer by the one conversion), then let the changed region re-choose in program
    order. Kept when the whole move lowers the total."""
    prob = st.prob
    tried = set()
    improved = False
    for i in range(len(prob.avals)):
        have = st.have[i]
        if have is None or not prob.consumers[i]:
            continue
        targets = {w for w, n in st.wants[i].items() if n > 0 and w != have}
        f = prob.finish(have)
        if f != have:
            targets.add(f)
        for lab in targets:
            if (i, lab) in tried:
                continue
            tried.add((i, lab))
            if _cone_move(st, i, lab):
                improved = True
    return improved


def _cone_move(st, i, lab):
    prob = st.prob
    journal = []
    total = 0.0
    moved = set()  # vars whose SBP this move changed: consumers follow them
    pulled = {}  # var -> the SBP a follower reads it in: its producer is asked for that
    queue = set()

    def take(k, s, d, pull=False):
        nonlocal total
        journal.append((k, st.sig[k]))
        before = prob.cout[k][st.sig[k]]
        st.apply(k, s)
        total += d
        for o, a, b in zip(prob.eqn_outs[k], before, prob.cout[k][s]):
            if a != b:
                moved.add(o)
                queue.update(c for c, _ in prob.consumers[o])
        if pull:
            # an operand the follower now converts (a value saved by the forward pass,
            # read by a backward equation that followed): its producer may follow too
            for u, w in zip(prob.eqn_ins[k], prob.cin[k][s]):
                if w != st.have[u] and u not in moved and u not in pulled:
                    p = st.producer.get(u)
                    if p is not None:
                        pulled[u] = w
                        queue.add(p)

    for k, j in prob.consumers[i]:
        if prob.cin[k][st.sig[k]][j] == lab:
            continue
        best, best_d = _best_memo(
            st, k, ("c", j, lab), lambda s, k=k, j=j: prob.cin[k][s][j] == lab
        )
        if best is None:
            break
        take(k, best, best_d)
    steps = 0
    while queue and steps < CONE_LIMIT:
        k = min(queue)
        queue.discard(k)
        steps += 1
        ins = prob.eqn_ins[k]

        def follows(s, k=k, ins=ins):
            want = prob.cin[k][s]
            if not all(w == st.have[u] for u, w in zip(ins, want) if u in moved):
                return False
            outs = zip(prob.eqn_outs[k], prob.cout[k][s])
            return all(o == pulled[v] for v, o in outs if v in pulled)

        rule = (
            "f",
            tuple(p for p, u in enumerate(ins) if u in moved),
            tuple(pulled.get(v) for v in prob.eqn_outs[k]),
        )
        best, best_d = _best_memo(st, k, rule, follows)
        if best is not None and best != st.sig[k]:
            take(k, best, best_d, pull=True)
    if total < -1e-12:
        return True
    for k, s in reversed(journal):
        st.apply(k, s)
    return False


def _best_memo(st, k, rule, ok):
    """`_best`, reused for the same equation in the same surroundings (`local_key`) under
    the same rule (`ok` depends only on the rule and the SBPs in the local key)."""
    key = (st.local_key(k), rule)
    hit = st.best_memo.get(key)
    if hit is None:
        hit = st.best_memo[key] = _best(st, k, ok)
    return hit


def _best(st, k, ok):
    """(candidate, delta) of equation k with the lowest delta among the candidates `ok`
    accepts (it gets the candidate's index)."""
    prob = st.prob
    best, best_d = None, INF
    for s in range(len(prob.cin[k])):
        if ok(s):
            d = 0.0 if s == st.sig[k] else st.delta(k, s)
            if d < best_d:
                best, best_d = s, d
    return best, best_d


def alternatives(plan, k, n=2):
    """The `n` best other signatures of equation k: [(change of the total, Sig)]."""
    prob = plan.problem
    st = _State(prob, plan.sig_index)
    out = [
        (st.delta(k, s), prob.cands[k][s])
        for s in range(len(prob.cands[k]))
        if s != plan.sig_index[k]
    ]
    out.sort(key=lambda t: t[0])
    return out[:n]
