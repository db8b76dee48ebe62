"""Printing a sharded program: every var with its SBP, every inserted collective with
its bytes, and the total bytes moved per call.

    shard on placement(type='cpu', ranks=[0, 1]): 64 bytes per call
    { lambda ; a:f32[4,3]{S(0)} b:f32[3,2]{B}. let
        c:f32[4,2]{S(0)} = dot_general[...] a b
        d:f32[4,2]{B} = all_gather[mesh_axes=(0,) S(0)->B] c    # 32 bytes
      in (d) }
"""

from fflow.primitives.sbp_constraint import sbp_constraint_p
from fflow.transforms.shard_boxing import _ops_1d_names
from fflow.transforms.shard_fsdp import inserted
from fflow.transforms.shard_memory import _local_bytes, peak_memory
from fflow.transforms.shard_plan import NEW_SPLIT, _code, _State

from fflow.core import Literal, Var
from fflow.printing import _Names, _pp_param


def _sbp_text(nd):
    return "{" + ",".join(repr(s) for s in nd) + "}"


def pp_sharded(sp):
    names = _Names()
    plan = sp.plan
    h = sp.placement.hierarchy

    def var(v, nd=None):
        if type(v) is Literal:
            return names(v)
        nd = plan.var_sbp.get(v) if nd is None else nd
        return f"{names(v)}:{v.aval.str_short()}{_sbp_text(nd) if nd is not None else ''}"

    lines = []
    boxings = {}
    for where, v, src, dst, bp in sp.boxings():
        boxings.setdefault(where, []).append((v, src, dst, bp))
    replaced = {}

    def use(v):
        return names(replaced.get(v, v)) if type(v) is not Literal else names(v)

    def emit_boxing(v, src, dst, bp):
        prev = use(v)
        nv = v
        for step in bp.steps:
            nv = Var(v.aval)
            if step.kind == "exchange":
                after, text = step.dst, "exchange"
            else:
                after = tuple(step.dst if m in step.axes else s for m, s in enumerate(step.before))
                text = _op_text(step)
            line = f"{var(nv, after)} = {text} {prev}"
            lines.append(line + (f"    # {step.bytes} bytes" if step.bytes else ""))
            prev = names(nv)
        if not bp.steps:  # same layout, another name for it (e.g. merged mesh axes)
            nv = Var(v.aval)
            lines.append(f"{var(nv, dst)} = relabel {prev}")
        return nv

    converted = {}  # (var, sbp) -> the var holding it: one conversion serves all consumers

    def operand(k, v, want):
        if type(v) is not Literal and (v, want) in converted:
            return names(converted[(v, want)])
        hit = [b for b in boxings.get(k, []) if b[0] is v and b[2] == want]
        if not hit:
            return use(v)
        _, src, dst, bp = hit[0]
        nv = emit_boxing(v, src, dst, bp)
        if type(v) is not Literal:
            converted[(v, want)] = nv
        return names(nv)

    for k, (eqn, sig) in enumerate(zip(sp.exec_program.eqns, plan.eqn_sigs)):
        local_names = [operand(k, v, want) for v, want in zip(eqn.inputs, sig.ins)]
        params = ""
        if eqn.params:
            parts = [f"{p}={_pp_param(eqn.params[p], names, 4)}" for p in sorted(eqn.params)]
            params = "[" + " ".join(parts) + "]"
        outs = " ".join(var(v) for v in eqn.outputs)
        lines.append(f"{outs} = {eqn.primitive.name}{params} {' '.join(local_names)}".rstrip())
    outs = [operand("out", v, want) for v, want in zip(sp.exec_program.outvars, sp.out_sbps)]
    ins = " ".join(var(v) for v in sp.exec_program.invars)
    consts = " ".join(var(v) for v in sp.exec_program.constvars)
    head = f"shard on {sp.placement}: {sp.bytes} bytes per call"
    if h and len(h) > 1:
        head += f" (mesh {h})"
    body = "\n".join("    " + line for line in lines)
    return f"{head}\n{{ lambda {consts}; {ins}. let\n{body}\n  in ({', '.join(outs)}) }}"


def _op_text(step):
    ops = "+".join(_ops_1d_names(step.src, step.dst)) or "relabel"
    return f"{ops}[mesh_axes={step.axes} {step.src}->{step.dst}]"


# ----------------------------------------------------------------------------
# Plans explained: per equation the choice, its two best alternatives, and totals


def _nd_text(nd):
    return ",".join(repr(s) for s in nd)


def _sig_text(sig):
    ins = " ".join(_nd_text(s) for s in sig.ins)
    outs = " ".join(_nd_text(s) for s in sig.outs)
    return f"{ins} -> {outs}"


def _t(seconds):
    if abs(seconds) >= 1e-3:
        return f"{seconds * 1e3:.4g} ms"
    return f"{seconds * 1e6:.4g} us"


def _b(nbytes):
    if abs(nbytes) >= 1e6:
        return f"{nbytes / 1e6:.2f} MB"
    if abs(nbytes) >= 1e3:
        return f"{nbytes / 1e3:.2f} kB"
    return f"{int(nbytes)} B"


def _delta(d):
    """A change of the step's time; under keep_in_sbp the price of splitting a value anew
    (NEW_SPLIT, not time) is said apart: '+10.3 us, 1 new split'."""
    n = round(d / NEW_SPLIT)
    d -= n * NEW_SPLIT
    text = f"{'+' if d >= 0 else ''}{_t(d)}"
    return text + (f", {n:+d} new split{'s' if abs(n) > 1 else ''} (keep_in_sbp)" if n else "")


def _incoming(prob, have, k, s):
    """(seconds, bytes) of converting equation k's inputs for candidate s (unshared)."""
    t = nbytes = 0
    for i, w in zip(prob.eqn_ins[k], prob.cin[k][s]):
        if w != have[i]:
            t += prob.bt(i, have[i], w)
            nbytes += prob.bbytes(i, have[i], w)
    return t, nbytes


def _out_memory(prob, k, s):
    return sum(
        _local_bytes(prob.avals[i], prob.nd_of(c), prob.h)
        for i, c in zip(prob.eqn_outs[k], prob.cout[k][s])
    )


def _compute(prob, k, s):
    """Equation k's compute seconds under candidate s (without the memory weight a plan
    under memory pressure was searched with, shard_fsdp.weigh_memory)."""
    return prob.comp[k][s] - (prob.pen[k][s] if prob.pen is not None else 0.0)


def summary(sp):
    """The head of `explain` (a list of lines): the plan's totals and what the
    annotations forced."""
    plan = sp.plan
    prob = plan.problem
    peak = peak_memory(prob, plan.sig_index)[0]
    lines = [
        f"plan on {sp.placement} with profile {plan.profile.name}: {_t(plan.time)} per step "
        f"(compute {_t(plan.compute_time)}, communication {_t(plan.comm_time)}), "
        f"{_b(plan.bytes)} moved, peak {_b(peak)} per device",
    ]
    if plan.hidden_count:
        lines.append(
            f"  plus {_t(plan.hidden_time)} of communication hidden behind the backward pass "
            f"({plan.hidden_count} bucketed gradient all-reduces)"
        )
    fsdp, uses, grads = inserted(sp.program)
    if fsdp:
        lines.append(
            f"  under memory_limit: parameters stored split, all-gathered per use (FSDP: "
            f"{uses} uses), {grads} gradients reduce-scattered where computed"
        )
    if sp.name in DERIVED:  # (its SBPs come from the plan it was derived from)
        lines.append(f"the {DERIVED[sp.name]}: SBPs from the plan it derives from:")
    else:
        lines.append("forced by annotations:")
    lines.extend(_forced(sp, prob, fsdp))
    return lines


DERIVED = {
    "jvp": "JVP of a sharded call (grad's forward with tangents)",
    "known": "primal part of a sharded call under grad (saves residuals)",
    "linear": "linear part of a sharded call under grad",
    "transpose": "transposed linear part of a sharded call (grad's backward)",
    "vmap": "batched sharded call (vmap)",
}


def explain(sp, every=True):
    """The plan as text: totals, what the annotations forced, and per equation the chosen
    signature with its cost and its two best alternatives (the change each would make to
    the step's time, and its own compute, incoming bytes and output memory)."""
    plan = sp.plan
    prob = plan.problem
    have = prob.labels_of(plan.sig_index)
    st = _State(prob, plan.sig_index)
    lines = summary(sp)
    lines.append("equations (chosen: compute, incoming conversions | two best alternatives):")
    for k, eqn in enumerate(sp.exec_program.eqns):
        s = plan.sig_index[k]
        t_in, b_in = _incoming(prob, have, k, s)
        if not every and not b_in:
            continue
        where = f" {eqn.source_info.short()}" if eqn.source_info else ""
        head = (
            f"  {k:4d} {eqn.primitive.name}{where}: {_sig_text(prob.cands[k][s])} "
            f"[{_t(_compute(prob, k, s))}, {_b(b_in)}]"
        )
        alts = []
        others = [(st.delta(k, a), a) for a in range(len(prob.cands[k])) if a != s]
        for d, a in sorted(others)[:2]:
            _, ab = _incoming(prob, have, k, a)
            alts.append(
                f"{_sig_text(prob.cands[k][a])} ({_delta(d)}, "
                f"compute {_t(_compute(prob, k, a))}, {_b(ab)} in, "
                f"{_b(_out_memory(prob, k, a))} out)"
            )
        only = " | only choice"
        if any(i in prob.kept for i in prob.eqn_ins[k]):
            only += " (it reads a kept input as stored)"
        lines.append(head + (" | " + "; ".join(alts) if alts else only))
    outs = []
    for n, want in enumerate(sp.out_sbps):
        i = prob.out_ids[n]
        if prob.nd_of(have[i]) != tuple(want):
            w = _code_of(want)
            text = f"output {n} {_nd_text(prob.nd_of(have[i]))} -> {_nd_text(want)}"
            outs.append(f"{text} [{_t(prob.bt(i, have[i], w))}, {_b(prob.bbytes(i, have[i], w))}]")
    lines.append("outputs: " + ("; ".join(outs) if outs else "as computed"))
    return "\n".join(lines)


def _moves(conversions):
    """'S(0) -> B (all_gather, 64 B)' for each conversion."""
    return "; ".join(
        f"{_nd_text(src)} -> {_nd_text(dst)} ({'+'.join(bp.collectives()) or 'relabel'}, "
        f"{_b(bp.bytes)})"
        for src, dst, bp in conversions
    )


def _forced(sp, prob, fsdp):
    """What each annotation forced: per annotated input its SBP and, kept (keep_in_sbp),
    the equations that read it in place, else where the plan converted it; per with_sbp
    the conversion into it; per out_sbp the SBP asked for."""
    ins, outs = ("", "") if sp.name in DERIVED else ("in_sbp: ", "out_sbp: ")
    conv, into = {}, {}
    for where, v, src, dst, bp in sp.boxings():
        conv.setdefault(v, []).append((src, dst, bp))
        into.setdefault((where, v), []).append((src, dst, bp))
    readers = {}
    for k, eqn in enumerate(sp.exec_program.eqns):
        for v in eqn.inputs:
            readers.setdefault(v, []).append(k)
    lines = []
    for n, (v, s) in enumerate(zip(sp.exec_program.invars, sp.in_sbps)):
        name = prob.kept.get(n)
        if name is None and all(x.is_broadcast() for x in s):
            continue
        text = f"  {ins}input {n} {v.aval.str_short()} = {_nd_text(s)}"
        if name is not None:
            ks = sorted(set(readers.get(v, ())))
            at = ", ".join(map(str, ks[:6])) + (", ..." if len(ks) > 6 else "")
            by = f"eqn {at}" if len(ks) == 1 else f"{len(ks)} eqns ({at})" if ks else "no eqn"
            text += f", kept (keep_in_sbp: {name}): read in place by {by}"
        elif v in conv:
            text += f", converted {_moves(conv[v])}"
        else:
            text += ", read as given"
        lines.append(text)
    for k, eqn in enumerate(sp.exec_program.eqns):
        if eqn.primitive is sbp_constraint_p and eqn.outputs[0].id not in fsdp:
            where = eqn.source_info.short() if eqn.source_info else "?"
            moved = into.get((k, eqn.inputs[0]))
            text = f"  with_sbp at {where}: eqn {k} = {_nd_text(eqn.params['sbp'])}"
            lines.append(text + (f", converted {_moves(moved)}" if moved else ", already so"))
    for n, (v, req) in enumerate(zip(sp.exec_program.outvars, sp.requested_out)):
        if req is not None:
            lines.append(f"  {outs}output {n} {v.aval.str_short()} = {_nd_text(req)}")
    return lines


def _code_of(nd):
    return _code(tuple(nd))


def compare(a, b):
    """Where two plans of one program differ (signatures per equation), their totals, and
    which inputs each keeps (keep_in_sbp)."""
    pa, pb = a.plan, b.plan
    lines = [
        f"time {_t(pa.time)} vs {_t(pb.time)} ({pb.time / max(pa.time, 1e-30):.2f}x), "
        f"bytes {_b(pa.bytes)} vs {_b(pb.bytes)}, "
        f"collectives {len(a.collectives())} vs {len(b.collectives())}",
    ]
    ka, kb = (sorted(p.problem.kept.values()) for p in (pa, pb))
    if ka or kb:  # (keep_in_sbp binds one plan's inputs, maybe not the other's)
        lines.append(f"kept inputs: {', '.join(ka) or 'none'} vs {', '.join(kb) or 'none'}")
    ea, eb = a.exec_program.eqns, b.exec_program.eqns
    if len(ea) != len(eb) or any(x.primitive is not y.primitive for x, y in zip(ea, eb)):
        lines.append("(different programs: equations not compared)")
        return "\n".join(lines)
    for k, (x, sa, sb) in enumerate(zip(ea, pa.eqn_sigs, pb.eqn_sigs)):
        if sa.ins != sb.ins or sa.outs != sb.outs:
            where = f" {x.source_info.short()}" if x.source_info else ""
            lines.append(
                f"  {k:4d} {x.primitive.name}{where}: {_sig_text(sa)}  vs  {_sig_text(sb)}"
            )
    if len(lines) == 1:
        lines.append("  same signatures everywhere")
    return "\n".join(lines)
