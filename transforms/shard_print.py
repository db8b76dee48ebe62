"""Printing a sharded program: every var with its SBP, every inserted collective with
its bytes, and the total bytes moved per call.

    shard on placement(type='cpu', ranks=[0, 1]): 64 bytes per call
    { lambda ; a:f32[4,3]{S(0)} b:f32[3,2]{B}. let
        c:f32[4,2]{S(0)} = dot_general[...] a b
        d:f32[4,2]{B} = all_gather[mesh_axes=(0,) S(0)->B] c    # 32 bytes
      in (d) }
"""

from fflow.core import Literal
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
        from fflow.core import Var

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
    from fflow.transforms.shard_boxing import _ops_1d_names

    ops = "+".join(_ops_1d_names(step.src, step.dst)) or "relabel"
    return f"{ops}[mesh_axes={step.axes} {step.src}->{step.dst}]"
