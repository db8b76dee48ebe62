"""Debugging inside transformations: `fflow.debug.print`, `fflow.debug.callback`,
NaN/inf checking (`fflow.config.update("debug_nans", True)`) and the interpreter
that runs a program equation by equation.

`debug.print` is an effectful primitive (`debug_callback`): DCE and CSE never drop
or merge it, jit runs it in program order at run time, vmap prints every lane,
and differentiation prints the primal only (it has no tangent).

Example:
    >>> import fflow, fflow.numpy as jnp
    >>> @fflow.jit
    ... def f(x):
    ...     fflow.debug.print("x = {}", x)
    ...     return x * 2
    >>> _ = f(jnp.arange(3.0))
    x = [0. 1. 2.]
"""

import numpy as np

from fflow import array_methods, core, errors
from fflow import lax_ops as lax
from fflow.array import Array, root_trace
from fflow.config import config
from fflow.core import Literal, Primitive
from fflow.errors import FflowError
from fflow.transforms.autodiff import jvp_rules
from fflow.transforms.shard_rules import def_broadcast_only
from fflow.transforms.staging import _at_source
from fflow.transforms.vmap import batch_rules
from fflow.tree_util import tree_flatten, tree_unflatten

# -- the effectful primitive ------------------------------------------------------

debug_callback_p = Primitive("debug_callback", multiple_results=True)
debug_callback_p.traits.add("effect")
debug_callback_p.amp_class = "follow"


@debug_callback_p.def_impl
def _debug_callback_impl(*args, callback, in_tree):
    values = [Array(np.asarray(a)) for a in args]
    callback(*tree_unflatten(in_tree, values))
    return []


@debug_callback_p.def_abstract_eval
def _debug_callback_abstract_eval(*avals, callback, in_tree):
    return []


def _debug_callback_jvp(primals, tangents, *, callback, in_tree):
    # the primal only: a tangent is not printed (JAX's behaviour under grad)
    debug_callback_p.bind(*primals, callback=callback, in_tree=in_tree)
    return [], []


def _debug_callback_batch(vals, dims, *, callback, in_tree):
    # one callback per lane, in lane order
    size = None
    for v, d in zip(vals, dims):
        if d is not None:
            size = core.aval_of_value(v).shape[d]
            break
    for i in range(size):
        lane = []
        for v, d in zip(vals, dims):
            if d is None:
                lane.append(v)
            else:
                lane.append(lax.index_in_dim(v, i, d, keepdims=False))
        debug_callback_p.bind(*lane, callback=callback, in_tree=in_tree)
    return [], []


def _register_rules():
    jvp_rules[debug_callback_p] = _debug_callback_jvp
    batch_rules[debug_callback_p] = _debug_callback_batch
    def_broadcast_only(
        debug_callback_p,
        "an effect with no outputs: under shard it prints the replicated (whole) value",
    )


_register_rules()


def callback(fn, *args, **kwargs):
    """Call `fn(*args, **kwargs)` with concrete arrays at run time, also under jit/vmap/grad.

    Example:
        >>> import fflow, fflow.numpy as jnp
        >>> seen = []
        >>> fflow.jit(lambda x: fflow.debug.callback(seen.append, x) or x)(jnp.ones(2))
        Array([1., 1.], dtype=float32)
        >>> seen[0].tolist()
        [1.0, 1.0]
    """
    leaves, in_tree = tree_flatten((args, kwargs))

    def call(*a, **k):
        fn(*a, **k)

    def unpack(packed_args, packed_kwargs):
        call(*packed_args, **packed_kwargs)

    debug_callback_p.bind(*leaves, callback=_Splat(unpack), in_tree=in_tree)


def breakpoint(*, backend=None, filter_frames=True, num_frames=None, ordered=False, **kwargs):  # noqa: A001
    """Stop in the Python debugger when this point runs (also under jit/vmap), as
    `jax.debug.breakpoint`. The values of the enclosing jitted function are concrete
    there; `PYTHONBREAKPOINT=0` turns it off, as for Python's own `breakpoint()`."""
    import sys

    callback(lambda: sys.breakpointhook())


class _Splat:
    """Calls `fn(args, kwargs)` from the flat (args, kwargs) pytree; hashable by identity."""

    __slots__ = ("fn",)

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, args, kwargs):
        self.fn(args, kwargs)


def print(fmt, *args, **kwargs):  # noqa: A001 - JAX's name
    """Print `fmt.format(*args, **kwargs)` with run-time values, also under jit/vmap/grad.

    Under vmap every lane prints; under grad only the primal values print.

    Example:
        >>> import fflow, fflow.numpy as jnp
        >>> fflow.vmap(lambda x: fflow.debug.print("lane {}", x))(jnp.arange(2))
        lane 0
        lane 1
    """
    import builtins

    def show(*a, **k):
        builtins.print(fmt.format(*a, **k), flush=True)

    callback(show, *args, **kwargs)


# -- NaN / inf checks --------------------------------------------------------------


class FloatingPointError_(FflowError, FloatingPointError):
    """A NaN or inf appeared while `debug_nans` / `debug_infs` was on."""


NanError = FloatingPointError_


def _bad(value, nans, infs):
    v = np.asarray(value)
    if v.dtype.kind not in "fc" and v.dtype.name != "bfloat16":
        return None
    if nans and np.isnan(v).any():
        return "NaN"
    if infs and np.isinf(v).any():
        return "inf"
    return None


def _check(prim, invals, outvals, info, nans, infs):
    for out in outvals:
        kind = _bad(out, nans, infs)
        if kind is None:
            continue
        if any(_bad(a, kind == "NaN", kind == "inf") for a in invals):
            continue  # not produced here: an input already had it
        where = f"\n  at {info}" if info is not None else ""
        text = info.line_text() if info is not None else ""
        if text:
            where += f"\n    {text}"
        option = "debug_nans" if kind == "NaN" else "debug_infs"
        raise NanError(
            f"{option}: the primitive {prim.name!r} produced a {kind}{where}\n"
            f"Fix: guard the operation's inputs (e.g. jnp.where before log/sqrt/div), or "
            f"turn the check off with fflow.config.update({option!r}, False)."
        )


def run_interpreted(program, leaves):
    """Run `program` equation by equation with the reference implementations.

    With `debug_nans`/`debug_infs` on, raise at the first equation that produced a
    NaN/inf, naming the primitive and the user's line that created the equation.
    """
    nans, infs = config.debug_nans, config.debug_infs
    env = dict(zip(program.constvars, program.consts))
    env.update(zip(program.invars, leaves))

    def read(v):
        return v.value if type(v) is Literal else env[v]

    with core.set_current_trace(root_trace):
        for eqn in program.eqns:
            invals = [read(v) for v in eqn.inputs]
            with _at_source(eqn.source_info):
                outs = eqn.primitive.bind(*invals, **eqn.params)
            outs = outs if eqn.primitive.multiple_results else [outs]
            if nans or infs:
                _check(eqn.primitive, invals, outs, eqn.source_info, nans, infs)
            env.update(zip(eqn.outputs, outs))
        return [_as_array(read(v), v.aval) for v in program.outvars]


def _as_array(x, aval):
    if type(x) is Array:
        return x
    return Array(np.asarray(x, aval.dtype), aval.weak_type)


def _checking_process_primitive(prim, args, params):
    out = type(root_trace).process_primitive(root_trace, prim, args, params)
    outs = out if prim.multiple_results else [out]
    _check(
        prim,
        [a for a in args if type(a) is Array or isinstance(a, np.ndarray)],
        outs,
        errors.user_source_info(),
        config.debug_nans,
        config.debug_infs,
    )
    return out


_FAST_OPERATORS = {
    "__add__": ("add", False),
    "__radd__": ("add", True),
    "__sub__": ("subtract", False),
    "__rsub__": ("subtract", True),
    "__mul__": ("multiply", False),
    "__rmul__": ("multiply", True),
    "__truediv__": ("true_divide", False),
    "__rtruediv__": ("true_divide", True),
}
_saved_operators = {}


def install_eager_checks(on):
    """Check every eager primitive's outputs (the root trace) while NaN checks are on.

    The eager operators' NumPy fast path (fflow/array_methods.py) binds no primitive,
    so while checking, Array's operators take the primitive path instead.
    """
    if on:
        root_trace.process_primitive = _checking_process_primitive
        if not _saved_operators:
            for dunder, (name, reflected) in _FAST_OPERATORS.items():
                _saved_operators[dunder] = Array.__dict__[dunder]
                setattr(Array, dunder, array_methods._binop(name, None, reflected))
    else:
        root_trace.__dict__.pop("process_primitive", None)
        for dunder, method in _saved_operators.items():
            setattr(Array, dunder, method)
        _saved_operators.clear()


def _eager_checks_hook(_value):
    # fflow/__init__ calls this when debug_nans / debug_infs change (this module loads
    # on first use)
    install_eager_checks(config.debug_nans or config.debug_infs)


__all__ = ["print", "callback", "breakpoint", "debug_callback_p", "run_interpreted", "NanError"]
