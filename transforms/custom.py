"""User-defined derivatives and rematerialisation: `custom_jvp`, `custom_vjp`,
`checkpoint` (alias `remat`).

Each is a primitive whose equation carries the traced function as a nested
program (so `jit` stages it, the printer shows it and every backend can run it
through the primitive's implementation):

- `custom_jvp_call[program, jvp]`: its JVP rule calls the user's rule.
- `custom_vjp_call[program, fwd, bwd]`: its JVP rule runs `fwd` and emits a
  `custom_lin` equation, linear in the tangents, whose transpose calls `bwd`. So
  `vjp`/`grad` (linearize + transpose) use the user's rules, and forward mode
  reports that it is not defined (as in JAX).
- `checkpoint[program]`: its JVP is one `checkpoint` equation over the JVP program;
  under linearize its partial-evaluation rule computes the primal outputs now and
  stages the tangent part as a `checkpoint` equation whose residuals are only its
  inputs (and what `policy` allows to be saved), so the backward pass recomputes
  the intermediates.

Closed-over arrays and tracers become leading inputs of these equations
(closure conversion), so outer transformations see them.
"""

import functools
import inspect

import numpy as np
from fflow.transforms import autodiff as ad
from fflow.transforms.staging import (
    StagingTrace,
    StagingTracer,
    eval_program,
    partial_eval_rules,
    trace_to_program,
)

from fflow import core
from fflow.api_util import Store, as_value
from fflow.core import Literal, Primitive, Program, aval_of_value, set_current_trace
from fflow.errors import user_error
from fflow.tree_util import (
    prefix_broadcast,
    tree_flatten,
    tree_map,
    tree_structure,
    tree_unflatten,
)

# ----------------------------------------------------------------------------
# Shared helpers


def _is_eager():
    from fflow.array import root_trace

    return core.current_trace() is root_trace


def _needs_program():
    """Whether some enclosing transform needs the function as a program.

    Eager evaluation, forward mode and linearize only call the Python functions, so
    under them a custom function may use Python control flow on concrete values.
    """
    from fflow.array import EvalTrace

    t = core.current_trace()
    while t is not None:
        if isinstance(t, StagingTrace):
            if not t.partial_eval:
                return True
        elif not isinstance(t, (ad.JVPTrace, EvalTrace)):
            return True
        t = t.parent
    return False


def trace_closed(flat_fun, in_avals):
    """Trace `flat_fun`; closed-over values become leading invars: (program, consts)."""
    program = trace_to_program(flat_fun, in_avals)
    closed = Program(
        list(program.constvars) + list(program.invars), [], program.eqns, program.outvars, []
    )
    return closed, list(program.consts)


def _run_on_root(program, fun, args):
    """Evaluate `program` (or call `fun`) eagerly on NumPy arrays; NumPy results."""
    from fflow.array import Array, root_trace

    vals = [Array(a) if type(a) is np.ndarray else a for a in args]
    with set_current_trace(root_trace):
        if program is not None:
            outs = eval_program(program, [], vals)
        else:
            outs = fun(*vals)
    result = []
    for i, o in enumerate(outs):
        value = np.asarray(o)
        if program is not None:
            aval = program.outvars[i].aval
            if value.dtype != aval.dtype:
                value = value.astype(aval.dtype)
        result.append(value)
    return result


def _resolve_args(fun, args, kwargs):
    """Arguments bound to positions with defaults filled in (as JAX's resolve_kwargs)."""
    sig = _signature(fun)
    if sig is None:
        if kwargs:
            raise TypeError(f"{_name(fun)}: pass arguments positionally")
        return tuple(args)
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    if bound.kwargs:
        raise user_error(
            TypeError,
            f"{_name(fun)}: keyword-only arguments {sorted(bound.kwargs)} are not supported by "
            "custom_jvp/custom_vjp. Fix: make them positional.",
        )
    return tuple(bound.args)


@functools.lru_cache(maxsize=256)
def _signature_cached(fun):
    try:
        return inspect.signature(fun)
    except (TypeError, ValueError):
        return None


def _signature(fun):
    try:
        return _signature_cached(fun)
    except TypeError:  # an unhashable callable
        try:
            return inspect.signature(fun)
        except (TypeError, ValueError):
            return None


def _name(fun):
    return getattr(fun, "__name__", type(fun).__name__)


def _is_array_like(x):
    from fflow.array import Array

    return isinstance(x, (Array, core.Tracer, np.ndarray))


class _Args:
    """A call's arguments split into static nondiff args, dynamic (array) nondiff
    args and differentiable args (flattened)."""

    def __init__(self, args, nondiff_argnums, what):
        n = len(args)
        nums = sorted({i % n for i in nondiff_argnums if -n <= i < n}) if n else []
        self.n = n
        self.nondiff_nums = nums
        self.static = {}
        self.dyn_nondiff_nums = []
        dyn_nondiff = []
        for i in nums:
            if _is_array_like(args[i]):
                self.dyn_nondiff_nums.append(i)
                dyn_nondiff.append(as_value(args[i]))
            else:
                self.static[i] = args[i]
        self.dyn_nondiff = dyn_nondiff
        self.diff_nums = [i for i in range(n) if i not in nums]
        diff = [args[i] for i in self.diff_nums]
        leaves, self.in_tree = tree_flatten(tuple(diff))
        try:
            self.leaves = [as_value(x) for x in leaves]
        except TypeError as e:
            raise user_error(
                TypeError,
                f"{what}: {e} Fix: list non-array arguments in nondiff_argnums.",
            ) from None

    def diff_args(self, leaves):
        return list(tree_unflatten(self.in_tree, leaves))

    def nondiff_args(self, dyn_nondiff):
        """The nondiff arguments in order (for the user's rules)."""
        dyn = dict(zip(self.dyn_nondiff_nums, dyn_nondiff))
        return [dyn[i] if i in dyn else self.static[i] for i in self.nondiff_nums]

    def full_args(self, dyn_nondiff, leaves):
        out = [None] * self.n
        for i, v in zip(self.diff_nums, self.diff_args(leaves)):
            out[i] = v
        dyn = dict(zip(self.dyn_nondiff_nums, dyn_nondiff))
        for i in self.nondiff_nums:
            out[i] = dyn[i] if i in dyn else self.static[i]
        return out


def _flat_outputs(out, store, what):
    leaves, tree = tree_flatten(out)
    if store.filled and store.value != tree:
        raise user_error(
            TypeError,
            f"{what}: output structures differ between the function ({store.value}) and "
            f"its rule ({tree})",
        )
    store.set(tree)
    return [as_value(x) for x in leaves]


def _check_no_closure_tangents(tangents, name, what):
    if any(type(t) is not ad.Zero for t in tangents):
        raise user_error(
            TypeError,
            f"{what} function {name} closes over a value that is being differentiated; its "
            f"rule cannot see that dependence. Fix: pass the value as an explicit argument.",
        )


def _abstract_outs(program, fun, in_avals, num_consts):
    if program is None:
        program = trace_to_program(fun, list(in_avals[num_consts:]))
    return program.out_avals


def _match_tangent(t, primal, name):
    """A rule's tangent output as an array of the primal output's shape and dtype."""
    from fflow import lax

    t = as_value(t)
    p_aval = aval_of_value(primal)
    t_aval = aval_of_value(t)
    if t_aval.shape != p_aval.shape:
        raise user_error(
            TypeError,
            f"the custom JVP rule of {name} returned a tangent of shape {t_aval.shape} for a "
            f"primal output of shape {p_aval.shape}; they must match.",
        )
    if t_aval.dtype != p_aval.dtype:
        t = lax.convert_element_type(t, p_aval.dtype)
    return t


# ----------------------------------------------------------------------------
# custom_jvp

custom_jvp_call_p = Primitive("custom_jvp_call", multiple_results=True)


@custom_jvp_call_p.def_impl
def _custom_jvp_call_impl(*args, fun, jvp, program, num_consts, num_nondiff):
    if program is not None:
        return _run_on_root(program, None, args)
    return _run_on_root(None, fun, args[num_consts:])


@custom_jvp_call_p.def_abstract_eval
def _custom_jvp_call_abstract_eval(*avals, fun, jvp, program, num_consts, num_nondiff):
    return _abstract_outs(program, fun, avals, num_consts)


def _custom_jvp_call_jvp(primals, tangents, *, fun, jvp, program, num_consts, num_nondiff):
    _check_no_closure_tangents(tangents[:num_consts], _name(fun), "custom_jvp")
    k = num_consts + num_nondiff
    # nondiff arguments are not differentiated (their tangents are dropped, as in JAX)
    nondiff = list(primals[num_consts:k])
    tangents_in = [ad.instantiate(t) for t in tangents[k:]]
    return jvp(nondiff, list(primals[k:]), tangents_in)


ad.jvp_rules[custom_jvp_call_p] = _custom_jvp_call_jvp


class custom_jvp:
    """A function with a user-defined JVP (forward-mode derivative).

    Reverse mode works too: the JVP rule is linearized and transposed, so it must be
    linear in the tangents. Arguments listed in `nondiff_argnums` are passed to the
    rule first and are not differentiated.

    Example:
        >>> import fflow, fflow.numpy as jnp
        >>> @fflow.custom_jvp
        ... def log1pexp(x):
        ...     return jnp.log(1.0 + jnp.exp(x))
        >>> @log1pexp.defjvp
        ... def log1pexp_jvp(primals, tangents):
        ...     (x,), (t,) = primals, tangents
        ...     return log1pexp(x), t * (1.0 - 1.0 / (1.0 + jnp.exp(x)))
        >>> float(fflow.grad(log1pexp)(100.0))
        1.0
    """

    def __init__(self, fun, nondiff_argnums=()):
        functools.update_wrapper(self, fun)
        self.fun = fun
        self.nondiff_argnums = tuple(nondiff_argnums)
        self.jvp = None

    def defjvp(self, jvp, symbolic_zeros=False):
        """Set the rule `jvp(*nondiff_args, primals, tangents) -> (primal_out, tangent_out)`."""
        self.jvp = jvp
        return jvp

    def defjvps(self, *tangent_fns):
        """One rule per argument: `fn(t_i, primal_out, *primals)`; None means zero."""
        if self.nondiff_argnums:
            raise TypeError("custom_jvp.defjvps cannot be used with nondiff_argnums; use defjvp")

        def jvp(primals, tangents):
            primal_out = self(*primals)
            total = None
            for fn, t in zip(tangent_fns, tangents):
                if fn is None:
                    continue
                part = fn(t, primal_out, *primals)
                total = part if total is None else tree_map(_add, total, part)
            if total is None:
                total = tree_map(lambda p: p * 0, primal_out)
            return primal_out, total

        jvp.__name__ = f"{_name(self.fun)}_jvps"
        self.defjvp(jvp)

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return functools.partial(self, obj)

    def __call__(self, *args, **kwargs):
        name = _name(self.fun)
        if self.jvp is None:
            raise AttributeError(f"No JVP defined for custom_jvp function {name} using defjvp.")
        args = _resolve_args(self.fun, args, kwargs)
        if _is_eager():
            return self.fun(*args)
        a = _Args(args, self.nondiff_argnums, f"custom_jvp function {name}")
        out_store = Store()
        fun, rule = self.fun, self.jvp
        n_nd = len(a.dyn_nondiff)

        def fun_flat(*flat):
            return _flat_outputs(
                fun(*a.full_args(flat[:n_nd], flat[n_nd:])), out_store, f"custom_jvp {name}"
            )

        def jvp_flat(nondiff, primals, tangents):
            res = rule(
                *a.nondiff_args(nondiff), tuple(a.diff_args(primals)), tuple(a.diff_args(tangents))
            )
            if not (isinstance(res, (tuple, list)) and len(res) == 2):
                raise user_error(
                    TypeError,
                    f"the custom JVP rule of {name} must return a pair (primal_out, tangent_out)",
                )
            p_out = _flat_outputs(res[0], out_store, f"custom_jvp {name}")
            t_leaves, t_tree = tree_flatten(res[1])
            if t_tree != out_store.value:
                raise user_error(
                    TypeError,
                    f"the custom JVP rule of {name} returned a tangent of structure {t_tree} "
                    f"for a primal output of structure {out_store.value}",
                )
            return p_out, [_match_tangent(t, p, name) for t, p in zip(t_leaves, p_out)]

        fun_flat.__name__ = name
        jvp_flat.__name__ = _name(rule)
        program, consts = None, []
        if _needs_program():
            in_avals = [aval_of_value(x) for x in a.dyn_nondiff + a.leaves]
            program, consts = trace_closed(fun_flat, in_avals)
        outs = custom_jvp_call_p.bind(
            *consts,
            *a.dyn_nondiff,
            *a.leaves,
            fun=fun_flat,
            jvp=jvp_flat,
            program=program,
            num_consts=len(consts),
            num_nondiff=n_nd,
        )
        return tree_unflatten(out_store.value, outs)


def _add(x, y):
    return x + y


# ----------------------------------------------------------------------------
# custom_vjp

custom_vjp_call_p = Primitive("custom_vjp_call", multiple_results=True)
custom_lin_p = Primitive("custom_lin", multiple_results=True)


@custom_vjp_call_p.def_impl
def _custom_vjp_call_impl(*args, fun, fwd, bwd, program, num_consts, num_nondiff):
    if program is not None:
        return _run_on_root(program, None, args)
    return _run_on_root(None, fun, args[num_consts:])


@custom_vjp_call_p.def_abstract_eval
def _custom_vjp_call_abstract_eval(*avals, fun, fwd, bwd, program, num_consts, num_nondiff):
    return _abstract_outs(program, fun, avals, num_consts)


def _custom_vjp_call_jvp(primals, tangents, *, fun, fwd, bwd, program, num_consts, num_nondiff):
    _check_no_closure_tangents(tangents[:num_consts], _name(fun), "custom_vjp")
    k = num_consts + num_nondiff
    nondiff = list(primals[num_consts:k])
    outs, res = fwd(nondiff, list(primals[k:]))
    t_in = tangents[k:]
    out_avals = tuple(ad.tangent_aval(aval_of_value(o)) for o in outs)
    if all(type(t) is ad.Zero for t in t_in):
        return outs, [ad.Zero(a) for a in out_avals]
    t_outs = custom_lin_p.bind(
        *nondiff,
        *res,
        *[ad.instantiate(t) for t in t_in],
        bwd=bwd,
        num_nondiff=len(nondiff),
        num_res=len(res),
        out_avals=out_avals,
    )
    return outs, t_outs


ad.jvp_rules[custom_vjp_call_p] = _custom_vjp_call_jvp


@custom_lin_p.def_abstract_eval
def _custom_lin_abstract_eval(*avals, bwd, num_nondiff, num_res, out_avals):
    return list(out_avals)


def _forward_mode_error(bwd):
    return user_error(
        TypeError,
        f"can't apply forward-mode autodiff (jvp) to a custom_vjp function "
        f"({_name(bwd)}); only reverse mode (vjp, grad) uses its fwd/bwd rules. Fix: use "
        f"fflow.custom_jvp for forward mode.",
    )


@custom_lin_p.def_impl
def _custom_lin_impl(*args, bwd, num_nondiff, num_res, out_avals):
    raise _forward_mode_error(bwd)


def _custom_lin_jvp(primals, tangents, *, bwd, num_nondiff, num_res, out_avals):
    raise _forward_mode_error(bwd)


def _custom_lin_transpose(cts, *args, bwd, num_nondiff, num_res, out_avals):
    k = num_nondiff + num_res
    nondiff, res = list(args[:num_nondiff]), list(args[num_nondiff:k])
    cts = [ad.zeros_like_aval(a) if type(c) is ad.Zero else c for c, a in zip(cts, out_avals)]
    return [None] * k + bwd(nondiff, res, cts)


ad.jvp_rules[custom_lin_p] = _custom_lin_jvp
ad.transpose_rules[custom_lin_p] = _custom_lin_transpose
custom_lin_p.traits.add("linear")


class custom_vjp:
    """A function with a user-defined VJP (reverse-mode derivative).

    `defvjp(fwd, bwd)`: `fwd(*args) -> (out, residuals)` and
    `bwd(*nondiff_args, residuals, cotangent_out) -> tuple of cotangents` (one per
    differentiable argument; None for a zero cotangent).

    Example:
        >>> import fflow, fflow.numpy as jnp
        >>> @fflow.custom_vjp
        ... def clip_gradient(x):
        ...     return x
        >>> def fwd(x):
        ...     return x, None
        >>> def bwd(res, g):
        ...     return (jnp.clip(g, -1.0, 1.0),)
        >>> clip_gradient.defvjp(fwd, bwd)
        >>> float(fflow.grad(lambda x: 5.0 * clip_gradient(x))(2.0))
        1.0
    """

    def __init__(self, fun, nondiff_argnums=()):
        functools.update_wrapper(self, fun)
        self.fun = fun
        self.nondiff_argnums = tuple(nondiff_argnums)
        self.fwd = None
        self.bwd = None

    def defvjp(self, fwd, bwd, symbolic_zeros=False):
        """Set the forward (`fwd(*args) -> (out, res)`) and backward rules."""
        self.fwd = fwd
        self.bwd = bwd

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return functools.partial(self, obj)

    def __call__(self, *args, **kwargs):
        name = _name(self.fun)
        if self.fwd is None:
            raise AttributeError(f"No VJP defined for custom_vjp function {name} using defvjp.")
        args = _resolve_args(self.fun, args, kwargs)
        if _is_eager():
            return self.fun(*args)
        a = _Args(args, self.nondiff_argnums, f"custom_vjp function {name}")
        out_store = Store()
        res_store = Store()
        fun, fwd_rule, bwd_rule = self.fun, self.fwd, self.bwd
        n_nd = len(a.dyn_nondiff)
        diff_args = a.diff_args(a.leaves)

        def fun_flat(*flat):
            return _flat_outputs(
                fun(*a.full_args(flat[:n_nd], flat[n_nd:])), out_store, f"custom_vjp {name}"
            )

        def fwd_flat(nondiff, primals):
            res = fwd_rule(*a.full_args(nondiff, primals))
            if not (isinstance(res, (tuple, list)) and len(res) == 2):
                raise user_error(
                    TypeError,
                    f"the custom_vjp fwd rule of {name} must return a pair (output, residuals)",
                )
            outs = _flat_outputs(res[0], out_store, f"custom_vjp {name} (fwd)")
            res_leaves, res_tree = tree_flatten(res[1])
            res_store.set(res_tree)
            return outs, [as_value(r) for r in res_leaves]

        def bwd_flat(nondiff, res, cts):
            ct_tree = tree_unflatten(out_store.value, cts)
            res_tree = tree_unflatten(res_store.value, res)
            cts_in = bwd_rule(*a.nondiff_args(nondiff), res_tree, ct_tree)
            return _flatten_cotangents(cts_in, diff_args, a.leaves, name)

        fun_flat.__name__ = name
        fwd_flat.__name__ = _name(fwd_rule)
        bwd_flat.__name__ = _name(bwd_rule)
        program, consts = None, []
        if _needs_program():
            in_avals = [aval_of_value(x) for x in a.dyn_nondiff + a.leaves]
            program, consts = trace_closed(fun_flat, in_avals)
        outs = custom_vjp_call_p.bind(
            *consts,
            *a.dyn_nondiff,
            *a.leaves,
            fun=fun_flat,
            fwd=fwd_flat,
            bwd=bwd_flat,
            program=program,
            num_consts=len(consts),
            num_nondiff=n_nd,
        )
        return tree_unflatten(out_store.value, outs)


def _flatten_cotangents(cts_in, diff_args, leaves, name):
    if not isinstance(cts_in, (tuple, list)) or len(cts_in) != len(diff_args):
        raise user_error(
            TypeError,
            f"the custom_vjp bwd rule of {name} must return a tuple with one cotangent per "
            f"differentiable argument ({len(diff_args)}), got "
            f"{type(cts_in).__name__}"
            + (f" of length {len(cts_in)}" if isinstance(cts_in, (tuple, list)) else ""),
        )
    out = []
    for ct, arg in zip(cts_in, diff_args):
        # None stands for a zero cotangent of a whole subtree (as in JAX)
        try:
            out.extend(prefix_broadcast(ct, arg, "custom_vjp cotangent"))
        except ValueError:
            raise user_error(
                TypeError,
                f"the custom_vjp bwd rule of {name} returned a cotangent of structure "
                f"{tree_structure(ct)} for an argument of structure {tree_structure(arg)}",
            ) from None
    return [None if c is None else _match_tangent(c, p, name) for c, p in zip(out, leaves)]


# ----------------------------------------------------------------------------
# checkpoint / remat

checkpoint_p = Primitive("checkpoint", multiple_results=True)


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


def _checkpoint_partial_eval(trace, args, params):
    """Known outputs now; the unknown ones staged as a `checkpoint` of the inputs."""
    program, policy = params["program"], params["policy"]
    is_unknown = [isinstance(a, StagingTracer) and a._trace is trace for a in args]
    unknown = {v for v, u in zip(program.invars, is_unknown) if u}
    known_eqns = []
    for eqn in program.eqns:
        if any(_is_var(v) and v in unknown for v in eqn.inputs):
            unknown.update(eqn.outputs)
        else:
            known_eqns.append(eqn)
    out_unknown = [_is_var(v) and v in unknown for v in program.outvars]
    unknown_outvars = [v for v, u in zip(program.outvars, out_unknown) if u]
    invars = set(program.invars)
    # residuals a policy allows to save: outputs of saveable known equations that the
    # unknown part needs; the rest of the known part is recomputed from them and the inputs
    saved = []
    if policy is not None:
        known_ids = {id(e) for e in known_eqns}
        for eqn in _needed_eqns(program.eqns, unknown_outvars, invars):
            if id(eqn) in known_ids and _saveable(policy, eqn):
                saved.extend(eqn.outputs)
        staged_eqns = _needed_eqns(program.eqns, unknown_outvars, invars | set(saved))
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
        _needed_eqns(program.eqns, unknown_outvars, invars | set(saved)),
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
    linear_vars = {v for v, lin in zip(program.invars, linear) if lin}
    known_vars = [v for v, lin in zip(program.invars, linear) if not lin]
    known_vals = [a for a, lin in zip(args, linear) if not lin]
    eqns = list(program.eqns)
    # Recompute the non-linear part first, as one `checkpoint` equation so that a
    # compiler cannot merge it with the forward pass (which would defeat remat).
    nonlinear, linear_eqns = [], []
    for eqn in eqns:
        if any(_is_var(v) and v in linear_vars for v in eqn.inputs):
            linear_vars.update(eqn.outputs)
            linear_eqns.append(eqn)
        else:
            nonlinear.append(eqn)
    if nonlinear:
        needed_by_linear = [
            v
            for v in dict.fromkeys(
                v for e in linear_eqns for v in e.inputs if _is_var(v) and v not in linear_vars
            )
            if v not in set(known_vars)
        ]
        needed_by_linear = [v for v in needed_by_linear if any(v in e.outputs for e in nonlinear)]
        if needed_by_linear:
            recompute = Program(
                known_vars,
                [],
                _needed_eqns(nonlinear, needed_by_linear, set(known_vars)),
                needed_by_linear,
                [],
            )
            res = checkpoint_p.bind(
                *known_vals, program=recompute, prevent_cse=prevent_cse, policy=None
            )
            known_vars = known_vars + needed_by_linear
            known_vals = known_vals + list(res)
        eqns = linear_eqns
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


def _dot_names():
    return ("dot_general",)


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
        return prim.name in _dot_names()

    checkpoint_dots = dots_saveable

    @staticmethod
    def dots_with_no_batch_dims_saveable(prim, *avals, **params):
        if prim.name not in _dot_names():
            return False
        (_, _), (lb, _) = params["dimension_numbers"]
        return not lb


__all__ = [
    "custom_jvp",
    "custom_vjp",
    "checkpoint",
    "remat",
    "checkpoint_policies",
    "custom_jvp_call_p",
    "custom_vjp_call_p",
    "custom_lin_p",
    "checkpoint_p",
]
