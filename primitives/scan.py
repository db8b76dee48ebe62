"""`scan`: a loop over the leading axis of its `xs` operands with a carried state.

Operands: consts (num_consts), carry (num_carry), xs. The nested closed program
`jaxpr` maps (consts, carry, x slices) -> (new carry, y slices); the outputs are
(final carry, stacked ys). Rules: eager impl (a Python loop evaluating the
program with NumPy), shape rule, JVP, partial evaluation (a known scan that
stacks residuals + an unknown linear scan), transpose (a reverse scan) and
batching. `lax.scan` / `fori_loop` / `while_loop(max_steps=)` build on it
(fflow/lax_control.py).
"""

import numpy as np
from fflow.transforms import autodiff as ad
from fflow.transforms import program_transforms as pt
from fflow.transforms import vmap as vm
from fflow.transforms.shard_rules import def_broadcast_only
from fflow.transforms.staging import partial_eval_rules

from fflow import lax_ops as lax
from fflow.core import Literal, Primitive, Program, set_current_trace
from fflow.errors import ShapeError, user_error

scan_p = Primitive("scan", multiple_results=True)
scan_p.amp_class = "follow"
# its SBP (as cond's and while's): none planned inside
REPLICATED = (
    "control flow runs whole on every device (scans of up to 64 steps are unrolled "
    "before planning, transforms/shard_unroll.py)"
)
def_broadcast_only(scan_p, REPLICATED)


def _split3(seq, a, b):
    seq = list(seq)
    return seq[:a], seq[a : a + b], seq[a + b :]


def _same(a, b):
    return a.shape == b.shape and a.dtype == b.dtype


@scan_p.def_impl
def _scan_impl(*args, jaxpr, num_consts, num_carry, length, reverse=False, unroll=1):
    consts, carry, xs = _split3(args, num_consts, num_carry)
    y_avals = jaxpr.out_avals[num_carry:]
    ys = [np.empty((length,) + a.shape, a.dtype) for a in y_avals]
    order = range(length - 1, -1, -1) if reverse else range(length)
    for i in order:
        outs = pt.eval_numpy(jaxpr, consts + carry + [x[i] for x in xs])
        carry = outs[:num_carry]
        for buf, y in zip(ys, outs[num_carry:]):
            buf[i] = y
    carry = [np.asarray(c, a.dtype) for c, a in zip(carry, jaxpr.out_avals[:num_carry])]
    return carry + ys


@scan_p.def_abstract_eval
def _scan_abstract_eval(*avals, jaxpr, num_consts, num_carry, length, reverse=False, unroll=1):
    consts, carry, xs = _split3(avals, num_consts, num_carry)
    for x in xs:
        if x.ndim == 0 or x.shape[0] != length:
            raise user_error(
                ShapeError,
                f"scan got an input of type {x.str_short()} for a loop of length {length}; "
                f"every scanned-over input needs a leading axis of size {length}.",
            )
    expected = consts + carry + [x.update(shape=x.shape[1:]) for x in xs]
    body_in = jaxpr.in_avals
    if len(body_in) != len(expected) or not all(map(_same, body_in, expected)):
        raise user_error(
            ShapeError,
            "scan body program takes "
            + ", ".join(a.str_short() for a in body_in)
            + " but the operands give "
            + ", ".join(a.str_short() for a in expected),
        )
    carry_out = jaxpr.out_avals[:num_carry]
    for c_in, c_out in zip(carry, carry_out):
        if not _same(c_in, c_out):
            raise user_error(
                TypeError,
                f"scan body carry input has type {c_in.str_short()} but the body returns "
                f"{c_out.str_short()} for it; the carry must keep its shape and dtype. Fix: "
                f"cast or reshape the new carry (e.g. .astype({c_in.dtype.name})).",
            )
    ys = [a.update(shape=(length,) + a.shape) for a in jaxpr.out_avals[num_carry:]]
    return list(carry_out) + ys  # a weak carry the body makes strong ends strong (JAX)


def scan_bind(consts, init, xs, jaxpr, length, reverse=False, unroll=1):
    return scan_p.bind(
        *consts,
        *init,
        *xs,
        jaxpr=jaxpr,
        num_consts=len(consts),
        num_carry=len(init),
        length=length,
        reverse=reverse,
        unroll=unroll,
    )


# -- JVP --------------------------------------------------------------------------------
def _scan_jvp(primals, tangents, *, jaxpr, num_consts, num_carry, length, reverse=False, unroll=1):
    nz = [type(t) is not ad.Zero for t in tangents]
    const_nz, carry_nz, xs_nz = _split3(nz, num_consts, num_carry)
    n_ys = len(jaxpr.outvars) - num_carry
    for _ in range(num_carry + 1):
        body, body_consts, out_nz = pt.jvp_program(
            jaxpr, const_nz + carry_nz + xs_nz, carry_nz + [False] * n_ys
        )
        carry_out_nz = out_nz[:num_carry]
        if all(o <= c for o, c in zip(carry_out_nz, carry_nz)):
            break
        carry_nz = [a or b for a, b in zip(carry_nz, carry_out_nz)]
    ys_nz = out_nz[num_carry:]
    consts, init, xs = _split3(primals, num_consts, num_carry)
    t_consts, t_init, t_xs = _split3(tangents, num_consts, num_carry)
    t_consts = [t for t, z in zip(t_consts, const_nz) if z]
    t_init = [ad.instantiate(t) for t, z in zip(t_init, carry_nz) if z]
    t_xs = [t for t, z in zip(t_xs, xs_nz) if z]
    # jvp program invars: jvp consts, consts, carry, xs, t_consts, t_carry, t_xs
    nk, nc, ncar, nx = len(body_consts), num_consts, num_carry, len(xs)
    ntc, ntcar, ntx = len(t_consts), len(t_init), len(t_xs)
    idx = list(range(nk + nc + ncar + nx + ntc + ntcar + ntx))
    p_c, rest = idx[: nk + nc], idx[nk + nc :]
    p_car, p_x, rest = rest[:ncar], rest[ncar : ncar + nx], rest[ncar + nx :]
    t_c, t_car, t_x = rest[:ntc], rest[ntc : ntc + ntcar], rest[ntc + ntcar :]
    n_t_ys = sum(ys_nz)
    out_idx = list(range(ncar + n_ys + ntcar + n_t_ys))
    o_car, o_y = out_idx[:ncar], out_idx[ncar : ncar + n_ys]
    o_tcar, o_ty = out_idx[ncar + n_ys : ncar + n_ys + ntcar], out_idx[ncar + n_ys + ntcar :]
    body = pt.permute(body, p_c + t_c + p_car + t_car + p_x + t_x, o_car + o_tcar + o_y + o_ty)
    outs = scan_bind(
        body_consts + consts + t_consts, init + t_init, xs + t_xs, body, length, reverse, unroll
    )
    carry_out, t_carry_out = outs[:ncar], outs[ncar : ncar + ntcar]
    ys, t_ys = outs[ncar + ntcar : ncar + ntcar + n_ys], outs[ncar + ntcar + n_ys :]
    t_carry_it, t_ys_it = iter(t_carry_out), iter(t_ys)
    t_outs = [
        next(t_carry_it) if z else ad.Zero(ad.tangent_aval(a))
        for z, a in zip(carry_nz, jaxpr.out_avals[:num_carry])
    ]
    t_outs += [
        next(t_ys_it) if z else ad.Zero(ad.tangent_aval(a.update(shape=(length,) + a.shape)))
        for z, a in zip(ys_nz, jaxpr.out_avals[num_carry:])
    ]
    return carry_out + ys, t_outs


ad.jvp_rules[scan_p] = _scan_jvp


# -- partial evaluation (linearize) --------------------------------------------------------
def _scan_partial_eval(trace, args, params):
    jaxpr, nc, ncar = params["jaxpr"], params["num_consts"], params["num_carry"]
    length, reverse, unroll = params["length"], params["reverse"], params["unroll"]
    unknowns = [pt.is_tracer_of(a, trace) for a in args]
    const_uk, carry_uk, xs_uk = _split3(unknowns, nc, ncar)
    n_ys = len(jaxpr.outvars) - ncar
    for _ in range(ncar + 1):
        split = pt.partial_eval_program(
            jaxpr, const_uk + carry_uk + xs_uk, carry_uk + [False] * n_ys
        )
        carry_out_uk = split.out_unknowns[:ncar]
        if all(o <= c for o, c in zip(carry_out_uk, carry_uk)):
            break
        carry_uk = [a or b for a, b in zip(carry_uk, carry_out_uk)]
    if all(const_uk + carry_uk + xs_uk):
        return trace.stage(scan_p, args, params)
    ys_uk = split.out_unknowns[ncar:]
    consts, init, xs = _split3(args, nc, ncar)
    k_consts = [c for c, u in zip(consts, const_uk) if not u]
    k_init = [c for c, u in zip(init, carry_uk) if not u]
    k_xs = [x for x, u in zip(xs, xs_uk) if not u]
    known_ins = k_consts + k_init + k_xs
    n_kc, n_kcar = len(k_consts), len(k_init)
    # Residuals: loop-invariant ones (outer values, known consts) become consts of
    # the unknown scan, known xs are passed through, the rest are stacked per step.
    res_const, res_xs, res_stacked = [], [], []
    kinds = []
    n_known_out = len(split.known.outvars) - len(split.residuals)
    invariant = _loop_invariant_residuals(split, k_consts, n_known_out, trace)
    for i, (r, (kind, src)) in enumerate(zip(split.residuals, split.res_kinds)):
        if i in invariant:
            kinds.append(("const", len(res_const)))
            res_const.append(invariant[i])
        elif kind == "outer":
            kinds.append(("const", len(res_const)))
            res_const.append(r)
        elif kind == "input" and src < n_kc:
            kinds.append(("const", len(res_const)))
            res_const.append(known_ins[src])
        elif kind == "input" and src >= n_kc + n_kcar:
            kinds.append(("xs", len(res_xs)))
            res_xs.append(known_ins[src])
        else:
            kinds.append(("stacked", len(res_stacked)))
            res_stacked.append(r)
    # the known scan: outputs known carry, known ys and the stacked residuals
    keep = list(range(n_known_out)) + [
        n_known_out + i for i, (k, _) in enumerate(kinds) if k == "stacked"
    ]
    known_body = pt.permute(split.known, None, keep)
    with set_current_trace(trace.parent):
        k_outs = scan_bind(
            split.known_consts + k_consts, k_init, k_xs, known_body, length, reverse, unroll
        )
    n_kcar_out = n_kcar
    k_carry_out = k_outs[:n_kcar_out]
    n_kys = n_known_out - n_kcar_out
    k_ys = k_outs[n_kcar_out : n_kcar_out + n_kys]
    stacked = k_outs[n_kcar_out + n_kys :]
    # the unknown scan: (res consts, unknown consts | unknown carry | res xs, stacked, unknown xs)
    n_res = len(split.residuals)
    u_consts = [c for c, u in zip(consts, const_uk) if u]
    u_init = [c for c, u in zip(init, carry_uk) if u]
    u_xs = [x for x, u in zip(xs, xs_uk) if u]
    c_order = [i for i, (k, _) in enumerate(kinds) if k == "const"]
    x_order = [i for i, (k, _) in enumerate(kinds) if k == "xs"]
    s_order = [i for i, (k, _) in enumerate(kinds) if k == "stacked"]
    base = n_res
    uc_idx = list(range(base, base + len(u_consts)))
    ucar_idx = list(range(base + len(u_consts), base + len(u_consts) + len(u_init)))
    ux_idx = list(
        range(base + len(u_consts) + len(u_init), base + len(u_consts) + len(u_init) + len(u_xs))
    )
    unknown_body = pt.permute(
        split.unknown, c_order + uc_idx + ucar_idx + x_order + s_order + ux_idx
    )
    u_outs = trace.stage(
        scan_p,
        [res_const[kinds[i][1]] for i in c_order]
        + u_consts
        + u_init
        + [res_xs[kinds[i][1]] for i in x_order]
        + stacked
        + u_xs,
        dict(
            jaxpr=unknown_body,
            num_consts=len(c_order) + len(u_consts),
            num_carry=len(u_init),
            length=length,
            reverse=reverse,
            unroll=unroll,
        ),
    )
    # merge: final carries then ys, in the original order
    k_car_it, u_car_it = iter(k_carry_out), iter(u_outs[: len(u_init)])
    k_ys_it, u_ys_it = iter(k_ys), iter(u_outs[len(u_init) :])
    out = [next(u_car_it) if u else next(k_car_it) for u in carry_uk]
    out += [next(u_ys_it) if u else next(k_ys_it) for u in ys_uk]
    return out


def _loop_invariant_residuals(split, k_consts, n_known_out, trace):
    """Computed residuals that depend only on the scan's consts (e.g. `W.T`): computed
    once outside the loop instead of being stacked per iteration. {index: value}."""
    known = split.known
    n_in = len(split.known_consts) + len(k_consts)
    varying = set(known.invars[n_in:])
    for eqn in known.eqns:
        if any(v in varying for v in eqn.inputs if not isinstance(v, Literal)):
            varying.update(eqn.outputs)
    res_vars = known.outvars[n_known_out:]
    picked = [
        i
        for i, (v, (kind, _)) in enumerate(zip(res_vars, split.res_kinds))
        if kind == "computed" and not isinstance(v, Literal) and v not in varying
    ]
    if not picked:
        return {}
    program = pt.prune(Program(known.invars[:n_in], [], known.eqns, [res_vars[i] for i in picked]))
    with set_current_trace(trace.parent):
        values = pt.call(program, list(split.known_consts) + list(k_consts))
    return dict(zip(picked, values))


partial_eval_rules[scan_p] = _scan_partial_eval


# -- transpose (reverse scan) ---------------------------------------------------------------
def _scan_transpose(cts, *args, jaxpr, num_consts, num_carry, length, reverse=False, unroll=1):
    consts, init, xs = _split3(args, num_consts, num_carry)
    const_lin = [ad.is_undefined(c) for c in consts]
    xs_lin = [ad.is_undefined(x) for x in xs]
    ct_carry = [
        pt.instantiate_ct(c, a) for c, a in zip(cts[:num_carry], jaxpr.out_avals[:num_carry])
    ]
    ct_ys = [
        pt.instantiate_ct(c, a.update(shape=(length,) + a.shape))
        for c, a in zip(cts[num_carry:], jaxpr.out_avals[num_carry:])
    ]
    res_consts = [c for c, lin in zip(consts, const_lin) if not lin]
    res_xs = [x for x, lin in zip(xs, xs_lin) if not lin]
    lin_consts_avals = [c.aval for c, lin in zip(consts, const_lin) if lin]
    linear = const_lin + [True] * num_carry + xs_lin
    # body transpose: (res consts, res xs, ct carry, ct y) -> (ct consts, ct carry, ct xs)
    body_t, body_t_consts = pt.transpose_program(jaxpr, linear)
    n_rc, n_rx, n_lc = len(res_consts), len(res_xs), len(lin_consts_avals)

    def step(*a):
        rc, acc, ctc = a[:n_rc], a[n_rc : n_rc + n_lc], a[n_rc + n_lc : n_rc + n_lc + num_carry]
        rest = a[n_rc + n_lc + num_carry :]
        rx, cty = rest[:n_rx], rest[n_rx:]
        outs = pt.call(body_t, list(body_t_consts) + list(rc) + list(rx) + list(ctc) + list(cty))
        ct_lc, ct_car, ct_lx = outs[:n_lc], outs[n_lc : n_lc + num_carry], outs[n_lc + num_carry :]
        return [lax.add(x, y) for x, y in zip(acc, ct_lc)] + list(ct_car) + list(ct_lx)

    step_avals = (
        [pt.core.aval_of_value(c) for c in res_consts]
        + [ad.tangent_aval(a) for a in lin_consts_avals]
        + [ad.tangent_aval(a) for a in jaxpr.out_avals[:num_carry]]
        + [a.update(shape=a.shape[1:]) for a in (pt.core.aval_of_value(x) for x in res_xs)]
        + [ad.tangent_aval(a) for a in jaxpr.out_avals[num_carry:]]
    )
    step_prog, step_consts = pt.trace_closed(step, step_avals)
    acc0 = [ad.zeros_like_aval(ad.tangent_aval(a)) for a in lin_consts_avals]
    outs = scan_bind(
        step_consts + res_consts,
        acc0 + ct_carry,
        res_xs + ct_ys,
        step_prog,
        length,
        not reverse,
        unroll,
    )
    ct_lc, ct_init, ct_lx = outs[:n_lc], outs[n_lc : n_lc + num_carry], outs[n_lc + num_carry :]
    lc_it, lx_it = iter(ct_lc), iter(ct_lx)
    result = [next(lc_it) if lin else None for lin in const_lin]
    result += [ct if ad.is_undefined(c) else None for c, ct in zip(init, ct_init)]
    result += [next(lx_it) if lin else None for lin in xs_lin]
    return result


ad.transpose_rules[scan_p] = _scan_transpose


# -- batching ---------------------------------------------------------------------------
def _scan_batch(vals, dims, *, jaxpr, num_consts, num_carry, length, reverse=False, unroll=1):
    size = vm.batch_size(vals, dims)
    b = [d is not vm.not_mapped for d in dims]
    const_b, carry_b, xs_b = _split3(b, num_consts, num_carry)
    n_ys = len(jaxpr.outvars) - num_carry
    for _ in range(num_carry + 1):
        body, out_b = vm.batch_program(
            jaxpr, size, const_b + carry_b + xs_b, carry_b + [False] * n_ys
        )
        carry_out_b = out_b[:num_carry]
        if all(o <= c for o, c in zip(carry_out_b, carry_b)):
            break
        carry_b = [x or y for x, y in zip(carry_b, carry_out_b)]
    consts, init, xs = _split3(vals, num_consts, num_carry)
    c_d, i_d, x_d = _split3(dims, num_consts, num_carry)
    consts = [vm.moveaxis(c, d, 0) if bb else c for c, d, bb in zip(consts, c_d, const_b)]
    init = [vm.move_bdim(c, d, 0, size) if bb else c for c, d, bb in zip(init, i_d, carry_b)]
    xs = [vm.moveaxis(x, d, 1) if bb else x for x, d, bb in zip(xs, x_d, xs_b)]
    outs = scan_bind(consts, init, xs, body, length, reverse, unroll)
    out_dims = [0 if bb else None for bb in carry_b] + [
        1 if bb else None for bb in out_b[num_carry:]
    ]
    return outs, out_dims


vm.batch_rules[scan_p] = _scan_batch

__all__ = ["scan_p", "scan_bind"]
