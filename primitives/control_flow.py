"""Structured control flow: `cond` (n-way, by an int32 index) and `while`.

Both hold closed nested programs as params; what the Python functions closed over
is passed as explicit operands. `scan` lives in primitives/scan.py. The public
wrappers (`lax.cond`, `switch`, `while_loop`, `fori_loop`, `scan`, `map`) are in
fflow/lax_control.py.

cond: operands (index, *ops); params branches=(program, ...) with equal signatures.
while: operands (*cond_consts, *body_consts, *carry); params cond_jaxpr, body_jaxpr,
cond_nconsts, body_nconsts. Reverse mode through a while loop works only where no
cotangent reaches it (its known carries run eagerly); otherwise it asks for
`max_steps=` (a scan).
"""

import numpy as np
from fflow.primitives import scan as _scan  # noqa: F401  (registers scan_p)
from fflow.transforms import autodiff as ad
from fflow.transforms import program_transforms as pt
from fflow.transforms import vmap as vm
from fflow.transforms.shard_rules import def_broadcast_only
from fflow.transforms.staging import partial_eval_rules

from fflow import core
from fflow import lax_ops as lax
from fflow.core import Literal, Primitive, Var
from fflow.errors import FflowError, ShapeError, user_error

cond_p = Primitive("cond", multiple_results=True)
cond_p.amp_class = "follow"
while_p = Primitive("while", multiple_results=True)
while_p.amp_class = "follow"
for _p in (cond_p, while_p):
    def_broadcast_only(_p, _scan.REPLICATED)


def _same(a, b):
    return a.shape == b.shape and a.dtype == b.dtype


def _avals_text(avals):
    return "(" + ", ".join(a.str_short() for a in avals) + ")"


# ======================================================================================
# cond


@cond_p.def_impl
def _cond_impl(index, *ops, branches):
    i = int(np.clip(int(index), 0, len(branches) - 1))
    return pt.eval_numpy(branches[i], list(ops))


@cond_p.def_abstract_eval
def _cond_abstract_eval(index, *ops, branches):
    if index.shape != () or index.dtype.kind not in "iu":
        raise user_error(
            TypeError, f"cond index must be an integer scalar, got {index.str_short()}"
        )
    first = branches[0]
    for i, br in enumerate(branches):
        if len(br.in_avals) != len(ops) or not all(map(_same, br.in_avals, ops)):
            raise user_error(
                TypeError,
                f"cond branch {i} takes {_avals_text(br.in_avals)} but the operands are "
                f"{_avals_text(ops)}",
            )
        if len(br.out_avals) != len(first.out_avals) or not all(
            map(_same, br.out_avals, first.out_avals)
        ):
            raise user_error(
                TypeError,
                f"cond branches must return the same types: branch 0 returns "
                f"{_avals_text(first.out_avals)} but branch {i} returns "
                f"{_avals_text(br.out_avals)}",
            )
    return list(first.out_avals)


def _join_branch_consts(branch_progs, branch_consts):
    """Every branch takes all branches' consts (ignoring the others') + the operands."""
    avals = [[pt.core.aval_of_value(c) for c in cs] for cs in branch_consts]
    joined = []
    for i, prog in enumerate(branch_progs):
        before = [a for cs in avals[:i] for a in cs]
        n_own = len(avals[i])
        after = [a for cs in avals[i + 1 :] for a in cs]
        own = prog.invars[:n_own]
        rest = prog.invars[n_own:]
        pre = [Var(a) for a in before]
        post = [Var(a) for a in after]
        joined.append(prog.replace(invars=pre + list(own) + post + list(rest)))
    consts = [c for cs in branch_consts for c in cs]
    return joined, consts


def _cond_jvp(primals, tangents, *, branches):
    index, *ops = primals
    nz = [type(t) is not ad.Zero for t in tangents[1:]]
    n_out = len(branches[0].outvars)
    out_nz = [False] * n_out
    for br in branches:
        _, _, o = pt.jvp_program(br, nz, False)
        out_nz = [a or b for a, b in zip(out_nz, o)]
    progs, consts = [], []
    for br in branches:
        p, c, _ = pt.jvp_program(br, nz, out_nz)
        progs.append(p)
        consts.append(c)
    progs, all_consts = _join_branch_consts(progs, consts)
    t_ops = [t for t, z in zip(tangents[1:], nz) if z]
    outs = cond_p.bind(index, *all_consts, *ops, *t_ops, branches=tuple(progs))
    primal_out, t_out_it = outs[:n_out], iter(outs[n_out:])
    t_out = [
        next(t_out_it) if z else ad.Zero(ad.tangent_aval(a))
        for z, a in zip(out_nz, branches[0].out_avals)
    ]
    return primal_out, t_out


ad.jvp_rules[cond_p] = _cond_jvp


def _cond_partial_eval(trace, args, params):
    branches = params["branches"]
    index, *ops = args
    if pt.is_tracer_of(index, trace):
        return trace.stage(cond_p, args, params)
    uk = [pt.is_tracer_of(a, trace) for a in ops]
    n_out = len(branches[0].outvars)
    out_uk = [False] * n_out
    for br in branches:
        s = pt.partial_eval_program(br, uk, False)
        out_uk = [a or b for a, b in zip(out_uk, s.out_unknowns)]
    splits = [pt.partial_eval_program(br, uk, out_uk) for br in branches]
    known_ops = [o for o, u in zip(ops, uk) if not u]
    known_op_avals = [pt.core.aval_of_value(o) for o in known_ops]
    res_avals = [s.res_avals for s in splits]
    n_known_out = n_out - sum(out_uk)
    # known branches: (all known consts, known ops) -> (known outs, every branch's residuals)
    k_consts_avals = [[pt.core.aval_of_value(c) for c in s.known_consts] for s in splits]
    known_progs = []
    for i, s in enumerate(splits):

        def f(*a, i=i, s=s):
            n_kc_all = sum(len(c) for c in k_consts_avals)
            consts_all, kops = a[:n_kc_all], a[n_kc_all:]
            start = sum(len(c) for c in k_consts_avals[:i])
            mine = list(consts_all[start : start + len(k_consts_avals[i])])
            outs = pt.call(s.known, mine + list(kops))
            k_outs, res = outs[:n_known_out], outs[n_known_out:]
            filled = []
            for j, ra in enumerate(res_avals):
                if j == i:
                    filled += list(res)
                else:
                    filled += [lax.full(a.shape, 0, a.dtype) for a in ra]
            return list(k_outs) + filled

        in_avals = [a for ca in k_consts_avals for a in ca] + known_op_avals
        prog, c = pt.trace_closed(f, in_avals)
        known_progs.append((prog, c))
    progs, extra = _join_branch_consts([p for p, _ in known_progs], [c for _, c in known_progs])
    all_k_consts = [c for s in splits for c in s.known_consts]
    with pt.set_current_trace(trace.parent):
        k_outs = cond_p.bind(index, *extra, *all_k_consts, *known_ops, branches=tuple(progs))
    known_outs, residuals = k_outs[:n_known_out], k_outs[n_known_out:]
    # unknown branches: (all residuals, unknown ops) -> unknown outs
    u_progs = []
    for i, s in enumerate(splits):
        before = [a for ra in res_avals[:i] for a in ra]
        after = [a for ra in res_avals[i + 1 :] for a in ra]
        u_progs.append(pt.pad_invars(s.unknown, before, ()))
        n_own = len(res_avals[i])
        p = u_progs[-1]
        k = len(before) + n_own
        u_progs[-1] = p.replace(
            invars=list(p.invars[:k]) + [Var(a) for a in after] + list(p.invars[k:])
        )
    u_ops = [o for o, u in zip(ops, uk) if u]
    u_outs = trace.stage(cond_p, [index, *residuals, *u_ops], dict(branches=tuple(u_progs)))
    k_it, u_it = iter(known_outs), iter(u_outs)
    return [next(u_it) if u else next(k_it) for u in out_uk]


partial_eval_rules[cond_p] = _cond_partial_eval


def _cond_transpose(cts, index, *ops, branches):
    if ad.is_undefined(index):
        raise FflowError("cond is not linear in its index")
    linear = [ad.is_undefined(o) for o in ops]
    res = [o for o, lin in zip(ops, linear) if not lin]
    out_avals = branches[0].out_avals
    cts = [pt.instantiate_ct(c, a) for c, a in zip(cts, out_avals)]
    progs, consts = [], []
    for br in branches:
        p, c = pt.transpose_program(br, linear)
        progs.append(p)
        consts.append(c)
    progs, all_consts = _join_branch_consts(progs, consts)
    outs = cond_p.bind(index, *all_consts, *res, *cts, branches=tuple(progs))
    it = iter(outs)
    return [None] + [next(it) if lin else None for lin in linear]


ad.transpose_rules[cond_p] = _cond_transpose


def _cond_batch(vals, dims, *, branches):
    size = vm.batch_size(vals, dims)
    (index, *ops), (d_index, *d_ops) = vals, dims
    if d_index is not vm.not_mapped:
        # a batched index: run every branch on the whole batch and select per lane
        ops = [vm.bdim_to_front(o, d, size) for o, d in zip(ops, d_ops)]
        index = vm.moveaxis(index, d_index, 0)
        in_b = [True] * len(ops)
        outs_per_branch = []
        for br in branches:
            prog, _ = vm.batch_program(br, size, in_b, True)
            outs_per_branch.append(pt.call(prog, ops))
        n = len(branches)
        index = lax.clamp(0, lax.convert_element_type(index, np.int32), n - 1)
        outs = []
        for k in range(len(branches[0].outvars)):
            cases = [o[k] for o in outs_per_branch]
            shape = cases[0].shape
            which = lax.broadcast_in_dim(index, shape, (0,))
            if n == 2:
                which = lax.ne(which, lax.full(shape, 0, np.int32))
            outs.append(lax.select_n(which, *cases))
        return outs, [0] * len(outs)
    in_b = [d is not vm.not_mapped for d in d_ops]
    out_b = [False] * len(branches[0].outvars)
    for br in branches:
        _, ob = vm.batch_program(br, size, in_b, False)
        out_b = [a or b for a, b in zip(out_b, ob)]
    progs = tuple(vm.batch_program(br, size, in_b, out_b)[0] for br in branches)
    ops = [vm.moveaxis(o, d, 0) if b else o for o, d, b in zip(ops, d_ops, in_b)]
    outs = cond_p.bind(index, *ops, branches=progs)
    return outs, [0 if b else None for b in out_b]


vm.batch_rules[cond_p] = _cond_batch


# ======================================================================================
# while


def _split_while(args, cond_nconsts, body_nconsts):
    args = list(args)
    return (
        args[:cond_nconsts],
        args[cond_nconsts : cond_nconsts + body_nconsts],
        args[cond_nconsts + body_nconsts :],
    )


@while_p.def_impl
def _while_impl(*args, cond_jaxpr, body_jaxpr, cond_nconsts, body_nconsts):
    cconsts, bconsts, carry = _split_while(args, cond_nconsts, body_nconsts)
    while bool(pt.eval_numpy(cond_jaxpr, cconsts + carry)[0]):
        carry = pt.eval_numpy(body_jaxpr, bconsts + carry)
    return [np.asarray(c, a.dtype) for c, a in zip(carry, body_jaxpr.out_avals)]


@while_p.def_abstract_eval
def _while_abstract_eval(*avals, cond_jaxpr, body_jaxpr, cond_nconsts, body_nconsts):
    cconsts, bconsts, carry = _split_while(avals, cond_nconsts, body_nconsts)
    (pred,) = cond_jaxpr.out_avals
    if pred.shape != () or pred.dtype != np.bool_:
        raise user_error(
            TypeError,
            f"while_loop cond_fun must return a boolean scalar, got {pred.str_short()}. "
            f"Fix: reduce it (e.g. jnp.all(...)) or compare (x < n).",
        )
    if not all(map(_same, cond_jaxpr.in_avals, cconsts + carry)):
        raise user_error(ShapeError, "while_loop cond program does not match its operands")
    if not all(map(_same, body_jaxpr.in_avals, bconsts + carry)):
        raise user_error(ShapeError, "while_loop body program does not match its operands")
    for c_in, c_out in zip(carry, body_jaxpr.out_avals):
        if not _same(c_in, c_out):
            raise user_error(
                TypeError,
                f"while_loop body_fun carry input has type {c_in.str_short()} but the body "
                f"returns {c_out.str_short()} for it; the carry must keep its shape and dtype.",
            )
    return list(carry)


def while_bind(cconsts, bconsts, init, cond_jaxpr, body_jaxpr):
    return while_p.bind(
        *cconsts,
        *bconsts,
        *init,
        cond_jaxpr=cond_jaxpr,
        body_jaxpr=body_jaxpr,
        cond_nconsts=len(cconsts),
        body_nconsts=len(bconsts),
    )


def _while_jvp(primals, tangents, *, cond_jaxpr, body_jaxpr, cond_nconsts, body_nconsts):
    cconsts, bconsts, carry = _split_while(primals, cond_nconsts, body_nconsts)
    _, t_bconsts, t_carry = _split_while(tangents, cond_nconsts, body_nconsts)
    bconst_nz = [type(t) is not ad.Zero for t in t_bconsts]
    carry_nz = [type(t) is not ad.Zero for t in t_carry]
    for _ in range(len(carry) + 1):
        body, body_consts, out_nz = pt.jvp_program(body_jaxpr, bconst_nz + carry_nz, carry_nz)
        if all(o <= c for o, c in zip(out_nz, carry_nz)):
            break
        carry_nz = [a or b for a, b in zip(carry_nz, out_nz)]
    t_bconsts = [t for t, z in zip(t_bconsts, bconst_nz) if z]
    t_carry = [ad.instantiate(t) for t, z in zip(t_carry, carry_nz) if z]
    nk, nb, nc, ntb, ntc = len(body_consts), len(bconsts), len(carry), len(t_bconsts), len(t_carry)
    # jvp invars: jvp consts, bconsts, carry, t_bconsts, t_carry
    idx = list(range(nk + nb + nc + ntb + ntc))
    order = idx[: nk + nb] + idx[nk + nb + nc : nk + nb + nc + ntb] + idx[nk + nb : nk + nb + nc]
    order += idx[nk + nb + nc + ntb :]
    body = pt.permute(body, order)
    cond = pt.pad_invars(
        cond_jaxpr, (), [ad.tangent_aval(t.aval) for t in body.invars[-ntc:]] if ntc else ()
    )
    outs = while_bind(cconsts, body_consts + bconsts + t_bconsts, carry + t_carry, cond, body)
    primal_out, t_it = outs[:nc], iter(outs[nc:])
    t_out = [
        next(t_it) if z else ad.Zero(ad.tangent_aval(a))
        for z, a in zip(carry_nz, body_jaxpr.out_avals)
    ]
    return primal_out, t_out


ad.jvp_rules[while_p] = _while_jvp


_WHILE_REVERSE_MSG = (
    "Reverse-mode differentiation (grad / vjp / linearize) does not work through a "
    "while_loop whose number of iterations is only known at run time. Fix: pass "
    "max_steps=N to fflow.lax.while_loop (it then becomes a scan of N steps that "
    "stops updating once cond_fun is False), or use fori_loop with static Python-int "
    "bounds. Forward mode (jvp, jacfwd) works as is."
)


def _depends(program, flags):
    """Which outputs of `program` depend on the invars flagged in `flags` (conservative)."""
    hit = {v for v, f in zip(program.invars, flags) if f}
    for eqn in program.eqns:
        if any(type(v) is not Literal and v in hit for v in eqn.inputs):
            hit.update(eqn.outputs)
    return [type(v) is not Literal and v in hit for v in program.outvars]


def _while_partial_eval(trace, args, params):
    """JAX's split: carries that do not depend on unknown (tangent) values run now in a
    loop of their own; the unknown ones stage the whole loop (recomputing the known
    part). Only a cotangent that reaches a staged loop needs a transpose, which fails
    with the fix (an aux metric or dead code computed by a while_loop is fine)."""
    cn, bn = params["cond_nconsts"], params["body_nconsts"]
    cond, body = params["cond_jaxpr"], params["body_jaxpr"]
    unknown = [pt.is_tracer_of(a, trace) for a in args]
    c_uk, b_uk, k_uk = unknown[:cn], unknown[cn : cn + bn], unknown[cn + bn :]
    for _ in range(len(k_uk) + 1):
        out_uk = _depends(body, b_uk + k_uk)
        new = [a or b for a, b in zip(k_uk, out_uk)]
        if new == k_uk:
            break
        k_uk = new
    if any(c_uk) or any(_depends(cond, c_uk + k_uk)):
        raise user_error(FflowError, _WHILE_REVERSE_MSG)
    cconsts, bconsts, carry = _split_while(args, cn, bn)
    keep_b = [not u for u in b_uk]
    keep_k = [not u for u in k_uk]
    known_body = pt.prune(body.replace(outvars=[v for v, k in zip(body.outvars, keep_k) if k]))
    known_body = known_body.replace(invars=[v for v, k in zip(body.invars, keep_b + keep_k) if k])
    known_cond = pt.prune(cond)
    known_cond = known_cond.replace(
        invars=[v for v, k in zip(cond.invars, [True] * cn + keep_k) if k]
    )
    kb = [a for a, k in zip(bconsts, keep_b) if k]
    kc = [a for a, k in zip(carry, keep_k) if k]
    known_outs = iter([])
    if kc:
        with core.set_current_trace(trace.parent):
            known_outs = iter(while_bind(cconsts, kb, kc, known_cond, known_body))
    staged = trace.stage(while_p, args, params) if any(k_uk) else None
    return [staged[i] if u else next(known_outs) for i, u in enumerate(k_uk)]


def _while_transpose(cts, *args, **params):
    raise user_error(FflowError, _WHILE_REVERSE_MSG)


ad.transpose_rules[while_p] = _while_transpose
partial_eval_rules[while_p] = _while_partial_eval


def _while_batch(vals, dims, *, cond_jaxpr, body_jaxpr, cond_nconsts, body_nconsts):
    size = vm.batch_size(vals, dims)
    cconsts, bconsts, carry = _split_while(vals, cond_nconsts, body_nconsts)
    cd, bd, kd = _split_while(dims, cond_nconsts, body_nconsts)
    cb = [d is not vm.not_mapped for d in cd]
    bb = [d is not vm.not_mapped for d in bd]
    carry_b = [d is not vm.not_mapped for d in kd]
    for _ in range(len(carry) + 1):
        body, out_b = vm.batch_program(body_jaxpr, size, bb + carry_b, carry_b)
        if all(o <= c for o, c in zip(out_b, carry_b)):
            break
        carry_b = [a or b for a, b in zip(carry_b, out_b)]
    cond, (pred_b,) = vm.batch_program(cond_jaxpr, size, cb + carry_b, False)
    if pred_b:
        # lanes finish at different steps: run while any lane is active, freeze the others
        carry_b = [True] * len(carry)
        body, _ = vm.batch_program(body_jaxpr, size, bb + carry_b, True)
        cond, _ = vm.batch_program(cond_jaxpr, size, cb + carry_b, True)
    cconsts = [vm.moveaxis(c, d, 0) if b else c for c, d, b in zip(cconsts, cd, cb)]
    bconsts = [vm.moveaxis(c, d, 0) if b else c for c, d, b in zip(bconsts, bd, bb)]
    carry = [vm.move_bdim(c, d, 0, size) if b else c for c, d, b in zip(carry, kd, carry_b)]
    if not pred_b:
        outs = while_bind(cconsts, bconsts, carry, cond, body)
        return outs, [0 if b else None for b in carry_b]
    nc, nb = len(cconsts), len(bconsts)

    def any_active(*a):
        (pred,) = pt.call(cond, a)
        return [lax.reduce_or(pred, (0,))]

    def masked_body(*a):
        cc, bc, c = a[:nc], a[nc : nc + nb], a[nc + nb :]
        (pred,) = pt.call(cond, list(cc) + list(c))
        new = pt.call(body, list(bc) + list(c))
        out = []
        for n, o in zip(new, c):
            which = lax.broadcast_in_dim(pred, o.shape, (0,))
            out.append(lax.select_n(which, o, n))
        return out

    carry_avals = [pt.core.aval_of_value(c) for c in carry]
    cc_avals = [pt.core.aval_of_value(c) for c in cconsts]
    bc_avals = [pt.core.aval_of_value(c) for c in bconsts]
    cond2, cond2_consts = pt.trace_closed(any_active, cc_avals + carry_avals)
    body2, body2_consts = pt.trace_closed(masked_body, cc_avals + bc_avals + carry_avals)
    outs = while_bind(cond2_consts + cconsts, body2_consts + cconsts + bconsts, carry, cond2, body2)
    return outs, [0] * len(outs)


vm.batch_rules[while_p] = _while_batch

__all__ = ["cond_p", "while_p", "while_bind"]
