"""Rows of the NumPy code generator for non-elementwise primitives: matmul without
operand copies, reductions, views, in-place scatter / dynamic_update_slice, and control
flow (`cond`, `while`, `scan`) and calls (`custom_jvp_call`, `custom_vjp_call`,
`checkpoint`) as Python control flow around compiled bodies.

A row is `emit(ctx, eqn, step_index)`; `ctx` is the rendering state of
`numpy_backend` (names, constants, emitted lines, buffer ownership).
"""

import functools

import numpy as np
from fflow.lowering import cpu_attention, cpu_casts, cpu_epilogue, cpu_gemm
from fflow.lowering.schedule import FusionGroup
from fflow.primitives.along_axis import add_along_axis_into, scatter_add_along_axis_p
from fflow.primitives.attention import attention_bwd_p, attention_p
from fflow.primitives.control_flow import cond_p, while_p
from fflow.primitives.dot import dot_general_p
from fflow.primitives.indexing import (
    dynamic_update_slice_p,
    scatter_add_p,
    scatter_into,
    scatter_max_p,
    scatter_min_p,
    scatter_mul_p,
    scatter_p,
)
from fflow.primitives.reduction import reduce_max_p, reduce_min_p, reduce_sum_p
from fflow.primitives.scan import scan_p
from fflow.primitives.shape import broadcast_in_dim_p, reshape_p, transpose_p
from fflow.primitives.unary import stop_gradient_p

from fflow import threads
from fflow.core import Literal, Var


def _params_call(ctx, eqn, prefix):
    fn = ctx.const(eqn.primitive.impl, f"{prefix}_{eqn.primitive.name}_")
    if not eqn.params:
        return fn + "({})"
    p = ctx.const(dict(eqn.params), "p")
    return fn + ("({}, **" if eqn.inputs else "({}**") + p + ")"


def emit_fallback(ctx, eqn, i):
    """Call the primitive's reference implementation (any primitive)."""
    args = ", ".join(ctx.arg(v, as_array=True) for v in eqn.inputs)
    call = _params_call(ctx, eqn, "impl").format(args)
    outs = [ctx.name(v) for v in eqn.outputs]
    if not outs:
        ctx.emit(call)
    elif eqn.primitive.multiple_results:
        ctx.emit(f"{', '.join(outs) + (',' if len(outs) == 1 else '')} = {call}")
    else:
        ctx.emit(f"{outs[0]} = {call}")


_LOW = ("bfloat16", "float16")  # by name: ml_dtypes (bf16) is an optional extra


def _free(ndim, contract, batch):
    return [d for d in range(ndim) if d not in contract and d not in batch]


def _view(name, shape, groups):
    """`name` as an array whose axes are `groups` (lists of source dims, each merged
    into one axis), as a view where NumPy can make one.

    When every group is a run of consecutive source dims, the source is reshaped
    first (a view of a contiguous array) and the merged axes transposed after, e.g.
    a weight gradient contracting (batch, seq) of a (b, s, f) activation is the view
    `x.reshape(b*s, f).T`, not a copy made by reshaping a transposed array.
    """
    target = tuple(int(np.prod([shape[d] for d in g], dtype=np.int64)) for g in groups)
    runs = all(list(g) == list(range(g[0], g[0] + len(g))) for g in groups if g)
    if runs:
        order = sorted((k for k, g in enumerate(groups) if g), key=lambda k: groups[k][0])
        order += [k for k, g in enumerate(groups) if not g]  # size-1 axes at the end
        merged = tuple(target[k] for k in order)
        expr = name if merged == tuple(shape) else f"{name}.reshape({merged})"
        perm = tuple(order.index(k) for k in range(len(groups)))
        if perm != tuple(range(len(groups))):
            expr = f"np.transpose({expr}, {perm})"
        return expr
    perm = [d for g in groups for d in g]
    expr = f"np.transpose({name}, {tuple(perm)})"
    if tuple(shape[d] for d in perm) != target:
        expr = f"{expr}.reshape({target})"
    return expr


def _uses(ctx):
    uses = getattr(ctx, "_uses", None)
    if uses is None:
        uses = {}
        for step in ctx.steps:
            for e in getattr(step, "eqns", None) or [step]:
                for u in e.inputs:
                    uses.setdefault(u, []).append(e)
        ctx._uses = uses
    return uses


def _only_views_read(ctx, v):
    """Whether only reshapes and broadcasts read `v` (and v is no output)."""
    views = (reshape_p, broadcast_in_dim_p)
    return v not in ctx.outset and all(e.primitive in views for e in _uses(ctx).get(v, ()))


def _only_transposed(ctx, v):
    """Whether every use of 2-D `v` is `transpose(v, (1, 0))` (and v is no output)."""
    found = _uses(ctx).get(v, [])
    return (
        bool(found)
        and v not in ctx.outset
        and all(
            e.primitive is transpose_p and tuple(e.params["permutation"]) == (1, 0) for e in found
        )
    )


def _dot_plan(ctx, eqn):
    """How `emit_dot` renders this dot_general, or None (the reference renders it)."""
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lhs, rhs = eqn.inputs
    pet = eqn.params.get("preferred_element_type")
    la, ra = lhs.aval, rhs.aval
    # bf16/fp16 operands (amp) multiply as float32 copies, as the reference does
    low = la.dtype == ra.dtype and la.dtype.name in _LOW
    low = low and (pet is None or np.dtype(pet).name in _LOW + ("float32",))
    if not (
        la.dtype == ra.dtype
        and (low or la.dtype.kind == "f" and la.dtype.itemsize >= 4)
        and (low or pet is None or np.dtype(pet) == la.dtype)
        and type(lhs) is not Literal
        and type(rhs) is not Literal
    ):
        return None
    lf, rf = _free(la.ndim, lc, lb), _free(ra.ndim, rc, rb)
    bshape = tuple(la.shape[d] for d in lb)
    m = int(np.prod([la.shape[d] for d in lf], dtype=np.int64))
    n = int(np.prod([ra.shape[d] for d in rf], dtype=np.int64))
    k = int(np.prod([la.shape[d] for d in lc], dtype=np.int64))
    a, b = ctx.name(lhs), ctx.name(rhs)
    if low:  # float32 copies (lowering/cpu_casts.py: a C loop for bf16)
        f32 = ctx.const(np.dtype(np.float32), "dt")
        cast = ctx.const(cpu_casts.cast, "cast")
        a, b = f"{cast}({a}, {f32})", f"{cast}({b}, {f32})"
    a = _view(a, la.shape, [[d] for d in lb] + [lf, list(lc)])
    b = _view(b, ra.shape, [[d] for d in rb] + [list(rc), rf])
    out = eqn.outputs[0]
    mshape = bshape + (m, n)
    swapped = not bshape and len(lf) == len(rf) == 1 and _only_transposed(ctx, out)
    if swapped:
        # the product is only read transposed (weight gradients): compute it in that
        # layout, (a @ b).T = b.T @ a.T, so the transpose is a contiguous array
        a, b, mshape = f"np.transpose({b})", f"np.transpose({a})", (n, m)
    name = ctx.name(out)
    post = []
    if swapped:
        post.append(f"{name} = np.transpose({name})")
    elif mshape != tuple(out.aval.shape):
        post.append(f"{name} = {name}.reshape({tuple(out.aval.shape)})")
    if low and out.aval.dtype != np.float32:  # f32 accumulation, rounded once
        cast = ctx.const(cpu_casts.cast, "cast")
        post.append(f"{name} = {cast}({name}, {ctx.const(out.aval.dtype, 'dt')})")
    return {
        "a": a,
        "b": b,
        "name": name,
        "mshape": mshape,
        "dt": ctx.const(np.dtype(np.float32) if low else out.aval.dtype, "dt"),
        "flops": 2 * m * n * k * int(np.prod(bshape, dtype=np.int64)),
        "empty": m * n * k == 0,
        "post": post,
        # a plain M x N product in the output's layout: it may take an epilogue
        "plain": not bshape and not swapped and not low,
        # computed transposed (weight gradients): an epilogue reads it as its transpose
        "swapped": swapped and not low,
    }


def _partner(ctx, eqn, i):
    """The next product, past views only, when it is a large 2-D one independent of
    this one: the two run side by side on the pool (the weight and input gradients of
    one layer). It moves up past the views, which it does not read."""
    between = {eqn.outputs[0]}
    for j in range(i + 1, min(i + 4, len(ctx.steps))):
        nxt = ctx.steps[j]
        if type(nxt) is FusionGroup or id(nxt) in ctx.skip:
            return None
        if nxt.primitive is dot_general_p:
            break
        if not {"view", "shape"} <= nxt.primitive.traits:  # a reshape, transpose, slice...
            return None
        between.update(nxt.outputs)
    else:
        return None
    if between.intersection(nxt.inputs) or nxt.params["dimension_numbers"][1] != ((), ()):
        return None
    plan = _dot_plan(ctx, nxt)
    if plan is None or plan["empty"] or plan["flops"] < threads.SMALL_GEMM_FLOPS:
        return None
    return nxt, plan, j


def _epilogue(ctx, eqn, i, plan, at=None):
    """The epilogue of a plain product (lowering/cpu_epilogue.py): (Epilogue's global,
    pointers, lines after the product), or None."""
    if plan["empty"] or len(plan["mshape"]) != 2:  # batched products take no epilogue
        return None
    m, n = plan["mshape"]
    if plan["plain"]:
        found = cpu_epilogue.find(ctx, eqn, i, m, n, at)
        return None if found is None else cpu_epilogue.emit(ctx, found, i, plan["name"])
    if not plan["swapped"]:
        return None
    # the buffer holds out.T, which is what the (only) transpose of `out` reads
    uses = [
        (k, s)
        for k, s in enumerate(ctx.steps)
        if type(s) is not FusionGroup and eqn.outputs[0] in s.inputs
    ]
    if len(uses) != 1:
        return None
    k, transpose = uses[0]
    found = cpu_epilogue.find(ctx, transpose, k, m, n, i if at is None else at)
    alias = f"np.transpose({plan['name']})"  # after the post lines: out.T, contiguous
    return None if found is None else cpu_epilogue.emit(ctx, found, i, plan["name"], alias)


def emit_dot(ctx, eqn, i):
    """dot_general as one matmul over views: transposes become BLAS flags, batch dims
    stay as matmul's batch dims (any layout NumPy's BLAS path accepts, no copies);
    large products run on fflow's GEMM pool (lowering/cpu_gemm.py) into a fresh buffer,
    two independent 2-D ones in a row side by side (`cpu_gemm.matmul2`); the
    elementwise steps after a product run as its epilogue (lowering/cpu_epilogue.py)."""
    plan = _dot_plan(ctx, eqn)
    if plan is None:
        return emit_fallback(ctx, eqn, i)
    threads.blas()  # fflow owns BLAS threading from the first compiled GEMM on
    a, b, name, mshape, dt = plan["a"], plan["b"], plan["name"], plan["mshape"], plan["dt"]
    flops, post = plan["flops"], plan["post"]
    if flops >= threads.SMALL_GEMM_FLOPS and not plan["empty"]:
        ctx.globals["_mm"] = cpu_gemm.matmul
        ctx.gemm_pool = True
        ctx.emit(f"{name} = np.empty({mshape}, {dt})")
        pair = _partner(ctx, eqn, i) if eqn.params["dimension_numbers"][1] == ((), ()) else None
        epi = _epilogue(ctx, eqn, i, plan)
        e1 = f", {epi[0]}, {epi[1]}" if epi else ""
        after = epi[2] if epi else []
        if pair is None:
            ctx.emit(f"_mm({a}, {b}, {name}, _nt{e1})")
        else:
            nxt, p2, j = pair
            ctx.globals["_mm2"] = cpu_gemm.matmul2
            ctx.emit(f"{p2['name']} = np.empty({p2['mshape']}, {p2['dt']})")
            epi2 = _epilogue(ctx, nxt, j, p2, at=i)
            if epi2:
                e1 = (e1 or ", None, ()") + f", {epi2[0]}, {epi2[1]}"
            ctx.emit(f"_mm2({a}, {b}, {name}, {p2['a']}, {p2['b']}, {p2['name']}, _nt{e1})")
            post = post + p2["post"]
            after = after + (epi2[2] if epi2 else [])
            ctx.skip.add(id(nxt))
            ctx.fresh.add(nxt.outputs[0])
            ctx.moved[nxt.outputs[0]] = i
    elif flops >= cpu_gemm.OWN_KERNEL_MIN_FLOPS and not plan["empty"] and cpu_gemm.own_kernels():
        # one thread, on this CPU's kernels (NumPy's are pinned to another core type)
        ctx.globals["_mm"] = cpu_gemm.matmul
        ctx.emit(f"{name} = np.empty({mshape}, {dt})")
        epi = _epilogue(ctx, eqn, i, plan)
        after = epi[2] if epi else []
        ctx.emit(f"_mm({a}, {b}, {name}, 1" + (f", {epi[0]}, {epi[1]})" if epi else ")"))
    else:
        epi = _epilogue(ctx, eqn, i, plan) if not plan["empty"] else None
        if epi is None:
            ctx.emit(f"{name} = np.matmul({a}, {b})")
            after = []
        else:
            ctx.emit(f"{name} = np.empty({mshape}, {dt})")
            ctx.emit(f"np.matmul({a}, {b}, out={name})")
            ctx.emit(f"{epi[0]}.run({epi[1]})")
            after = epi[2]
    for line in post + after:
        ctx.emit(line)
    ctx.fresh.add(eqn.outputs[0])


def emit_reduce_sum(ctx, eqn, i):
    x = eqn.inputs[0]
    if x.aval.dtype.kind != "f" or x.aval.dtype.itemsize < 4:
        return emit_fallback(ctx, eqn, i)
    out = eqn.outputs[0]
    # np.sum's own call (its Python wrapper costs ~1.7 us of the ~2.6 on a 128x10 tensor)
    ctx.emit(f"{ctx.name(out)} = np.add.reduce({ctx.arg(x, True)}, {tuple(eqn.params['axes'])})")
    if out.aval.ndim:
        ctx.fresh.add(out)


def emit_reduce_max(ctx, eqn, i):
    """A softmax starting here becomes one native row kernel; else np.max (the impl);
    reduce_min: np.min."""
    if ctx.native_ok and eqn.primitive is reduce_max_p:
        from fflow.lowering import native_rows  # the C compiler path

        if native_rows.emit_softmax(ctx, eqn, i):
            return
    x, out = eqn.inputs[0], eqn.outputs[0]
    if x.aval.dtype.kind != "f" or x.aval.dtype.itemsize < 4 or not out.aval.ndim:
        return emit_fallback(ctx, eqn, i)
    axes = tuple(eqn.params["axes"])  # np.max's / np.min's own call, without the wrapper
    uf = "maximum" if eqn.primitive is reduce_max_p else "minimum"
    ctx.emit(f"{ctx.name(out)} = np.{uf}.reduce({ctx.arg(x, True)}, {axes})")
    ctx.fresh.add(out)


def emit_broadcast(ctx, eqn, i):
    x = eqn.inputs[0]
    shape = tuple(eqn.params["shape"])
    dims = eqn.params["broadcast_dimensions"]
    expanded = [1] * len(shape)
    for src, d in enumerate(dims):
        expanded[d] = x.aval.shape[src]
    expanded = tuple(expanded)
    if ctx.reshaped.get(x) is not None and ctx.reshaped[x].aval.shape == expanded:
        x = ctx.reshaped[x]  # a reshape's source already has the expanded shape
    base = src = ctx.arg(x, True)
    const = ctx.const_values.get(x) if type(x) is Var else None
    if expanded != x.aval.shape:
        if const is not None and x not in ctx.splat:  # a constant's view, made once
            src = ctx.const(const.reshape(expanded), "c")
        else:
            src = f"{src}.reshape({expanded})"
    out = eqn.outputs[0]
    ctx.emit(f"{ctx.name(out)} = np.broadcast_to({src}, {shape})")
    ctx.pure.append(out)
    # a ufunc call may read the source instead, broadcasting it itself (ctx.ew_args);
    # then nothing reads the view and its line (~2 us) goes. Leading unit axes are
    # NumPy broadcasting's own: the unreshaped source serves
    if type(x) is Var and x in ctx.splat:
        ctx.implicit[out] = (ctx.splat[x], ())
    elif expanded[len(expanded) - x.aval.ndim :] == x.aval.shape:
        ctx.implicit[out] = (base, x.aval.shape)
    else:
        ctx.implicit[out] = (src, expanded)


def emit_identity(ctx, eqn, i):
    """stop_gradient: its impl returns the input itself; so does the generated code."""
    ctx.emit(f"{ctx.name(eqn.outputs[0])} = {ctx.arg(eqn.inputs[0], True)}")
    ctx.pure.append(eqn.outputs[0])


def emit_reshape(ctx, eqn, i):
    new = tuple(eqn.params["new_sizes"])
    x, out = eqn.inputs[0], eqn.outputs[0]
    if type(x) is Var and x in ctx.reshaped and _only_views_read(ctx, x):
        # a reshape of a reshape is one reshape of the first source (C-order reshapes
        # compose: the same elements); only when nothing else reads the middle one, so a
        # non-contiguous source is not copied twice
        x = ctx.reshaped[x]
    same = type(x) is Var and tuple(x.aval.shape) == new
    ctx.emit(f"{ctx.name(out)} = {ctx.arg(x, True)}" + ("" if same else f".reshape({new})"))
    ctx.pure.append(out)
    if type(x) is Var:
        ctx.reshaped[out] = x


def emit_transpose(ctx, eqn, i):
    perm = tuple(eqn.params["permutation"])
    ctx.emit(f"{ctx.name(eqn.outputs[0])} = np.transpose({ctx.arg(eqn.inputs[0], True)}, {perm})")
    ctx.pure.append(eqn.outputs[0])


_SCATTERS = (scatter_p, scatter_add_p, scatter_mul_p, scatter_min_p, scatter_max_p)
# each scatter's in-place form: its combining ufunc, declared on the primitive
_SCATTER_INTO = {p: functools.partial(scatter_into, p.scatter_ufunc) for p in _SCATTERS}


def _dus_into(out, update, *starts):
    starts = [int(min(max(int(s), 0), d - n)) for d, n, s in zip(out.shape, update.shape, starts)]
    out[tuple(slice(s, s + n) for s, n in zip(starts, update.shape))] = update
    return out


def emit_update(ctx, eqn, i):
    """scatter*/dynamic_update_slice/scatter_add_along_axis: in place when the operand's
    buffer is free."""
    operand = eqn.inputs[0]
    out = eqn.outputs[0]
    target = ctx.inplace_target(i, out, [operand])
    if target is None:
        emit_fallback(ctx, eqn, i)
        ctx.fresh.add(out)
        return
    name, cond = target
    rest = ", ".join(ctx.arg(v, True) for v in eqn.inputs[1:])
    if eqn.primitive is dynamic_update_slice_p:
        fn = ctx.const(_dus_into, "dus_into")
        inplace = f"{fn}({name}, {rest})"
    elif eqn.primitive is scatter_add_along_axis_p:
        fn = ctx.const(add_along_axis_into, "add_along_axis_into")
        inplace = f"{fn}({name}, {rest}, {eqn.params['axis']})"
    else:
        fn = ctx.const(_SCATTER_INTO[eqn.primitive], "scatter_into")
        inplace = f"{fn}({name}, {rest}, {tuple(eqn.params['axes'])})"
    if cond is None:
        ctx.emit(f"{ctx.name(out)} = {inplace}")
    else:
        args = ", ".join(ctx.arg(v, as_array=True) for v in eqn.inputs)
        copy = _params_call(ctx, eqn, "impl").format(args)
        ctx.emit(f"{ctx.name(out)} = {inplace} if {cond} else {copy}")
    ctx.fresh.add(out)


# -- control flow: Python loops around compiled bodies ---------------------------------


def _tuple_target(names):
    return ", ".join(names) + ("," if len(names) == 1 else "")


def emit_cond(ctx, eqn, i):
    branches = eqn.params["branches"]
    kernels = ctx.const(tuple(ctx.body_kernel(b) for b in branches), "branches")
    idx, *ops = eqn.inputs
    args = ", ".join(ctx.arg(v, True) for v in ops)
    outs = [ctx.name(v) for v in eqn.outputs]
    pick = f"min(max(int({ctx.arg(idx, True)}), 0), {len(branches) - 1})"
    call = f"{kernels}[{pick}]({args})"
    ctx.emit(f"{_tuple_target(outs)} = {call}" if outs else call)


def emit_while(ctx, eqn, i):
    p = eqn.params
    cond_k = ctx.const(ctx.body_kernel(p["cond_jaxpr"]), "cond")
    body_k = ctx.const(ctx.body_kernel(p["body_jaxpr"]), "body")
    args = [ctx.arg(v, True) for v in eqn.inputs]
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    cconsts, bconsts, carry = args[:nc], args[nc : nc + nb], args[nc + nb :]
    outs = [ctx.name(v) for v in eqn.outputs]
    ctx.emit(f"{_tuple_target(outs)} = {_tuple_target(carry)}")
    c_args = ", ".join(cconsts + outs)
    b_args = ", ".join(bconsts + outs)
    ctx.emit(f"while {cond_k}({c_args})[0]:")
    ctx.emit(f"{_tuple_target(outs)} = {body_k}({b_args})", 2)


def emit_scan(ctx, eqn, i):
    p = eqn.params
    body = p["jaxpr"]
    nconst, ncarry, length = p["num_consts"], p["num_carry"], p["length"]
    body_k = ctx.const(ctx.body_kernel(body), "scan_body")
    args = [ctx.arg(v, True) for v in eqn.inputs]
    consts, carry, xs = args[:nconst], args[nconst : nconst + ncarry], args[nconst + ncarry :]
    outs = [ctx.name(v) for v in eqn.outputs]
    c_out, y_out = outs[:ncarry], outs[ncarry:]
    for name, aval in zip(y_out, body.out_avals[ncarry:]):
        dt = ctx.const(aval.dtype, "dt")
        ctx.emit(f"{name} = np.empty({(length,) + tuple(aval.shape)}, {dt})")
    if c_out:
        ctx.emit(f"{_tuple_target(c_out)} = {_tuple_target(carry)}")
    order = f"range({length} - 1, -1, -1)" if p.get("reverse") else f"range({length})"
    ctx.emit(f"for _i in {order}:")
    call_args = ", ".join(consts + c_out + [f"{x}[_i]" for x in xs])
    ys = [f"_y{k}" for k in range(len(y_out))]
    ctx.emit(f"{_tuple_target(c_out + ys)} = {body_k}({call_args})", 2)
    for name, y in zip(y_out, ys):
        ctx.emit(f"{name}[_i] = {y}", 2)
    for v in eqn.outputs[ncarry:]:
        ctx.fresh.add(v)


def emit_call(ctx, eqn, i):
    """custom_jvp_call / custom_vjp_call / checkpoint: run the nested program compiled."""
    program = eqn.params.get("program")
    if program is None:
        return emit_fallback(ctx, eqn, i)
    kernel = ctx.const(ctx.body_kernel(program), "call")
    args = ", ".join(ctx.arg(v, True) for v in eqn.inputs)
    outs = [ctx.name(v) for v in eqn.outputs]
    call = f"{kernel}({args})"
    ctx.emit(f"{_tuple_target(outs)} = {call}" if outs else call)


def emit_attention(ctx, eqn, i):
    """dot_product_attention / attention_bwd: batched GEMMs on the pool (cpu_attention)."""
    fn = cpu_attention.forward if eqn.primitive is attention_p else None
    fn = fn or cpu_attention.backward
    kernel = ctx.const(fn, "attn")
    p = ctx.const(dict(eqn.params), "p")
    args = ", ".join(ctx.arg(v, as_array=True) for v in eqn.inputs)
    threads.blas()  # one-thread BLAS from here on, as for dot_general
    ctx.gemm_pool = True  # its products take the step's thread count
    ctx.emit(
        f"{_tuple_target([ctx.name(v) for v in eqn.outputs])} = {kernel}({args}, nt=_nt, **{p})"
    )


ROWS = {
    attention_p: emit_attention,
    attention_bwd_p: emit_attention,
    cond_p: emit_cond,
    while_p: emit_while,
    scan_p: emit_scan,
    dot_general_p: emit_dot,
    reduce_sum_p: emit_reduce_sum,
    reduce_max_p: emit_reduce_max,
    reduce_min_p: emit_reduce_max,
    broadcast_in_dim_p: emit_broadcast,
    reshape_p: emit_reshape,
    stop_gradient_p: emit_identity,
    transpose_p: emit_transpose,
    dynamic_update_slice_p: emit_update,
    scatter_add_along_axis_p: emit_update,
    **{p: emit_update for p in _SCATTERS},
}


def row_of(prim):
    """The row rendering `prim` (keyed by the Primitive), or None: an elementwise op or
    the fallback. Call primitives (trait "call": custom_jvp_call, custom_vjp_call,
    checkpoint, defined above the lowering in transforms/) run their program compiled."""
    row = ROWS.get(prim)
    if row is None and "call" in prim.traits:
        return emit_call
    return row
