"""`checkpoint` (alias `remat`): rematerialisation under reverse mode.

`checkpoint[program]` is a primitive whose equation carries the traced function.
Its JVP is one `checkpoint` equation over the JVP program; under linearize its
partial-evaluation rule computes the primal outputs now and stages the tangent
part as a `checkpoint` equation whose residuals are only its inputs (plus what a
`policy` allows to be saved), so the backward pass (`autodiff.backward_pass`
evaluates non-linear equations forward) recomputes the intermediates. The
transpose rule does that recomputation as one `checkpoint` equation, so a
compiler does not merge it with the forward pass.
"""

import functools

from fflow.primitives.dot import dot_general_p
from fflow.transforms import autodiff as ad
from fflow.transforms import vmap as vm
from fflow.transforms.custom import (
    _batched_program_call,
    _flat_outputs,
    _is_eager,
    _name,
    _run_on_root,
    trace_closed,
)
from fflow.transforms.shard_rules import CALL_REPLICATED, def_broadcast_only
from fflow.transforms.staging import StagingTracer, eval_program, partial_eval_rules

from fflow.api_util import Store, as_value
from fflow.core import Literal, Primitive, Program, Var, aval_of_value, set_current_trace
from fflow.tree_util import tree_flatten, tree_unflatten

checkpoint_p = Primitive("checkpoint", multiple_results=True)
checkpoint_p.traits.add("call")  # runs its `program` param, as custom_jvp_call (custom.py)
def_broadcast_only(checkpoint_p, CALL_REPLICATED)


@checkpoint_p.def_impl
def _checkpoint_impl(*args, program, prevent_cse, policy):
    return _run_on_root(program, None, args)


@checkpoint_p.def_abstract_eval
def _checkpoint_abstract_eval(*avals, program, prevent_cse, policy):
    return program.out_avals


def _checkpoint_jvp(primals, tangents, *, program, prevent_cse, policy):
    nonzero = [type(t) is not ad.Zero for t in tangents]
    n = len(primals)
    in_avals = list(program.in_avals) + [
        ad.tangent_aval(a) for a, nz in zip(program.in_avals, nonzero) if nz
    ]

    def jvp_fun(*args):
        it = iter(args[n:])
        ts = [
            next(it) if nz else ad.Zero(ad.tangent_aval(a))
            for a, nz in zip(program.in_avals, nonzero)
        ]
        outs, t_outs = ad.jvp_flat(lambda *xs: eval_program(program, [], xs), list(args[:n]), ts)
        return list(outs) + [ad.instantiate(t) for t in t_outs]

    jvp_program, consts = trace_closed(jvp_fun, in_avals)
    outs = checkpoint_p.bind(
        *consts,
        *primals,
        *[t for t in tangents if type(t) is not ad.Zero],
        program=jvp_program,
        prevent_cse=prevent_cse,
        policy=policy,
    )
    k = len(program.outvars)
    return outs[:k], outs[k:]


ad.jvp_rules[checkpoint_p] = _checkpoint_jvp


def _is_var(v):
    return type(v) is not Literal


def _needed_eqns(eqns, outvars, available):
    """The equations needed for `outvars` when the vars in `available` are given."""
    needed = {v for v in outvars if _is_var(v) and v not in available}
    keep = []
    for eqn in reversed(eqns):
        if any(o in needed for o in eqn.outputs):
            keep.append(eqn)
            needed.update(v for v in eqn.inputs if _is_var(v) and v not in available)
    keep.reverse()
    return keep


def _saveable(policy, eqn):
    if policy is None:
        return False
    return bool(policy(eqn.primitive, *[v.aval for v in eqn.inputs], **eqn.params))


def _unknown_outputs(program, unknown_in):
    """Which outputs of `program` depend on the inputs flagged in `unknown_in`."""
    unknown = {v for v, u in zip(program.invars, unknown_in) if u}
    for eqn in program.eqns:
        flags = [_is_var(v) and v in unknown for v in eqn.inputs]
        if not any(flags):
            continue
        if eqn.primitive is checkpoint_p:
            outs = _unknown_outputs(eqn.params["program"], flags)
            unknown.update(o for o, u in zip(eqn.outputs, outs) if u)
        else:
            unknown.update(eqn.outputs)
    return [_is_var(v) and v in unknown for v in program.outvars]


def _split_mixed(eqns, unknown):
    """(all, known): `eqns` with each nested checkpoint that has known and unknown inputs
    split in its known half and the rest, and the equations of known values only.
    `unknown` (a set of vars) is updated with every unknown output."""
    known_eqns, all_eqns = [], []
    for eqn in eqns:
        if not any(_is_var(v) and v in unknown for v in eqn.inputs):
            known_eqns.append(eqn)
            all_eqns.append(eqn)
            continue
        known_part = _known_part(eqn, unknown)  # a nested checkpoint: its primal half
        if known_part is None:
            unknown.update(eqn.outputs)
            all_eqns.append(eqn)
        else:
            known_eqns.append(known_part)
            done = set(known_part.outputs)
            rest = eqn.replace(outputs=[Var(o.aval) if o in done else o for o in eqn.outputs])
            all_eqns.extend([known_part, rest])
            unknown.update(o for o in eqn.outputs if o not in done)
    return all_eqns, known_eqns


def _known_eqns(program, unknown_in):
    """The equations of `program` that compute what depends on known inputs only
    (nested checkpoints with unknown inputs reduced to their known halves)."""
    unknown = {v for v, u in zip(program.invars, unknown_in) if u}
    out = []
    for eqn in program.eqns:
        if not any(_is_var(v) and v in unknown for v in eqn.inputs):
            out.append(eqn)
            continue
        part = _known_part(eqn, unknown)
        if part is not None:
            out.append(part)
        unknown.update(o for o in eqn.outputs if part is None or o not in part.outputs)
    return out


def _known_part(eqn, unknown):
    """For a nested checkpoint with some unknown inputs: an equation computing its outputs
    that depend on known inputs only (its primal half), or None."""
    if eqn.primitive is not checkpoint_p:
        return None
    sub = eqn.params["program"]
    flags = [_is_var(v) and v in unknown for v in eqn.inputs]
    out_unknown = _unknown_outputs(sub, flags)
    if all(out_unknown):
        return None
    keep = [i for i, u in enumerate(out_unknown) if not u]
    outvars = [sub.outvars[i] for i in keep]
    eqns = _needed_eqns(_known_eqns(sub, flags), outvars, set())
    used = {v for e in eqns for v in e.inputs} | set(outvars)
    ins = [i for i, (v, u) in enumerate(zip(sub.invars, flags)) if v in used and not u]
    pruned = Program([sub.invars[i] for i in ins], [], eqns, outvars, [])
    return eqn.replace(
        inputs=[eqn.inputs[i] for i in ins],
        params=dict(eqn.params, program=pruned),
        outputs=[eqn.outputs[i] for i in keep],
    )


def _checkpoint_partial_eval(trace, args, params):
    """Known outputs now; the unknown ones staged as a `checkpoint` of the inputs."""
    program, policy = params["program"], params["policy"]
    is_unknown = [isinstance(a, StagingTracer) and a._trace is trace for a in args]
    unknown = {v for v, u in zip(program.invars, is_unknown) if u}
    all_eqns, known_eqns = _split_mixed(program.eqns, unknown)
    out_unknown = [_is_var(v) and v in unknown for v in program.outvars]
    unknown_outvars = [v for v, u in zip(program.outvars, out_unknown) if u]
    invars = set(program.invars)
    # residuals a policy allows to save: outputs of saveable known equations that the
    # unknown part needs; the rest of the known part is recomputed from them and the inputs
    saved = []
    if policy is not None:
        known_ids = {id(e) for e in known_eqns}
        for eqn in _needed_eqns(all_eqns, unknown_outvars, invars):
            if id(eqn) in known_ids and _saveable(policy, eqn):
                saved.extend(eqn.outputs)
        staged_eqns = _needed_eqns(all_eqns, unknown_outvars, invars | set(saved))
        read = {v for e in staged_eqns for v in e.inputs} | set(unknown_outvars)
        saved = [v for v in saved if v in read]
    known_outvars = [v for v, u in zip(program.outvars, out_unknown) if not u]
    known_invars = {v for v, u in zip(program.invars, is_unknown) if not u}
    env = {v: a for v, a, u in zip(program.invars, args, is_unknown) if not u}
    with set_current_trace(trace.parent):
        for eqn in _needed_eqns(known_eqns, known_outvars + saved, known_invars):
            invals = [v.value if not _is_var(v) else env[v] for v in eqn.inputs]
            outs = eqn.primitive.bind(*invals, **eqn.params)
            env.update(zip(eqn.outputs, outs if eqn.primitive.multiple_results else [outs]))
    staged_program = Program(
        list(program.invars) + saved,
        [],
        _needed_eqns(all_eqns, unknown_outvars, invars | set(saved)),
        unknown_outvars,
        [],
    )
    staged_outs = trace.stage(
        checkpoint_p,
        list(args) + [env[v] for v in saved],
        dict(params, program=staged_program),
        out_avals=[v.aval for v in unknown_outvars],
    )
    staged_it = iter(staged_outs)
    result = []
    for v, u in zip(program.outvars, out_unknown):
        if u:
            result.append(next(staged_it))
        else:
            result.append(v.value if not _is_var(v) else env[v])
    return result


partial_eval_rules[checkpoint_p] = _checkpoint_partial_eval


def _checkpoint_transpose(cts, *args, program, prevent_cse, policy):
    linear = [ad.is_undefined(a) for a in args]
    known_vars = [v for v, lin in zip(program.invars, linear) if not lin]
    known_vals = [a for a, lin in zip(args, linear) if not lin]
    # a nested checkpoint with linear and known inputs: its primal half runs forward
    eqns, _ = _split_mixed(program.eqns, {v for v, lin in zip(program.invars, linear) if lin})
    program = Program(program.invars, [], eqns, program.outvars, [])
    if prevent_cse:
        eqns, known_vars, known_vals = _recompute_first(program, linear, known_vars, known_vals)
    # backward_pass evaluates any remaining non-linear equation forward (recomputation)
    lin_program = Program(
        [v for v, lin in zip(program.invars, linear) if lin],
        known_vars,
        eqns,
        program.outvars,
        known_vals,
    )
    cts_in = ad.backward_pass(lin_program, list(cts))
    it = iter(cts_in)
    return [next(it) if lin else None for lin in linear]


def _recompute_first(program, linear, known_vars, known_vals):
    """Recompute the residuals of the linear equations as one `checkpoint` equation,
    so that a compiler cannot merge the recomputation with the forward pass."""
    linear_vars = {v for v, lin in zip(program.invars, linear) if lin}
    nonlinear, linear_eqns = [], []
    for eqn in program.eqns:
        if any(_is_var(v) and v in linear_vars for v in eqn.inputs):
            linear_vars.update(eqn.outputs)
            linear_eqns.append(eqn)
        else:
            nonlinear.append(eqn)
    computed = {o for e in nonlinear for o in e.outputs}
    residuals = list(
        dict.fromkeys(v for e in linear_eqns for v in e.inputs if _is_var(v) and v in computed)
    )
    if not residuals:
        return linear_eqns, known_vars, known_vals
    recompute = Program(
        known_vars, [], _needed_eqns(nonlinear, residuals, set(known_vars)), residuals, []
    )
    values = checkpoint_p.bind(*known_vals, program=recompute, prevent_cse=True, policy=None)
    return linear_eqns, known_vars + residuals, known_vals + list(values)


ad.transpose_rules[checkpoint_p] = _checkpoint_transpose


def checkpoint(fun=None, *, prevent_cse=True, policy=None, static_argnums=()):
    """Rematerialise `fun` under reverse mode: save only its inputs, recompute the rest.

    Args:
        fun: the function to checkpoint.
        prevent_cse: keep the recomputation a separate equation so compilers do not
            merge it with the forward pass.
        policy: optional `policy(prim, *avals, **params) -> bool` naming equations whose
            outputs may be saved instead of recomputed (see `checkpoint_policies`).
        static_argnums: arguments that are Python values (they may steer control flow).

    Example:
        >>> import fflow, fflow.numpy as jnp
        >>> f = fflow.checkpoint(lambda x: jnp.sin(jnp.sin(x)))
        >>> round(float(fflow.grad(f)(0.5)), 4)
        0.7786
    """
    if fun is None:
        return functools.partial(
            checkpoint, prevent_cse=prevent_cse, policy=policy, static_argnums=static_argnums
        )
    static = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)

    @functools.wraps(fun)
    def remat_fun(*args, **kwargs):
        if _is_eager():
            return fun(*args, **kwargs)
        n = len(args)
        nums = {i % n for i in static if -n <= i < n}
        dyn = [a for i, a in enumerate(args) if i not in nums]
        leaves, in_tree = tree_flatten((tuple(dyn), kwargs))
        leaves = [as_value(x) for x in leaves]
        out_store = Store()

        def flat(*xs):
            d, kw = tree_unflatten(in_tree, xs)
            it = iter(d)
            full = [args[i] if i in nums else next(it) for i in range(n)]
            return _flat_outputs(fun(*full, **kw), out_store, f"checkpoint {_name(fun)}")

        program, consts = trace_closed(flat, [aval_of_value(x) for x in leaves])
        outs = checkpoint_p.bind(
            *consts, *leaves, program=program, prevent_cse=prevent_cse, policy=policy
        )
        return tree_unflatten(out_store.value, outs)

    return remat_fun


remat = checkpoint


def _checkpoint_batch(vals, dims, *, program, prevent_cse, policy):
    return _batched_program_call(
        checkpoint_p,
        vals,
        dims,
        dict(program=program, prevent_cse=prevent_cse, policy=policy),
    )


vm.batch_rules[checkpoint_p] = _checkpoint_batch


class checkpoint_policies:
    """Policies for `checkpoint(policy=...)`: which equations' outputs to save."""

    @staticmethod
    def everything_saveable(prim, *avals, **params):
        return True

    @staticmethod
    def nothing_saveable(prim, *avals, **params):
        return False

    @staticmethod
    def dots_saveable(prim, *avals, **params):
        return prim is dot_general_p

    checkpoint_dots = dots_saveable

    @staticmethod
    def dots_with_no_batch_dims_saveable(prim, *avals, **params):
        if prim is not dot_general_p:
            return False
        (_, _), (lb, _) = params["dimension_numbers"]
        return not lb


__all__ = ["checkpoint", "remat", "checkpoint_policies", "checkpoint_p"]
