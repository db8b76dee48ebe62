"""Batching rules for the primitives of transforms/custom.py (custom_jvp_call,
custom_vjp_call, custom_lin, checkpoint).

Loaded by `vmap.get_batch_rule` the first time one of them is batched (custom.py
loads lazily, so importing it from vmap.py at import time is avoided). The user's
rules are kept: the batched equation carries vmapped versions of them, so
`grad(vmap(f))` still uses a custom JVP/VJP.
"""

from fflow.transforms import custom, remat
from fflow.transforms import vmap as vm

from fflow import lax_ops as lax


def _front(vals, dims):
    return [vm.moveaxis(v, d, 0) if d is not vm.not_mapped else v for v, d in zip(vals, dims)]


def _axes(dims):
    return [0 if d is not vm.not_mapped else None for d in dims]


def _batched_program_call(prim, vals, dims, params):
    """Fallback: batch the nested program and drop nothing else."""
    size = vm.batch_size(vals, dims)
    program = params["program"]
    in_b = [d is not vm.not_mapped for d in dims]
    new, out_b = vm.batch_program(program, size, in_b, False)
    outs = prim.bind(*_front(vals, dims), **dict(params, program=new))
    return outs, [0 if b else None for b in out_b]


def _batched_program(program, size, dims):
    """`program` (or None) batched along the mapped `dims`, with every output batched."""
    if program is None:
        return None
    return vm.batch_program(program, size, [d is not vm.not_mapped for d in dims], True)[0]


def _custom_jvp_call_batch(vals, dims, *, fun, jvp, program, num_consts, num_nondiff):
    size = vm.batch_size(vals, dims)
    if any(d is not vm.not_mapped for d in dims[:num_consts]):
        # closed-over batched values: the user's rule cannot see them; batch the primal
        # program alone (its derivative is then the program's own)
        return _batched_program_call(
            custom.custom_jvp_call_p,
            vals,
            dims,
            dict(fun=fun, jvp=jvp, program=program, num_consts=num_consts, num_nondiff=num_nondiff),
        )
    k = num_consts + num_nondiff
    nd_axes, p_axes = _axes(dims[num_consts:k]), _axes(dims[k:])

    def fun_b(*flat):
        return vm.vmap(lambda *a: fun(*a), in_axes=tuple(nd_axes + p_axes), axis_size=size)(*flat)

    def jvp_b(nondiff, primals, tangents):
        f = vm.vmap(
            lambda nd, p, t: jvp(list(nd), list(p), list(t)),
            in_axes=(nd_axes, p_axes, p_axes),
            axis_size=size,
        )
        outs, t_outs = f(list(nondiff), list(primals), list(tangents))
        return list(outs), list(t_outs)

    fun_b.__name__ = getattr(fun, "__name__", "fun")
    jvp_b.__name__ = getattr(jvp, "__name__", "jvp")
    new_program = _batched_program(program, size, dims)
    outs = custom.custom_jvp_call_p.bind(
        *_front(vals, dims),
        fun=fun_b,
        jvp=jvp_b,
        program=new_program,
        num_consts=num_consts,
        num_nondiff=num_nondiff,
    )
    return outs, [0] * len(outs)


def _sum_unbatched(cts, axes):
    # cotangents of inputs that were not batched: the batch contributes a sum
    return [c if ax == 0 else lax.reduce_sum(c, (0,)) for c, ax in zip(cts, axes)]


def _custom_vjp_call_batch(vals, dims, *, fun, fwd, bwd, program, num_consts, num_nondiff):
    size = vm.batch_size(vals, dims)
    params = dict(
        fun=fun, fwd=fwd, bwd=bwd, program=program, num_consts=num_consts, num_nondiff=num_nondiff
    )
    if any(d is not vm.not_mapped for d in dims[:num_consts]):
        return _batched_program_call(custom.custom_vjp_call_p, vals, dims, params)
    k = num_consts + num_nondiff
    nd_axes, p_axes = _axes(dims[num_consts:k]), _axes(dims[k:])

    def fun_b(*flat):
        return vm.vmap(lambda *a: fun(*a), in_axes=tuple(nd_axes + p_axes), axis_size=size)(*flat)

    def fwd_b(nondiff, primals):
        f = vm.vmap(
            lambda nd, p: tuple(fwd(list(nd), list(p))),
            in_axes=(nd_axes, p_axes),
            axis_size=size,
        )
        outs, res = f(list(nondiff), list(primals))
        return list(outs), list(res)

    def bwd_b(nondiff, res, cts):
        f = vm.vmap(
            lambda nd, r, c: list(bwd(list(nd), list(r), list(c))),
            in_axes=(nd_axes, 0, 0),
            axis_size=size,
        )
        return _sum_unbatched(f(list(nondiff), list(res), list(cts)), p_axes)

    for new, old in ((fun_b, fun), (fwd_b, fwd), (bwd_b, bwd)):
        new.__name__ = getattr(old, "__name__", "fn")
    new_program = _batched_program(program, size, dims)
    outs = custom.custom_vjp_call_p.bind(
        *_front(vals, dims),
        **dict(params, fun=fun_b, fwd=fwd_b, bwd=bwd_b, program=new_program),
    )
    return outs, [0] * len(outs)


def _custom_lin_batch(vals, dims, *, bwd, num_nondiff, num_res, out_avals):
    size = vm.batch_size(vals, dims)
    nd_axes = _axes(dims[:num_nondiff])
    # residuals and tangents all get the batch dim first; batched nondiff args too
    vals = [
        vm.bdim_to_front(v, d, size) if i >= num_nondiff or d is not vm.not_mapped else v
        for i, (v, d) in enumerate(zip(vals, dims))
    ]

    def bwd_b(nondiff, res, cts):
        f = vm.vmap(
            lambda nd, r, c: list(bwd(list(nd), list(r), list(c))),
            in_axes=(nd_axes, 0, 0),
            axis_size=size,
        )
        return f(list(nondiff), list(res), list(cts))

    bwd_b.__name__ = getattr(bwd, "__name__", "bwd")
    new_avals = tuple(a.update(shape=(size,) + a.shape) for a in out_avals)
    outs = custom.custom_lin_p.bind(
        *vals, bwd=bwd_b, num_nondiff=num_nondiff, num_res=num_res, out_avals=new_avals
    )
    return outs, [0] * len(outs)


def _checkpoint_batch(vals, dims, *, program, prevent_cse, policy):
    return _batched_program_call(
        remat.checkpoint_p,
        vals,
        dims,
        dict(program=program, prevent_cse=prevent_cse, policy=policy),
    )


vm.batch_rules[custom.custom_jvp_call_p] = _custom_jvp_call_batch
vm.batch_rules[custom.custom_vjp_call_p] = _custom_vjp_call_batch
vm.batch_rules[custom.custom_lin_p] = _custom_lin_batch
vm.batch_rules[remat.checkpoint_p] = _checkpoint_batch
