"""User-defined derivatives: `custom_jvp` and `custom_vjp` (and, from remat.py,
`checkpoint` / `remat`).

Each is a primitive whose equation carries the traced function as a nested
program (so `jit` stages it, the printer shows it and every backend can run it
through the primitive's implementation):

- `custom_jvp_call[program, jvp]`: its JVP rule calls the user's rule.
- `custom_vjp_call[program, fwd, bwd]`: its JVP rule runs `fwd` and emits a
  `custom_lin` equation, linear in the tangents, whose transpose calls `bwd`. So
  `vjp`/`grad` (linearize + transpose) use the user's rules, and forward mode
  reports that it is not defined (as in JAX).

Closed-over arrays and tracers become leading inputs of these equations
(closure conversion), so outer transformations see them.
"""

import functools
import inspect

import numpy as np
from fflow.transforms import autodiff as ad
from fflow.transforms import vmap as vm
from fflow.transforms.shard_rules import CALL_REPLICATED, def_broadcast_only
from fflow.transforms.staging import (
    StagingTrace,
    eval_program,
    trace_to_program,
)

from fflow import core
from fflow import lax_ops as lax
from fflow.api_util import Store, as_value
from fflow.array import Array, EvalTrace, root_trace
from fflow.core import Primitive, Program, aval_of_value, set_current_trace
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

    return core.current_trace() is root_trace


def _needs_program():
    """Whether some enclosing transform needs the function as a program.

    Eager evaluation, forward mode and linearize only call the Python functions, so
    under them a custom function may use Python control flow on concrete values.
    """

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


def _bind_call(prim, a, fun_flat, **rules):
    """Bind custom_jvp_call / custom_vjp_call on `a`'s flat arguments, tracing `fun_flat`
    to a closed program only when an enclosing transform needs one."""
    program, consts = None, []
    if _needs_program():
        in_avals = [aval_of_value(x) for x in a.dyn_nondiff + a.leaves]
        program, consts = trace_closed(fun_flat, in_avals)
    return prim.bind(
        *consts,
        *a.dyn_nondiff,
        *a.leaves,
        fun=fun_flat,
        **rules,
        program=program,
        num_consts=len(consts),
        num_nondiff=len(a.dyn_nondiff),
    )


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


def _match_tangent(t, primal, name, what="jvp"):
    """A rule's tangent output as an array of the primal output's shape and dtype."""
    t = as_value(t)
    p_aval = aval_of_value(primal)
    t_aval = aval_of_value(t)
    if t_aval.shape != p_aval.shape:
        if what == "vjp":
            raise user_error(
                TypeError,
                f"the custom_vjp bwd rule of {name} returned a cotangent of shape "
                f"{t_aval.shape} for an argument of shape {p_aval.shape}. Fix: bwd must "
                f"return one cotangent per argument, each of that argument's shape.",
            )
        raise user_error(
            TypeError,
            f"the custom JVP rule of {name} returned a tangent of shape {t_aval.shape} for a "
            f"primal output of shape {p_aval.shape}. Fix: return tangents of the primal "
            f"outputs' shapes.",
        )
    if t_aval.dtype != p_aval.dtype:
        t = lax.convert_element_type(t, p_aval.dtype)
    return t


# ----------------------------------------------------------------------------
# custom_jvp

custom_jvp_call_p = Primitive("custom_jvp_call", multiple_results=True)
custom_jvp_call_p.eager_shape_rule = False  # its rule traces the user's function


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
        """Set the rule `jvp(*nondiff_args, primals, tangents) -> (primal_out, tangent_out)`.

        Zero tangents reach the rule as zero arrays (`symbolic_zeros` is accepted for
        JAX compatibility and has no effect). Returns `jvp`, so it works as a decorator.
        """
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
        if _is_eager():
            return self.fun(*args, **kwargs)
        args = _resolve_args(self.fun, args, kwargs)
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
                    f"the custom JVP rule of {name} must return a pair (primal_out, tangent_out). "
                    "Fix: return (f(x), tangent).",
                )
            p_out = _flat_outputs(res[0], out_store, f"custom_jvp {name}")
            t_leaves, t_tree = tree_flatten(res[1])
            if t_tree != out_store.value:
                raise user_error(
                    TypeError,
                    f"the custom JVP rule of {name} returned a tangent of structure {t_tree} "
                    f"for a primal output of structure {out_store.value}. Fix: the tangent "
                    f"output has the primal output's structure.",
                )
            return p_out, [_match_tangent(t, p, name) for t, p in zip(t_leaves, p_out)]

        fun_flat.__name__ = name
        jvp_flat.__name__ = _name(rule)
        outs = _bind_call(custom_jvp_call_p, a, fun_flat, jvp=jvp_flat)
        return tree_unflatten(out_store.value, outs)


def _add(x, y):
    return x + y


# ----------------------------------------------------------------------------
# custom_vjp

custom_vjp_call_p = Primitive("custom_vjp_call", multiple_results=True)
custom_vjp_call_p.eager_shape_rule = False  # its rule traces the user's function
custom_lin_p = Primitive("custom_lin", multiple_results=True)
for _p in (custom_jvp_call_p, custom_vjp_call_p):
    _p.traits.add("call")  # runs its `program` param: backends compile it, shard inlines it
def_broadcast_only(custom_jvp_call_p, CALL_REPLICATED)
def_broadcast_only(custom_vjp_call_p, CALL_REPLICATED)
def_broadcast_only(custom_lin_p, "a custom_vjp's backward (a Python function) runs whole")


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
        """Set the forward (`fwd(*args) -> (out, res)`) and backward rules.

        `bwd(*nondiff_args, res, ct)` gets zero arrays for zero output cotangents
        (`symbolic_zeros` is accepted for JAX compatibility and has no effect).
        """
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
        if _is_eager():
            return self.fun(*args, **kwargs)
        args = _resolve_args(self.fun, args, kwargs)
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
        outs = _bind_call(custom_vjp_call_p, a, fun_flat, fwd=fwd_flat, bwd=bwd_flat)
        return tree_unflatten(out_store.value, outs)


def _flatten_cotangents(cts_in, diff_args, leaves, name):
    if not isinstance(cts_in, (tuple, list)) or len(cts_in) != len(diff_args):
        raise user_error(
            TypeError,
            f"the custom_vjp bwd rule of {name} must return a tuple with one cotangent per "
            f"differentiable argument ({len(diff_args)}), got "
            f"{type(cts_in).__name__}"
            + (f" of length {len(cts_in)}" if isinstance(cts_in, (tuple, list)) else "")
            + ". Fix: return a tuple such as (ct_x,) even for one argument.",
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
                f"{tree_structure(ct)} for an argument of structure {tree_structure(arg)}. "
                f"Fix: each cotangent has its argument's structure (None for a zero).",
            ) from None
    return [None if c is None else _match_tangent(c, p, name, "vjp") for c, p in zip(out, leaves)]


# ----------------------------------------------------------------------------
# Batching (vmap): the user's rules are kept; the batched equation carries vmapped
# versions of them, so grad(vmap(f)) still uses a custom JVP/VJP.


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
            custom_jvp_call_p,
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
    outs = custom_jvp_call_p.bind(
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
        return _batched_program_call(custom_vjp_call_p, vals, dims, params)
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
    outs = custom_vjp_call_p.bind(
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
    outs = custom_lin_p.bind(
        *vals, bwd=bwd_b, num_nondiff=num_nondiff, num_res=num_res, out_avals=new_avals
    )
    return outs, [0] * len(outs)


vm.batch_rules[custom_jvp_call_p] = _custom_jvp_call_batch
vm.batch_rules[custom_vjp_call_p] = _custom_vjp_call_batch
vm.batch_rules[custom_lin_p] = _custom_lin_batch


__all__ = [
    "custom_jvp",
    "custom_vjp",
    "custom_jvp_call_p",
    "custom_vjp_call_p",
    "custom_lin_p",
]
