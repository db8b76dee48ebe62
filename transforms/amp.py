"""amp: automatic mixed precision as a transform that composes with all the others.

`amp(f, policy)` runs `f` under an `AmpTrace`. The user's code sees the *logical*
program — every value has the dtype it would have without AMP, so dtype logic in
user code and in `fflow.numpy` (promotion, `astype`) runs unchanged — while each
primitive is re-bound on the parent trace in the dtype its AMP class asks for
(transforms/amp_policy.py): casts (`convert_element_type`) appear only where a value
crosses a class boundary. Because the rewrite binds on the parent trace, it is a
program-to-program rewrite under `make_jaxpr`/`jit` (the printed program shows the
casts) and composes with `grad`, `vmap` and `shard` like any transform.

Cast folding: every value remembers the casts already made of it, so a parameter
used by three matmuls is cast once; and a value AMP rounded down from a wider one
(a matmul's fp32 accumulator rounded to bf16) is read from that wider original
when a consumer wants it back — the down-and-up round trip folds away.
"""

import functools
import weakref

import numpy as np
from fflow.transforms.ad_api import value_and_grad
from fflow.transforms.amp_policy import CLASSES, FOLLOW, KEEP, Policy
from fflow.transforms.amp_rules import Rounded, amp_rules, keep, target_dtype
from fflow.transforms.amp_scale import (
    DynamicLossScale,
    NoOpLossScale,
    StaticLossScale,
    all_finite,
    select_tree,
)
from fflow.transforms.staging import eval_program, trace_to_program

from fflow import core, dtypes
from fflow import lax_ops as lax
from fflow.core import Program, aval_of_value, set_current_trace
from fflow.errors import user_error
from fflow.tree_util import tree_flatten, tree_unflatten


class AmpTracer(core.Tracer):
    """A value under `amp`: its logical aval (what user code sees), its physical dtype,
    its physical values on the parent trace by dtype (`casts`: the value itself plus
    the casts made of it, or a wider original it is a rounding of), and whether it is
    weak (a constant built from Python scalars, which follows the other operands)."""

    __slots__ = ("_aval", "_dtype", "casts", "weak")

    def __init__(self, trace, aval, dtype, casts, weak=False):
        self._trace = trace
        self._aval = aval
        self._dtype = dtype
        self.casts = casts
        self.weak = weak

    @classmethod
    def of(cls, trace, aval, value, weak=False):
        dtype = _dtype_of(value)
        return cls(trace, aval, dtype, {dtype: value}, weak)

    @property
    def aval(self):
        return self._aval

    @property
    def physical_dtype(self):
        return self._dtype

    @property
    def is_float(self):
        return dtypes.is_float(self._dtype)

    @property
    def value(self):
        """The physical value; a pending rounding (a matmul's fp32 accumulator to
        bf16) is materialized on first use, so unused roundings never appear."""
        v = self.casts.get(self._dtype)
        if v is None:
            src = max(self.casts.values(), key=lambda x: _dtype_of(x).itemsize)
            with set_current_trace(self._trace.parent):
                v = lax.convert_element_type(src, self._dtype)
            self.casts[self._dtype] = v
        return v

    def concrete_value(self):
        v = self.value
        if isinstance(v, core.Tracer):
            return v.concrete_value()
        return v


def _dtype_of(x):
    d = getattr(x, "dtype", None)  # arrays and tracers: no aval object built
    return d if isinstance(d, np.dtype) else aval_of_value(x).dtype


def _is_weak_const(x):
    """Python scalars and 0-d NumPy scalars that bind() received as operands."""
    if isinstance(x, (bool, int, float, complex)):
        return True
    return (
        not isinstance(x, core.Tracer)
        and getattr(x, "ndim", None) == 0
        and (getattr(x, "aval", None) is None or x.aval.weak_type)
    )


class AmpTrace(core.Trace):
    """Rewrites each primitive into the dtypes of its AMP class (see module docstring)."""

    def __init__(self, policy, parent=None):
        super().__init__(parent)
        self.policy = policy
        self._foreign = {}  # id(value) -> tracer wrapping a value of an outer level

    # -- values -------------------------------------------------------------------
    def lift(self, x):
        if isinstance(x, AmpTracer) and x._trace is self:
            return x
        if isinstance(x, core.Tracer):
            core.check_not_leaked(x)
        entry = self._foreign.get(id(x))
        if entry is not None and entry.casts.get(entry.physical_dtype) is x:
            return entry
        aval = aval_of_value(x)
        t = AmpTracer.of(self, aval, x, weak=aval.weak_type or _is_weak_const(x))
        self._foreign[id(x)] = t  # keeps x alive, so the id stays unique
        return t

    def new_arg(self, x):
        aval = aval_of_value(x)
        value = x
        param = self.policy.param_dtype
        if param is not None and dtypes.is_float(aval.dtype) and aval.dtype != param:
            with set_current_trace(self.parent):
                value = lax.convert_element_type(x, param)
        return AmpTracer.of(self, aval, value, weak=aval.weak_type)

    def cast(self, t, dtype):
        """`t`'s physical value in `dtype` (on the parent trace), cast once and remembered.

        A value that is a rounding of a wider original is cast from that original."""
        if dtype == t.physical_dtype:
            return t.value
        out = t.casts.get(dtype)
        if out is None:
            widest = max(t.casts, key=lambda d: d.itemsize, default=t.physical_dtype)
            if widest.itemsize > t.physical_dtype.itemsize:
                src = t.casts[widest]  # round once, from the wider original
            else:
                src = t.value
            out = lax.convert_element_type(src, dtype)
            t.casts[dtype] = out
        return out

    def to_output(self, x):
        if not (isinstance(x, AmpTracer) and x._trace is self):
            return x
        logical = x.aval.dtype
        if not dtypes.is_float(logical):
            target = logical
        else:
            target = self.policy.output_dtype or logical
        with set_current_trace(self.parent):
            return self.cast(x, target)

    # -- primitives ---------------------------------------------------------------
    def process_primitive(self, prim, args, params):
        ins = [self.lift(a) for a in args]
        out_avals = prim.abstract_eval(*[t.aval for t in ins], **params)
        cls = self.policy.class_of(prim)
        rule = amp_rules.get(prim)
        if rule is None:
            rule = _nested_rule if _has_nested_programs(params) else _class_rule
        with set_current_trace(self.parent):
            outs = rule(self, prim, cls, ins, params)
        weak = cls == FOLLOW and all(t.weak for t in ins if t.is_float)
        if prim.multiple_results:
            return [self._box(a, o, weak) for a, o in zip(out_avals, outs)]
        return self._box(out_avals, outs, weak)

    def _box(self, aval, out, weak):
        if type(out) is Rounded:
            dtype = np.dtype(out.dtype)
            return AmpTracer(self, aval, dtype, {_dtype_of(out.value): out.value}, weak)
        return AmpTracer.of(self, aval, out, weak)


# ----------------------------------------------------------------------------
# Rules


def _class_rule(trace, prim, cls, ins, params):
    """The default: cast the floating inputs to the class's dtype, bind."""
    target = KEEP if cls == KEEP else target_dtype(trace, cls, ins)
    if target is KEEP:
        return keep(trace, ins, prim, params)
    if target is None:
        return prim.bind(*[t.value for t in ins], **params)
    vals = [trace.cast(t, target) if t.is_float else t.value for t in ins]
    return prim.bind(*vals, **params)


def _has_nested_programs(params):
    found = False
    for v in params.values():
        if callable(v) and not isinstance(v, Program):
            return False  # custom_jvp/vjp: a Python rule must agree with the program
        if isinstance(v, Program) or (
            isinstance(v, (tuple, list)) and v and all(isinstance(p, Program) for p in v)
        ):
            found = True
    return found


_rewritten = weakref.WeakKeyDictionary()  # closed Program -> {policy: its AMP rewrite}


def _rewrite_nested(program, policy):
    cache = _rewritten.setdefault(program, {})
    new = cache.get(policy)
    if new is None:
        new = rewrite_program(program, policy)
        if new.constvars or len(new.outvars) != len(program.outvars):
            new = program  # nested programs must stay closed; keep the original
        cache[policy] = new
    return new


def _nested_rule(trace, prim, cls, ins, params):
    """Control flow (cond, while, scan) and checkpoint: the operands keep their
    dtypes (a loop carry's type is fixed) while the nested programs are rewritten.

    A rewritten program has the signature of the original (outputs are cast back to
    their dtypes), so it drops into the same equation.
    """
    if cls == KEEP and (prim.name in trace.policy.overrides or hasattr(prim, "amp_class")):
        return keep(trace, ins, prim, params)  # asked for explicitly
    new_params = {}
    for k, v in params.items():
        if isinstance(v, Program):
            v = _rewrite_nested(v, trace.policy)
        elif isinstance(v, (tuple, list)) and v and all(isinstance(p, Program) for p in v):
            v = type(v)(_rewrite_nested(p, trace.policy) for p in v)
        new_params[k] = v
    return keep(trace, ins, prim, new_params)


# ----------------------------------------------------------------------------
# The transform


def amp_transform(fun, policy="bf16"):
    """`fun` rewritten to mixed precision under `policy` (see `fflow.amp`)."""
    if not callable(fun):
        raise user_error(
            TypeError,
            f"amp: expected a function, got {type(fun).__name__}. Fix: call it as "
            f"fflow.amp(f, 'bf16')(*args) (the function first, then the policy).",
        )
    policy = Policy.resolve(policy)

    @functools.wraps(fun)
    def amp_fun(*args, **kwargs):
        leaves, in_tree = tree_flatten((args, kwargs))
        trace = AmpTrace(policy)
        try:
            boxed = [trace.new_arg(x) if _is_array_like(x) else x for x in leaves]
            a, k = tree_unflatten(in_tree, boxed)
            with set_current_trace(trace):
                out = fun(*a, **k)
            out_leaves, out_tree = tree_flatten(out)
            outs = [trace.to_output(o) for o in out_leaves]
        finally:
            trace.finish()
        return tree_unflatten(out_tree, outs)

    amp_fun.amp_policy = policy
    return amp_fun


def _is_array_like(x):
    return isinstance(x, core.Tracer) or hasattr(x, "dtype") and hasattr(x, "shape")


def rewrite_program(program, policy="bf16"):
    """The AMP rewrite of a traced `Program` (same inputs and outputs, casts inside)."""

    def run(*args):
        return eval_program(program, program.consts, list(args))

    return _drop_dead_casts(trace_to_program(amp_transform(run, policy), program.in_avals))


def _drop_dead_casts(program):
    """Remove casts nobody reads (a matmul's rounded output whose consumers all
    read the fp32 accumulator). jit's DCE does this too; nested programs are
    printed and lowered as they are, so clean them here."""
    used = {v for v in program.outvars if isinstance(v, core.Var)}
    kept = []
    for eqn in reversed(program.eqns):
        if "cast" in eqn.primitive.traits and eqn.outputs[0] not in used:
            continue
        kept.append(eqn)
        used.update(v for v in eqn.inputs if isinstance(v, core.Var))
    return program.replace(eqns=kept[::-1])


def scaled_value_and_grad(fun, argnums=0, has_aux=False):
    """value_and_grad with loss scaling: ``(loss_scale, *args) -> (value, grads, finite)``.

    The loss is multiplied by ``loss_scale.scale`` before differentiating and the
    gradients divided by it afterwards, so they come back at their true size;
    `finite` says whether they are all finite (if not, skip the update with
    `select_tree` and let ``loss_scale.adjust(finite)`` back off).

    Example:
        >>> import fflow, fflow.numpy as jnp
        >>> f = fflow.amp(lambda w: jnp.sum(w * w) * 1e-6, "fp16")
        >>> ls = fflow.amp.DynamicLossScale()
        >>> loss, g, finite = fflow.amp.scaled_value_and_grad(f)(ls, jnp.ones(2))
        >>> bool(finite), g.dtype.name
        (True, 'float32')
    """

    @functools.wraps(fun)
    def wrapped(loss_scale, *args, **kwargs):
        def scaled(*a, **k):
            out = fun(*a, **k)
            loss, aux = out if has_aux else (out, None)
            return loss_scale.scale(loss), (loss, aux)

        (_, (loss, aux)), grads = value_and_grad(scaled, argnums, has_aux=True)(*args, **kwargs)
        grads = loss_scale.unscale(grads)
        value = (loss, aux) if has_aux else loss
        return value, grads, all_finite(grads)

    return wrapped


class _Amp:
    """``fflow.amp(f, policy)``: `f` rewritten to mixed precision; also the AMP namespace.

    Each primitive runs in the dtype of its AMP class (transforms/amp_policy.py):
    matmuls in the policy's compute dtype (bf16/fp16) with fp32 accumulation; exp,
    log, pow, sums (so softmax, logsumexp, norms and losses) in fp32; everything
    else in the widest dtype among its inputs. Casts go in only at class boundaries.
    The rewritten function has the original's signature: fp32 inputs (master
    weights) stay fp32 outside the rewritten region, outputs come back in the
    original dtypes, and so gradients reach the optimizer in fp32. It composes with
    `grad`, `jit`, `vmap` and `shard` in any order.

    Args:
        fun: the function to rewrite (pytrees in, pytrees out).
        policy: "bf16", "fp16", or a `fflow.amp.Policy`.

    Attributes: `Policy`, `DynamicLossScale`, `StaticLossScale`, `NoOpLossScale`,
    `all_finite`, `select_tree`, `scaled_value_and_grad`, `rewrite_program`,
    `amp_rules`.

    Example:
        >>> import fflow, fflow.numpy as jnp
        >>> f = fflow.amp(lambda w, x: jnp.sum(jnp.tanh(x @ w)), "bf16")
        >>> print(fflow.make_jaxpr(f)(jnp.ones((3, 2)), jnp.ones((4, 3))))  # doctest: +ELLIPSIS
        { lambda ; a:f32[3,2] b:f32[4,3]. let
            c:bf16[4,3] = convert_element_type[new_dtype=bf16 weak_type=False] b
            d:bf16[3,2] = convert_element_type[new_dtype=bf16 weak_type=False] a
            e:f32[4,2] = dot_general[...preferred_element_type=f32] c d
            f:bf16[4,2] = convert_element_type[new_dtype=bf16 weak_type=False] e
            g:bf16[4,2] = tanh f
            h:f32[4,2] = convert_element_type[new_dtype=f32 weak_type=False] g
            i:f32[] = reduce_sum[axes=(0, 1)] h
          in (i,) }
    """

    Policy = Policy
    DynamicLossScale = DynamicLossScale
    StaticLossScale = StaticLossScale
    NoOpLossScale = NoOpLossScale
    AmpTrace = AmpTrace
    all_finite = staticmethod(all_finite)
    select_tree = staticmethod(select_tree)
    scaled_value_and_grad = staticmethod(scaled_value_and_grad)
    rewrite_program = staticmethod(rewrite_program)
    amp_rules = amp_rules
    CLASSES = CLASSES

    def __call__(self, fun, policy="bf16"):
        return amp_transform(fun, policy)

    def __repr__(self):
        return "<fflow.amp: amp(f, policy) and its namespace>"


amp = _Amp()
