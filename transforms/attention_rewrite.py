"""Hand-written attention -> the fused `dot_product_attention` primitive.

`softmax(q @ kᵀ · scale + mask) @ v` spelled out with matmuls or einsums, a scale, a
mask and a softmax (`fflow.nn.softmax`, or `exp(x - max) / sum` by hand) becomes one
`dot_product_attention` equation (primitives/attention.py): one flash kernel per
direction on CUDA (lowering/cuda_attention.py), batched GEMMs without a stored [T, S]
residual on the CPU (lowering/cpu_attention.py).

It happens before any transform differentiates the equations, in two places:

* `jit` and `make_jaxpr` rewrite the program they trace (`rewrite_traced`), so the
  executable of `jit(f)`, `grad(jit(f))` and `vmap(jit(f))` use the primitive;
* `grad`/`vjp` (reverse mode) of a function being staged (inside `jit`, `make_jaxpr`,
  `shard` or a control-flow body) run it under a `RewriteTrace` (autodiff's
  `before_differentiation` hook), which passes every equation through to the
  differentiating trace and replaces the final `@ v` by the primitive, so
  `jit(grad(f))` differentiates the primitive (its flash backward), not the softmax.
  The hand-written forward is then dead code (the pass drops it). Forward mode
  (`jvp`, `jacfwd`) has no hook: the primitive's tangent map has no fast kernel (its
  NumPy reference runs), so `jit(jvp(f))` keeps the hand-written equations (the
  program of a `jit`ted f is rewritten whatever differentiates it later).

The rewrite happens only when the result is the same function:

* scores `dot_general(q, k)` with one contracting axis (head dim), one free axis each
  (queries, keys) and any batch axes (batch, heads, vmap's); the softmax over the keys
  axis; `probs @ v` contracting that axis, with the same batch axes;
* the scale: a product of constant scalars multiplying or dividing q, k or the scores
  (a traced or non-uniform factor is a bias: not rewritten);
* masks: `where(mask, s, fill)` with a constant scalar fill that is -inf or <= -1e4
  after the scales that follow it (a fully masked row then averages every value, as
  the primitive does), and additive constant masks with entries 0 or <= -1e4 / -inf.
  With -inf or an additive mask, the masks must be constants with at least one key
  per query (otherwise the hand-written softmax gives NaN rows where the primitive
  gives the mean). A constant `tril` mask becomes `causal=True`;
* dtype changes only between float dtypes (amp's roundings); q, k and v one dtype;
* no other reader of the scores, the probabilities or the softmax's intermediates
  (dropout on the probabilities, returning them, a second use): left alone. In a
  program every reader is known. The autodiff hook sees readers up to the `@ v`; when
  a later one shows up (or the value is returned), jit/make_jaxpr trace once more
  without that rewrite. (Through `has_aux`, which it cannot see, a reader gets the same
  values: the hand-written forward stays live for it.)

`fflow.config.update("attention_rewrite", False)` (env `FFLOW_ATTENTION_REWRITE=0`)
turns it off for what is traced afterwards (a jitted function keeps its cached
trace). `fflow.explain(f)(*args)` lists what was rewritten (and what nearly matched,
with the reason it was left alone); the logger "fflow.rewrite" logs the same at DEBUG
level.

Example:
    >>> import numpy as np, fflow, fflow.numpy as jnp
    >>> def attn(q, k, v):
    ...     return fflow.nn.softmax(q @ jnp.swapaxes(k, -1, -2) / np.sqrt(8.0)) @ v
    >>> x = np.ones((2, 4, 8), np.float32)
    >>> "dot_product_attention" in str(fflow.make_jaxpr(attn)(x, x, x))
    True
"""

import threading
import weakref

import numpy as np
from fflow.lowering.pad_sums import use_counts
from fflow.lowering.passes import dce
from fflow.primitives.binary import div_p
from fflow.primitives.convert import convert_element_type_p
from fflow.primitives.dot import dot_general_p
from fflow.primitives.shape import transpose_p
from fflow.primitives.unary import exp_p
from fflow.transforms import autodiff
from fflow.transforms.attention_match import Rewriter
from fflow.transforms.staging import StagingTrace, trace_to_program

import fflow.errors as errors
from fflow import core
from fflow.array import Array
from fflow.config import config
from fflow.core import Literal, Program, Var, set_current_trace

config.define("attention_rewrite", True)
_REWRITES = weakref.WeakKeyDictionary()  # program -> what was (not) rewritten in it
_collecting = threading.local()


def rewrites_of(program):
    """What the rewrite did when `program` was traced: a list of lines (for explain)."""
    return list(_REWRITES.get(program, ()))


# -- where it runs --------------------------------------------------------------------------


class RewriteTrace(core.Trace):
    """Passes every equation to its parent unchanged, except an attention's final
    `@ v`, which becomes the fused primitive (bound on the parent)."""

    def __init__(self, parent, ctx):
        super().__init__(parent)
        self.rewriter = Rewriter(parent, ctx)

    def process_primitive(self, prim, args, params):
        return self.rewriter.bind(prim, args, params)


class _Context:
    """One jit/make_jaxpr trace: its notes, the rewrites made by the autodiff hook (in
    order), those to skip on a retrace, and those found to have late readers."""

    def __init__(self, excluded=()):
        self.log = []
        self.count = 0
        self.excluded = set(excluded)
        self.late = set()


def _current_context():
    stack = getattr(_collecting, "stack", None)
    return stack[-1] if stack else _Context()


def _staged(trace):
    while trace is not None:
        if isinstance(trace, StagingTrace) and not trace.partial_eval:
            return True
        trace = trace.parent
    return False


def _before_differentiation(fun, primals):
    """autodiff's hook: differentiate `fun` with hand-written attention rewritten, when
    it is being staged (under jit, make_jaxpr, shard or a control-flow body: not eager
    grad or vmap, which would run the primitive's reference and keep every
    intermediate alive) and no outer derivative would differentiate the fused
    primitive's derivatives again."""
    if not config.attention_rewrite or not _staged(core.current_trace()):
        return fun

    def rewritten(*args):
        parent = core.current_trace()
        t = parent.parent
        while t is not None:  # grad of grad: keep the composite (twice differentiable)
            if isinstance(t, autodiff.JVPTrace):
                return fun(*args)
            t = t.parent
        ctx = _current_context()
        trace = RewriteTrace(parent, ctx)
        try:
            with set_current_trace(trace):
                outs = fun(*args)
        finally:
            trace.finish()
        ctx.late |= trace.rewriter.late_readers(outs)
        return outs

    return rewritten


autodiff.before_differentiation.append(_before_differentiation)


def _candidates(program):
    """Whether some dot_general reads (through casts) a div of an exp: worth a pass."""
    made = {}
    for e in program.eqns:
        for o in e.outputs:
            made[o] = e
    for e in program.eqns:
        if e.primitive is not dot_general_p:
            continue
        for x in e.inputs:
            src = made.get(x)
            while src is not None and src.primitive is convert_element_type_p:
                src = made.get(src.inputs[0])
            if src is not None and src.primitive is div_p:
                num = made.get(src.inputs[0])
                if num is not None and num.primitive is exp_p:
                    return True
    return False


def _nested(params, log):
    """`params` with the programs among them (scan/cond/while bodies, checkpoint and
    custom-rule calls) rewritten, or None when none changed."""
    out, changed = {}, False
    for key, value in params.items():
        items = value if isinstance(value, (tuple, list)) else (value,)
        if not any(isinstance(x, Program) for x in items):
            out[key] = value
            continue
        new = []
        for x in items:
            y = x
            if isinstance(x, Program):
                y, notes = rewrite_program(x)
                log += notes
            changed = changed or y is not x
            new.append(y)
        out[key] = type(value)(new) if isinstance(value, (tuple, list)) else new[0]
    return out if changed else None


def rewrite_program(program):
    """`program` with its hand-written attentions rewritten (nested programs too), and
    the notes (a new program only when something was rewritten)."""
    if not config.attention_rewrite:
        return program, []
    log, eqns = [], []
    for e in program.eqns:
        params = _nested(e.params, log)
        eqns.append(e if params is None else e.replace(params=params))
    if any(a is not b for a, b in zip(eqns, program.eqns)):
        program = program.replace(eqns=eqns)
    if not _candidates(program):
        return program, log
    counts = use_counts(program)
    ctx = _Context()
    box = []

    def run(*args):
        rw = Rewriter(core.current_trace(), ctx)
        rw.total = {}
        box.append(rw)
        env = dict(zip(program.constvars, program.consts))
        env.update(zip(program.invars, args))

        def read(v):
            if type(v) is not Literal:
                return env[v]
            return Array(np.asarray(v.value), True) if v.aval.weak_type else v.value

        for eqn in program.eqns:
            prev, errors.forced_source_info = errors.forced_source_info, eqn.source_info
            try:
                outs = rw.bind(eqn.primitive, [read(v) for v in eqn.inputs], eqn.params)
            finally:
                errors.forced_source_info = prev
            outs = outs if eqn.primitive.multiple_results else [outs]
            for v, x in zip(eqn.outputs, outs):
                env[v] = x
                rw.total[id(x)] = counts.get(v, 0)
        return [read(v) for v in program.outvars]

    new = trace_to_program(run, program.in_avals, parent=core.current_trace())
    if not box[0].fired:
        return program, log + ctx.log
    return _fold_transposes(new), log + ctx.log


def _fold_transposes(program):
    """transpose(transpose(x)) -> one transpose, or x itself: the primitive's [B, T, N, H]
    layout undoes the usual head-major transposes around a hand-written attention (and
    their transposes in the backward pass)."""
    made = {}  # var -> (source, permutation) of a transpose
    rename = {}
    eqns = []

    def name(v):
        return rename.get(v, v) if type(v) is Var else v

    for e in program.eqns:
        ins = [name(v) for v in e.inputs]
        if e.primitive is transpose_p and type(ins[0]) is Var and ins[0] in made:
            src, inner = made[ins[0]]
            perm = tuple(inner[i] for i in e.params["permutation"])
            if perm == tuple(range(len(perm))):
                rename[e.outputs[0]] = src
                continue
            ins, e = [src], e.replace(params={"permutation": perm})
        if ins != e.inputs:
            e = e.replace(inputs=ins)
        if e.primitive is transpose_p:
            made[e.outputs[0]] = (e.inputs[0], e.params["permutation"])
        eqns.append(e)
    outvars = [name(v) for v in program.outvars]
    return dce(program.replace(eqns=eqns, outvars=outvars))


def rewrite_traced(trace):
    """jit's and make_jaxpr's entry: run `trace()` (-> Program) with the autodiff hook
    on, then rewrite the program; the notes go to `rewrites_of`. When the hook rewrote
    an attention whose intermediates turned out to be read later, trace once more
    without that rewrite (the hook sees readers only up to the product)."""
    if not config.attention_rewrite:
        return trace()
    stack = _collecting.__dict__.setdefault("stack", [])
    ctx = _Context()
    for _ in range(2):
        stack.append(ctx)
        try:
            program = trace()
        finally:
            stack.pop()
        if not ctx.late - ctx.excluded:
            break
        ctx = _Context(ctx.excluded | ctx.late)
    program, more = rewrite_program(program)
    log = ctx.log + more
    if any(line.startswith("rewritten") for line in log):
        program = _fold_transposes(program)
    if log:
        _REWRITES[program] = log
    return program


__all__ = ["rewrite_program", "rewrite_traced", "rewrites_of", "RewriteTrace"]
