"""`shard`: OneFlow's SBP on fflow programs, and `with_sbp` constraints.

`shard(f, placement, in_sbp, out_sbp)` traces `f` to a global program, plans an
SBP for every value (transforms/shard_plan.py), inserts boxing collectives and
runs one SPMD program per device (transforms/shard_exec.py) on the current
runtime: simulated devices, or MPI ranks under `python -m fflow.launch`.

A sharded call is one `shard_call` equation, so the other transforms compose:
`grad(shard(f))` differentiates the global program and re-plans the tangent and
cotangent programs (cotangents follow the duality B<->P, S(k)<->S(k): a gradient
of a broadcast parameter is partial and boxing makes it broadcast again, so data
parallelism's gradient all-reduce appears by itself), `shard(grad(f))` plans the
whole training step, `jit` stages the call, `vmap` batches the global program.
Values of outer transformations (and global arrays) that `f` closes over become
extra inputs; a nested `shard` on the same placement is inlined with its SBPs as
constraints.

Module map: shard_rules.py (signature tables), shard_boxing.py (conversions and
their byte costs), shard_plan.py (the planner), shard_exec.py (per-device programs
and running them), shard_print.py (the printed plan), primitives/collectives.py.

Eager global arrays (`fflow.to_global`) run op by op through the same rules.
"""

import functools
import inspect

import numpy as np
from fflow.primitives.sbp_constraint import dual, sbp_constraint_p, shift, tracing
from fflow.primitives.shard_move import shard_move_p
from fflow.transforms import vmap as vmap_mod
from fflow.transforms.autodiff import (
    Zero,
    backward_pass,
    instantiate,
    is_undefined,
    jvp_flat,
    jvp_rules,
    tangent_aval,
    transpose_rules,
)
from fflow.transforms.program_transforms import close
from fflow.transforms.program_transforms import partial_eval_program as pe_program
from fflow.transforms.remat import checkpoint_p
from fflow.transforms.shard_exec import ShardedProgram
from fflow.transforms.shard_fsdp import gather_per_use
from fflow.transforms.shard_memory import fit_budget
from fflow.transforms.shard_plan import gc_paused
from fflow.transforms.shard_rules import freeze
from fflow.transforms.shard_unroll import has_unrollable, unroll_scans
from fflow.transforms.staging import (
    StagingTracer,
    direct_runners,
    eval_program,
    partial_eval_rules,
    trace_to_program,
)
from fflow.transforms.vmap import vmap

from fflow import array as array_mod
from fflow import core
from fflow import lax_ops as lax
from fflow import sharding as sharding_mod
from fflow.api_util import Store, as_value, flatten_fun
from fflow.core import Eqn, Literal, Primitive, Program, ShapedArray, Var, set_current_trace
from fflow.errors import check_keywords, filtered_traceback, user_error
from fflow.sharding import (
    B,
    SbpParallel,
    Sharding,
    Split,
    as_nd_sbp,
    check_sbp_fits,
    is_global,
    make_global,
    placement,
    program_cutters,
    runtime,
    to_global,
)
from fflow.tree_util import (
    LEAF,
    keystr,
    prefix_broadcast,
    tree_flatten,
    tree_flatten_with_path,
    tree_unflatten,
)

# ----------------------------------------------------------------------------
# with_sbp: an identity with an SBP constraint


def with_sbp(x, sbp, placement=None):  # noqa: A002  (OneFlow's name)
    """Constrain the SBP of `x` inside a sharded function (as JAX's sharding constraints).

    With `placement` (another placement than the sharded function's), inside
    `shard` the value moves there by point-to-point sends and what uses it runs
    there: one sharded program over several placements (transforms/shard_mixed.py).
    Outside `shard`, a global array is boxed to `sbp` right away (moved onto
    `placement` if one is given) and a local array is returned unchanged (or placed
    on `placement`).

    Example:
        >>> import fflow, fflow.numpy as jnp
        >>> pl = fflow.placement("cpu", [0, 1])
        >>> f = fflow.shard(lambda x: fflow.with_sbp(x * 2, fflow.sbp.split(0)), pl)
        >>> f(jnp.arange(4.0)).sbp
        (S(0),)
        >>> y = fflow.with_sbp(f(jnp.arange(4.0)), fflow.sbp.broadcast, fflow.placement("cpu", [2]))
        >>> y.placement.ranks, y.tolist()
        ((2,), [0.0, 2.0, 4.0, 6.0])
        >>> on3 = fflow.placement("cpu", [3])  # one program, two placements:
        >>> g = fflow.shard(lambda x: fflow.with_sbp(x * 2, fflow.sbp.broadcast, on3).sum(), pl)
        >>> z = g(jnp.arange(4.0))
        >>> z.placement.ranks, float(z)
        ((3,), 12.0)
    """
    if tracing.stack:
        pl = tracing.stack[-1]
        if placement is not None and placement != pl:
            # a move to another placement: shard cuts the program there (shard_mixed.py)
            nd = as_nd_sbp(sbp, placement.ndim, "with_sbp")
            shape = np.shape(x) if not hasattr(x, "shape") else x.shape
            check_sbp_fits(shape, nd, placement.hierarchy, "with_sbp")
            return shard_move_p.bind(x, dst=placement, sbp=nd)
        nd = as_nd_sbp(sbp, pl.ndim, "with_sbp")
        check_sbp_fits(
            np.shape(x) if not hasattr(x, "shape") else x.shape, nd, pl.hierarchy, "with_sbp"
        )
        return sbp_constraint_p.bind(x, sbp=nd)
    if placement is not None and not isinstance(x, core.Tracer):
        return to_global(x, placement, sbp)
    if is_global(x):
        return to_global(x, sbp=sbp)
    return x


# ----------------------------------------------------------------------------
# shard_call: one sharded program as one equation

shard_call_p = Primitive("shard_call", multiple_results=True)
shard_call_p.amp_class = "keep"  # its program is planned for these input dtypes
shard_call_p.traits.add("sharded_call")  # shard_exec inlines a nested call on its placement


@shard_call_p.def_abstract_eval
def _shard_call_abstract_eval(*avals, sharded):
    return [v.aval for v in sharded.program.outvars]


@shard_call_p.def_impl
def _shard_call_impl(*args, sharded):
    # Reached with local NumPy values (e.g. from a jitted program): run and assemble.
    return sharded.run_values(args)


def _run_call(sp, args):
    pl = sp.placement
    ready = []
    for a, s, v in zip(args, sp.in_sbps, sp.program.invars):
        if is_global(a):
            sh = a._sharding
            if sh.sbp == s and (sh.placement is pl or sh.placement == pl):
                ready.append(a)  # already where and how the program takes it
                continue
            # on another placement (reached through jit, which traced no source): moves
            # here by point-to-point boxing; `shard` called directly plans the move
            ready.append(to_global(a, sbp=s) if a.placement == pl else to_global(a, pl, s))
        else:
            a = as_value(a)
            if a.dtype != v.aval.dtype:
                a = array_mod.Array(np.asarray(a, v.aval.dtype))
            ready.append(to_global(a, pl, s))
    return sp.run_global(ready)


def bind_call(sp, args):
    """Bind shard_call; at the root trace run directly so the results stay global arrays."""
    if core.current_trace() is array_mod.root_trace:
        return _run_call(sp, list(args))
    return shard_call_p.bind(*args, sharded=sp)


class Sharded:
    """A sharded function: call it, or inspect its plan with `.plan(*args)`."""

    def __init__(
        self, fun, pl, in_sbp=None, out_sbp=None, profile=None, memory_limit=None, keep=False
    ):
        functools.update_wrapper(self, fun)
        if not isinstance(pl, placement):
            raise user_error(TypeError, f"shard needs a fflow.placement, got {pl!r}")
        self.fun = fun
        self.placement = pl
        self.in_sbp = in_sbp
        self.out_sbp = out_sbp
        self.plan_options = {}
        if profile is not None:
            self.plan_options["profile"] = profile
        self.memory_limit = memory_limit
        self.keep_in_sbp = keep
        self.cache = {}
        self.fast = {}  # cheap call key -> (sharded program, output tree, captured arrays)
        # the last direct hit: ((sharding, shape, dtype) per positional global array,
        # its `fast` entry); a call whose arrays have these very sharding and dtype
        # objects and equal shapes is that entry (no key tuple, no hashing)
        self._last = None
        self.captured = {}  # cache key -> global arrays `fun` closes over, as traced
        self.trace_count = 0

    def _in_sbps(self, args, leaves, free=None):
        """The input SBPs; `free` (a list) gets, per leaf, its positional argument where
        neither the user nor a global array fixed its SBP, else None."""
        pl = self.placement
        specs = _sbp_prefix(self.in_sbp, tuple(args), pl.ndim, "in_sbp")
        arg_of = [a for a, x in enumerate(args) for _ in tree_flatten(x)[0]]
        out = []
        for k, (spec, x) in enumerate(zip(specs, leaves)):
            fixed = spec is not None
            if spec is None:
                if is_global(x) and x.placement == pl:
                    spec = x.sbp
                    fixed = True
                elif _fits_mesh(_global_of(x), pl):
                    spec = _global_of(x).sbp  # on another placement: moves here as it is
                else:
                    spec = (B,) * pl.ndim
            if free is not None:
                free.append(None if fixed else arg_of[k])
            aval = core.aval_of_value(x)
            check_sbp_fits(aval.shape, spec, pl.hierarchy, "in_sbp")
            out.append(tuple(spec))
        return out

    def _kept(self, args, free):
        """Per input leaf: its name where keep_in_sbp holds it to its annotated SBP (the
        user's in_sbp, or a global array's own SBP), else None."""
        if self.keep_in_sbp is False:
            return [None] * len(free)
        try:
            flags = prefix_broadcast(self.keep_in_sbp, tuple(args), "keep_in_sbp")
        except ValueError as e:
            raise user_error(ValueError, f"{e}. Fix: True, False, or one per argument.") from None
        try:
            names = list(inspect.signature(self.fun).parameters)
        except (TypeError, ValueError):  # (a builtin or a callable without a signature)
            names = []
        out = []
        for flag, fr, (path, _) in zip(flags, free, tree_flatten_with_path(tuple(args))[0]):
            a = path[0].idx
            name = names[a] if a < len(names) else f"argument {a}"
            out.append(name + keystr(path[1:]) if flag and fr is None else None)
        return out

    def lower(self, *args):
        """The ShardedProgram (global program + plan) for these arguments."""
        return self._entry(args)[0]

    plan = lower

    def _entry(self, args):
        with gc_paused():  # (tracing and planning: see shard_plan.py)
            return self._traced(args)

    def _traced(self, args):
        leaves, in_tree = tree_flatten((tuple(args), {}))
        leaves = [x if is_global(x) else as_value(x) for x in leaves]
        free = []
        in_sbps = self._in_sbps(args, leaves, free)
        kept = self._kept(args, free)
        avals = [core.aval_of_value(x).strip_weak_type() for x in leaves]
        elsewhere = _sources(leaves)  # global inputs on other placements
        key = (in_tree, tuple(avals), tuple(in_sbps), elsewhere, tuple(kept))
        entry = self.cache.get(key)
        if entry is not None:
            sp, out_tree = entry
            return sp, out_tree, self.captured.get(key, []) + leaves
        store = Store()
        flat = flatten_fun(self.fun, in_tree, store)
        tracing.stack.append(self.placement)
        try:
            # the current trace is the parent: values of outer transforms that `f` closes
            # over become constants here, and are lifted to inputs below
            program = trace_to_program(flat, avals)
        finally:
            tracing.stack.pop()
        self.trace_count += 1
        out_tree = store.value
        program, lifted, lifted_sbps = _lift_closed_over(program, self.placement)
        if has_unrollable(program):
            with set_current_trace(array_mod.root_trace):
                program = unroll_scans(program)
        out_specs = _out_specs(self.out_sbp, out_tree, program, self.placement)

        def make(ins, outs, per_use=(), memory_weight=0.0, **search):
            k = len(lifted_sbps)  # (input leaves come after the lifted values)
            prog = gather_per_use(program, {k + i: ins[i] for i in per_use})
            opts = dict(self.plan_options, **search)  # (fit_budget's search options)
            if memory_weight:  # (fit_budget: the time-optimal plan did not fit)
                opts = dict(opts, memory_weight=memory_weight)
            if any(kept):
                opts = dict(opts, keep=(None,) * k + tuple(kept))
            return ShardedProgram(prog, self.placement, lifted_sbps + ins, outs, plan_options=opts)

        sources = _sources(lifted) + elsewhere
        if any(s is not None and s[0] != self.placement for s in sources) or any(
            e.primitive is shard_move_p for e in program.eqns
        ):
            # several placements: one planned segment per placement
            for opt, given in (("memory_limit", self.memory_limit), ("keep_in_sbp", any(kept))):
                if given is not None and given is not False:
                    raise user_error(
                        ValueError,
                        f"{opt} is not supported for a sharded function that moves values "
                        f"to other placements (with_sbp(..., placement=)). Fix: drop {opt}, "
                        "or shard each placement's part on its own with it.",
                    )
            # inputs whose SBP no one fixed: the cutter picks the one their move costs least
            unfixed = [False] * len(lifted_sbps) + [f is not None for f in free]
            sp = program_cutters[0](
                program, self.placement, lifted_sbps + in_sbps, out_specs, self.plan_options,
                sources, unfixed,
            )  # fmt: skip
        elif self.memory_limit is None:
            sp = make(in_sbps, out_specs)
        else:
            sp = fit_budget(
                make, _split_state, in_sbps, out_specs, avals, [v.aval for v in program.outvars],
                [s is None for s in out_specs], free, self.memory_limit, self.placement,
                program,
            )  # fmt: skip
        if any(isinstance(c, core.Tracer) for c in lifted):
            # values of other traces closed over by `f`: passed as inputs, and traced
            # again next call since they change from call to call
            return sp, out_tree, lifted + leaves
        # closed-over global arrays are captured when `f` is traced (as jit captures
        # closed-over arrays), so later calls reuse the program without retracing
        self.cache[key] = (sp, out_tree)
        if lifted:
            self.captured[key] = list(lifted)
        return sp, out_tree, list(lifted) + leaves

    def _fast_key(self, args):
        """(leaves, key) of a call at the root trace whose leaves are all arrays or
        numbers: a key from types, shapes, dtypes and global arrays' shardings only (no
        as_value copies, no SBP prefix walk); None where the full path is needed."""
        if core.current_trace() is not array_mod.root_trace:
            return None
        array_t = array_mod.Array
        parts = [len(args)]  # positional arrays: no pytree flattening
        for x in args:
            t = type(x)
            if t is array_t:
                v = x._value
                parts.append((x._sharding, v.shape, v.dtype))
            elif t is np.ndarray:
                parts.append((t, x.shape, x.dtype))
            else:
                break
        else:
            return list(args), tuple(parts)
        leaves, in_tree = tree_flatten(args)
        parts = [in_tree]
        for x in leaves:
            t = type(x)
            if t is array_mod.Array:
                v = x._value
                sh = x._sharding
                parts.append((sh, v.shape, v.dtype) if sh is not None else (v.shape, v.dtype))
            elif t is np.ndarray:
                parts.append((t, x.shape, x.dtype))
            elif t in (float, int, bool):
                parts.append(t)
            else:
                return None
        return leaves, tuple(parts)

    def _fast_call(self, args):
        """A cache hit at the root trace without the full entry: NumPy inputs are used
        in place (no defensive copy: an output that would alias one is copied)."""
        got = self._fast_key(args)
        if got is None:
            return None
        leaves, key = got
        try:
            hit = self.fast.get(key)
        except TypeError:  # an unhashable sharding or shape
            return None
        if hit is None:
            sp, out_tree, all_leaves = self._entry(args)
            n_cap = len(all_leaves) - len(leaves)
            if getattr(sp, "is_mixed", False) or any(
                isinstance(c, core.Tracer) for c in all_leaves[:n_cap]
            ):
                return _finish(sp, out_tree, all_leaves)
            captured = all_leaves[:n_cap]
            # global inputs already on the program's placement and SBPs (the key holds
            # their shardings, so every later hit has them too): passed as they are
            wants = [Sharding(sp.placement, s) for s in sp.in_sbps[n_cap:]]
            direct = all(
                type(a) is array_mod.Array and a._sharding == w for a, w in zip(leaves, wants)
            )
            hit = self.fast[key] = (sp, out_tree, captured, direct)
        sp, out_tree, captured, direct = hit
        if direct:
            outs = sp.run_global(captured + leaves if captured else leaves)
            return (outs[0],) if out_tree is LEAF else (tree_unflatten(out_tree, outs),)
        pl = sp.placement
        rt = runtime()
        borrowed = []
        ready = list(captured)
        for a, s, v in zip(leaves, sp.in_sbps[len(captured) :], sp.program.invars[len(captured) :]):
            t = type(a)
            if t is array_mod.Array and a._sharding is not None:
                if a._sharding.placement != pl:
                    return _finish(*self._entry(args))  # raises the placement error
                ready.append(a if a._sharding.sbp == s else to_global(a, sbp=s))
                continue
            weak = False
            if t is np.ndarray:
                a = np.asarray(a, v.aval.dtype)
                borrowed.append(a)
            else:
                a = as_value(a)
                weak = a._weak and a.dtype == v.aval.dtype
                a = np.asarray(a._value if type(a._value) is np.ndarray else a, v.aval.dtype)
            # the key fixed the shape, checked against `s` when the entry was made
            ready.append(make_global(a.shape, a.dtype, pl, s, rt.scatter(a, s, pl), weak))
        outs = sp.run_global(ready)
        if borrowed:
            _unalias(outs, borrowed)
        if out_tree is LEAF:
            return (outs[0],)
        return (tree_unflatten(out_tree, outs),)

    def __call__(self, *args):
        __tracebackhide__ = True  # noqa: F841  (pytest and IPython hide this frame)
        try:  # (api_boundary inlined: one frame less on the hottest path)
            last = self._last
            if last is not None and core._state.trace is array_mod.root_trace:
                # the hottest case first: the same shardings as the last direct hit
                checks = last[0]
                if len(args) != len(checks):
                    same = False
                elif len(checks) == 1:  # (one array written out: a quarter of the loop)
                    x, (sh, shape, dtype) = args[0], checks[0]
                    same = (
                        type(x) is array_mod.Array
                        and x._sharding is sh
                        and x._value.dtype is dtype
                        and x._value.shape == shape
                    )
                else:
                    same = _same_as_last(args, checks)
                if same:
                    sp, out_tree, captured, _ = last[1]
                    fast = sp._fast  # (runtime, its one-collective runner) or None
                    outs = None
                    if fast is not None and not captured and fast[0] is sharding_mod._runtime:
                        outs = fast[1](args)  # None: the general path this time
                    if outs is None:
                        outs = sp.run_global(captured + list(args) if captured else args)
                    return outs[0] if out_tree is LEAF else tree_unflatten(out_tree, outs)
            return self._call(args)
        except Exception as e:
            tb = filtered_traceback(e)
            if tb is None:
                raise
            raise e.with_traceback(tb)  # noqa: B904  (the same exception, fewer frames)

    def _call(self, args):
        if core._state.trace is array_mod.root_trace:
            # positional global arrays already in place
            key = [len(args)]
            for x in args:
                if type(x) is not array_mod.Array or x._sharding is None:
                    break
                v = x._value
                key.append((x._sharding, v.shape, v.dtype))
            else:
                hit = self.fast.get(tuple(key))
                if hit is not None and hit[3]:
                    self._last = (key[1:], hit)
                    sp, out_tree, captured, _ = hit
                    outs = sp.run_global(captured + list(args) if captured else args)
                    return outs[0] if out_tree is LEAF else tree_unflatten(out_tree, outs)
        out = self._fast_call(args)
        if out is not None:
            return out[0]
        return _finish(*self._entry(args))[0]


def _same_as_last(args, checks):
    """Whether positional `args` are global Arrays with the very sharding and dtype
    objects, and equal shapes, of `checks` (a sharded call's last direct hit)."""
    for x, (sh, shape, dtype) in zip(args, checks):
        if type(x) is not array_mod.Array or x._sharding is not sh:
            return False
        v = x._value
        if v.dtype is not dtype or v.shape != shape:
            return False
    return True


def _finish(sp, out_tree, leaves):
    """Run a sharded call from its entry; (the output pytree,), so a None output is not
    taken for "no fast path"."""
    if getattr(sp, "is_mixed", False):
        outs = sp.run(leaves)
    else:
        outs = bind_call(sp, leaves)
    return (tree_unflatten(out_tree, list(outs)),)


def _unalias(outs, borrowed):
    """Copy output shards that share memory with a caller's NumPy input (used in place,
    so a later write to it must not show through the result)."""
    for o in outs:
        shards = o._value.shards
        for i, v in shards.items():
            if any(np.may_share_memory(v, b) for b in borrowed):
                shards[i] = v.copy()


def _global_of(x):
    """The global array under `x` (through JVP tracers' primals), or None."""
    while isinstance(x, core.Tracer) and hasattr(x, "primal"):
        x = x.primal
    return x if is_global(x) else None


def _fits_mesh(x, pl):
    if x is None or len(x.sbp) != pl.ndim:
        return False
    try:
        check_sbp_fits(x.shape, x.sbp, pl.hierarchy, "in_sbp")
    except Exception:  # noqa: BLE001  (a split the other mesh cannot take)
        return False
    return True


def _sources(values):
    """Per value: (placement, sbp) of a global array, else None; a sharded program over
    several placements moves those to where they are used (transforms/shard_mixed.py)."""
    gs = [_global_of(x) for x in values]
    return tuple(None if g is None else (g.placement, tuple(g.sbp)) for g in gs)


def _split_state(shape, hierarchy):
    """How state is stored split under a memory budget: over every mesh axis, so a
    device holds 1/p of it (ZeRO / FSDP over the whole mesh). The first dim the whole
    mesh divides evenly is split by every axis (a nested split: one all-gather or
    reduce-scatter over all devices moves it); else each axis splits the first dim it
    divides evenly that no earlier axis split, and an axis that divides none keeps it
    whole (None if no axis splits it)."""
    p = int(np.prod(hierarchy))
    for d, n in enumerate(shape):
        if n >= p and n % p == 0:
            return (Split(d),) * len(hierarchy)
    nd = []
    for h in hierarchy:
        used = {s.axis for s in nd if s != B}
        d = next((d for d, n in enumerate(shape) if d not in used and n >= h and n % h == 0), None)
        nd.append(B if d is None else Split(d))
    return tuple(nd) if any(s != B for s in nd) else None


def _lift_closed_over(program, pl):
    """Turn constants that are tracers of outer transforms or global arrays into inputs."""
    keep_vars, keep_vals, lift_vars, lift_vals, lift_sbps = [], [], [], [], []
    for v, c in zip(program.constvars, program.consts):
        if isinstance(c, core.Tracer) or is_global(c):
            lift_vars.append(v)
            lift_vals.append(c)
            same = is_global(c) and c.placement == pl
            lift_sbps.append(tuple(c.sbp) if same else (B,) * pl.ndim)
        else:
            keep_vars.append(v)
            keep_vals.append(c)
    if not lift_vars:
        return program, [], []
    program = Program(
        lift_vars + program.invars, keep_vars, program.eqns, program.outvars, keep_vals
    )
    return program, lift_vals, lift_sbps


@check_keywords
def shard(
    f, placement, in_sbp=None, out_sbp=None, *, profile=None, memory_limit=None, keep_in_sbp=False
):  # noqa: A002
    """Run `f` SPMD on `placement` with SBP-annotated inputs and outputs.

    Args:
        f: a function of arrays (pytrees allowed).
        placement: a `fflow.placement`.
        in_sbp: SBP of the inputs: one SBP for all, or a pytree prefix of the arguments
            (a tuple with one entry per positional argument). On an N-D mesh each entry
            is a tuple with one SBP per mesh axis. None (default) keeps a global array's
            SBP and broadcasts local arrays.
        out_sbp: SBP of the outputs (same forms). None lets the planner choose, finishing
            partial values to broadcast.
        profile: the `fflow.sharding.DeviceProfile` the planner prices plans with
            (default: `default_profile(placement)`).
        memory_limit: bytes of memory per device the plan must fit in (peak of
            parameters, optimizer state and live activations). Unannotated state is
            stored as needed: as given (data parallelism), the last argument split (the
            optimizer state: ZeRO-1/2), the one before it too (the parameters), and
            last the parameters gathered per use (FSDP / ZeRO-3: all-gathered before
            each forward and backward use, freed after); the first that fits wins
            (in the cost model, also the fastest that fits). "Split" is over every
            mesh axis (on a 2x2 mesh a device holds a quarter). `.plan(...)` then has
            `peak_memory`, `storage_rung` and `gathered_per_use`.
        keep_in_sbp: True (every annotated input), or a pytree prefix of the arguments
            with a bool per argument: the annotated SBP of those inputs (from `in_sbp`,
            or a global array's own) is their binding layout, as JAX's in_shardings /
            OneFlow's global tensor SBP: every operation reads them as they are stored,
            never converted (no all-gather of a split weight), and under `grad` their
            gradient comes back in the same SBP (a broadcast weight's gradient is
            all-reduced). With Megatron-annotated weights this gives Megatron's plan.
            Default False: annotations are where inputs start, and the planner may move
            them when that is faster. A program that cannot read a kept input in its
            SBP raises, naming the line and the SBPs it can read it in.

    Returns:
        A callable returning global arrays; `.plan(*args)` shows the planned program.

    Example:
        >>> import fflow, fflow.numpy as jnp
        >>> pl = fflow.placement("cpu", [0, 1])
        >>> S, B = fflow.sbp.split, fflow.sbp.broadcast
        >>> f = fflow.shard(lambda x, w: jnp.tanh(x @ w), pl, in_sbp=(S(0), B))
        >>> y = f(jnp.ones((4, 3)), jnp.ones((3, 2)))
        >>> y.sbp, y.shape
        ((S(0),), (4, 2))
        >>> x, w = jnp.ones((4, 3)), jnp.ones((3, 2))
        >>> fflow.shard(lambda x, w: x @ w, pl, (B, S(0))).plan(x, w).collectives()
        ['all_to_all']
        >>> g = fflow.shard(lambda x, w: x @ w, pl, (B, S(0)), keep_in_sbp=(False, True))
        >>> g.plan(x, w).collectives()  # w read as stored: x sliced, the sum all-reduced
        ['shard_slice', 'all_reduce']
    """
    return Sharded(f, placement, in_sbp, out_sbp, profile, memory_limit, keep_in_sbp)


class _ND:
    """An N-D SBP as one pytree leaf."""

    __slots__ = ("sbp",)

    def __init__(self, sbp):
        self.sbp = sbp


def _wrap_nd(spec, ndim):
    if isinstance(spec, SbpParallel) or spec is None:
        return spec
    if (
        isinstance(spec, (tuple, list))
        and len(spec) == ndim
        and all(isinstance(s, SbpParallel) for s in spec)
    ):
        return _ND(tuple(spec))
    if type(spec) in (tuple, list):
        return type(spec)(_wrap_nd(s, ndim) for s in spec)
    if isinstance(spec, dict):
        return {k: _wrap_nd(v, ndim) for k, v in spec.items()}
    children, treedef = tree_flatten(spec, is_leaf=lambda s: s is not spec)
    if treedef.kind != "leaf":
        # namedtuples, dataclasses and registered nodes (optimizer states, fflow.nn modules)
        return tree_unflatten(treedef, [_wrap_nd(s, ndim) for s in children])
    raise user_error(TypeError, f"not an SBP spec: {spec!r}")


def _sbp_prefix(spec, tree, ndim, what):
    if type(spec) in (tuple, list) and type(tree) is tuple and len(spec) != len(tree):
        one_nd = ndim > 1 and len(spec) == ndim and all(isinstance(s, SbpParallel) for s in spec)
        if not one_nd:  # (S(0),) for two arguments is not one SBP for both
            raise user_error(
                ValueError,
                f"{what} has {len(spec)} entr{'y' if len(spec) == 1 else 'ies'} for "
                f"{len(tree)} argument{'s' if len(tree) != 1 else ''}. Fix: one SBP per "
                f"argument, e.g. {what}=({', '.join(['S(0)'] * len(tree))}), or a single "
                f"SBP (not in a tuple) for all of them.",
            )
    try:
        leaves = prefix_broadcast(_wrap_nd(spec, ndim), tree, what)
    except ValueError as e:
        raise user_error(ValueError, f"{what}: {e}") from None
    out = []
    for s in leaves:
        if s is None:
            out.append(None)
        elif isinstance(s, _ND):
            out.append(as_nd_sbp(s.sbp, ndim, what))
        else:
            out.append(as_nd_sbp(s, ndim, what))
    return out


def _out_specs(out_sbp, out_tree, program, pl):
    dummy = tree_unflatten(out_tree, [0] * len(program.outvars))
    specs = _sbp_prefix(out_sbp, dummy, pl.ndim, "out_sbp")
    for s, v in zip(specs, program.outvars):
        if s is not None:
            check_sbp_fits(v.aval.shape, s, pl.hierarchy, "out_sbp")
    return specs


# ----------------------------------------------------------------------------
# Autodiff of shard_call: JVP, partial evaluation (for linearize) and transpose


def _retrace(fun, avals):
    with set_current_trace(array_mod.root_trace):
        return trace_to_program(fun, avals)


def _shard_call_jvp(primals, tangents, *, sharded):
    sp = sharded
    prog = sp.program
    nz = [type(t) is not Zero for t in tangents]
    n = len(primals)

    def jvp_fun(*args):
        ps = list(args[:n])
        it = iter(args[n:])
        ts = [next(it) if z else Zero(tangent_aval(v.aval)) for z, v in zip(nz, prog.invars)]
        outs, touts = jvp_flat(lambda *xs: eval_program(prog, prog.consts, xs), ps, ts)
        return list(outs) + [instantiate(t) for t in touts]

    key = ("jvp", tuple(nz))
    new = sp.derived.get(key) if hasattr(sp, "derived") else None
    if new is None:
        avals = [v.aval for v in prog.invars]
        avals += [tangent_aval(v.aval) for z, v in zip(nz, prog.invars) if z]
        jprog = _retrace(jvp_fun, avals)
        in_sbps = sp.in_sbps + [s for z, s in zip(nz, sp.in_sbps) if z]
        out_sbps = list(sp.out_sbps) + list(sp.out_sbps)
        kept = _kept_of(sp)  # a kept input's tangent is kept too
        opts = _opts(sp, kept + [k for z, k in zip(nz, kept) if z])
        new = ShardedProgram(jprog, sp.placement, in_sbps, out_sbps, name="jvp", plan_options=opts)
        _derived(sp)[key] = new
    outs = bind_call(new, [*primals, *[t for t in tangents if type(t) is not Zero]])
    m = len(prog.outvars)
    return outs[:m], outs[m:]


def _kept_of(sp):
    """Per input of `sp`: its name where keep_in_sbp holds it to its SBP, else None."""
    return list(sp.plan_options.get("keep") or [None] * len(sp.in_sbps))


def _opts(sp, kept):
    """Planner options of a program derived from `sp` whose inputs are kept as `kept`."""
    opts = {k: v for k, v in sp.plan_options.items() if k != "keep"}
    if any(k is not None for k in kept):
        opts["keep"] = tuple(kept)
    return opts


def _derived(sp):
    if not hasattr(sp, "derived"):
        sp.derived = {}
    return sp.derived


jvp_rules[shard_call_p] = _shard_call_jvp


def partial_eval_program(prog, known):
    """Split `prog` into a known part and an unknown part given which inputs are known.

    Returns (known_prog, unknown_prog, out_unknown, residual_vars): known_prog maps
    known inputs to (known outputs + residuals); unknown_prog maps (residuals +
    unknown inputs) to the unknown outputs.
    """
    unknown = {v for v, k in zip(prog.invars, known) if not k}
    k_eqns, u_eqns = [], []
    for eqn in prog.eqns:
        if any(type(v) is not Literal and v in unknown for v in eqn.inputs):
            u_eqns.append(eqn)
            unknown.update(eqn.outputs)
        else:
            k_eqns.append(eqn)
    res, seen = [], set()
    for eqn in u_eqns:
        for v in eqn.inputs:
            if type(v) is not Literal and v not in unknown and v not in seen:
                seen.add(v)
                res.append(v)
    out_unknown = [type(v) is not Literal and v in unknown for v in prog.outvars]
    k_out = [v for v, u in zip(prog.outvars, out_unknown) if not u]
    known_prog = Program(
        [v for v, k in zip(prog.invars, known) if k],
        prog.constvars,
        k_eqns,
        k_out + res,
        prog.consts,
    )
    unknown_prog = Program(
        res + [v for v, k in zip(prog.invars, known) if not k],
        [],
        u_eqns,
        [v for v, u in zip(prog.outvars, out_unknown) if u],
    )
    return known_prog, unknown_prog, out_unknown, res


def _shard_call_partial_eval(trace, args, params):
    sp = params["sharded"]
    known = [not (isinstance(a, StagingTracer) and a._trace is trace) for a in args]
    key = ("pe", tuple(known))
    hit = _derived(sp).get(key)
    if hit is None and any(e.primitive is checkpoint_p for e in sp.program.eqns):
        hit = _split_with_remat(sp, known)
        _derived(sp)[key] = hit
    if hit is None:
        # split the inlined program: a custom_jvp call mixing known and unknown inputs
        # would otherwise be staged whole, primal outputs included
        kprog, uprog, out_unknown, res = partial_eval_program(sp.exec_program, known)
        res_sbps = [sp.plan.var_sbp[v] for v in res]
        k_outs = [s for s, u in zip(sp.out_sbps, out_unknown) if not u]
        kept = _kept_of(sp)
        ksp = ShardedProgram(
            kprog,
            sp.placement,
            [s for s, k in zip(sp.in_sbps, known) if k],
            k_outs + res_sbps,
            allow_partial_out=True,
            name="known",
            plan_options=_opts(sp, [n for n, k in zip(kept, known) if k]),
        )
        # a kept input passed on as a residual (a weight the backward reads) stays kept
        by_var = dict(zip(sp.exec_program.invars, kept))
        kept_res = [by_var.get(v) for v in res]
        usp = ShardedProgram(
            uprog,
            sp.placement,
            res_sbps + [s for s, k in zip(sp.in_sbps, known) if not k],
            [s for s, u in zip(sp.out_sbps, out_unknown) if u],
            name="linear",
            plan_options=_opts(sp, kept_res + [n for n, k in zip(kept, known) if not k]),
        )
        hit = (ksp, usp, out_unknown, len(res))
        _derived(sp)[key] = hit
    ksp, usp, out_unknown, n_res, known_consts = hit + ((),) * (5 - len(hit))
    known_args = list(known_consts) + [a for a, k in zip(args, known) if k]
    with set_current_trace(trace.parent):
        kouts = bind_call(ksp, known_args)
    kouts = list(kouts)
    n_known_out = len(kouts) - n_res
    res_vals = kouts[n_known_out:]
    unknown_args = [a for a, k in zip(args, known) if not k]
    u_avals = [v.aval for v in usp.program.outvars]
    uouts = trace.stage(shard_call_p, res_vals + unknown_args, dict(sharded=usp), u_avals)
    k_it, u_it = iter(kouts[:n_known_out]), iter(uouts)
    return [next(u_it) if u else next(k_it) for u in out_unknown]


def _split_with_remat(sp, known):
    """Partial evaluation through the transforms' own rules, so a `checkpoint` inside
    the sharded function saves only its inputs and the linear program recomputes the
    rest (the inlined split above would save every intermediate)."""
    closed, consts = close(sp.program)
    unknowns = [False] * len(consts) + [not k for k in known]
    split = pe_program(closed, unknowns, instantiate=False)
    bcast = (B,) * sp.placement.ndim
    out_unknown = split.out_unknowns
    n_res = len(split.residuals)
    known_in = [bcast] * (len(split.known_consts) + len(consts))
    n_consts = len(known_in)
    known_in += [s for s, k in zip(sp.in_sbps, known) if k]
    k_outs = [s for s, u in zip(sp.out_sbps, out_unknown) if not u]
    kept = _kept_of(sp)
    kept_known = [n for n, k in zip(kept, known) if k]
    sbp_known = [s for s, k in zip(sp.in_sbps, known) if k]
    # a kept input passed on as a residual (a weight the recomputation reads) stays kept,
    # in its own SBP: else the linear program and its transpose may gather it
    res_kept, res_out = [], []
    for kind, i in split.res_kinds:
        j = i - len(consts) if kind == "input" else -1
        name = kept_known[j] if j >= 0 else None
        res_kept.append(name)
        res_out.append(sbp_known[j] if name is not None else None)
    ksp = ShardedProgram(
        split.known, sp.placement, known_in, k_outs + res_out,
        allow_partial_out=True, name="known",
        plan_options=_opts(sp, [None] * n_consts + kept_known),
    )  # fmt: skip
    res_sbps = ksp.out_sbps[len(k_outs) :]
    usp = ShardedProgram(
        split.unknown, sp.placement,
        list(res_sbps) + [s for s, k in zip(sp.in_sbps, known) if not k],
        [s for s, u in zip(sp.out_sbps, out_unknown) if u],
        name="linear",
        plan_options=_opts(sp, res_kept + [n for n, k in zip(kept, known) if not k]),
    )  # fmt: skip
    return (ksp, usp, out_unknown, n_res, list(split.known_consts) + list(consts))


partial_eval_rules[shard_call_p] = _shard_call_partial_eval


def _shard_call_transpose(cts, *args, sharded):
    sp = sharded
    prog = sp.program
    lin = [is_undefined(a) for a in args]
    ct_nz = [type(c) is not Zero and c is not None for c in cts]
    key = ("T", tuple(lin), tuple(ct_nz))
    tsp = _derived(sp).get(key)
    res_vars = [v for v, li in zip(prog.invars, lin) if not li]
    lin_vars = [v for v, li in zip(prog.invars, lin) if li]
    if tsp is None:

        def tfun(*xs):
            res = list(xs[: len(res_vars)])
            it = iter(xs[len(res_vars) :])
            p2 = Program(
                lin_vars,
                list(prog.constvars) + res_vars,
                prog.eqns,
                prog.outvars,
                list(prog.consts) + res,
            )
            ct_in = [next(it) if z else Zero(v.aval) for z, v in zip(ct_nz, prog.outvars)]
            return [instantiate(c) for c in backward_pass(p2, ct_in)]

        avals = [v.aval for v in res_vars] + [v.aval for z, v in zip(ct_nz, prog.outvars) if z]
        tprog = _retrace(tfun, avals)
        in_sbps = [s for s, li in zip(sp.in_sbps, lin) if not li]
        in_sbps += [dual(s) for s, z in zip(sp.out_sbps, ct_nz) if z]
        kept = _kept_of(sp)
        # a kept input's gradient comes back in its own SBP (B: all-reduced)
        out_sbps = [s if n else dual(s) for s, n, li in zip(sp.in_sbps, kept, lin) if li]
        t_kept = [n for n, li in zip(kept, lin) if not li] + [None] * sum(ct_nz)
        tsp = ShardedProgram(
            tprog, sp.placement, in_sbps, out_sbps, name="transpose",
            plan_options=_opts(sp, t_kept),
        )  # fmt: skip
        _derived(sp)[key] = tsp
    res_vals = [a for a, li in zip(args, lin) if not li]
    outs = bind_call(tsp, [*res_vals, *[c for c, z in zip(cts, ct_nz) if z]])
    it = iter(outs)
    return [next(it) if li else None for li in lin]


transpose_rules[shard_call_p] = _shard_call_transpose


# ----------------------------------------------------------------------------
# vmap of shard_call: batch the global program, shift split axes past the batch dim


def _shard_call_batch(args, dims, *, sharded):
    sp = sharded
    prog = sp.program
    moved = []
    for a, d in zip(args, dims):
        if d is not None and d != 0:
            perm = (d,) + tuple(
                i for i in range(np.ndim(a) if not hasattr(a, "ndim") else a.ndim) if i != d
            )
            a = lax.transpose(a, perm)
        moved.append(a)
    mapped = [d is not None for d in dims]
    size = next(core.aval_of_value(a).shape[0] for a, m in zip(moved, mapped) if m)
    key = ("vmap", tuple(mapped), size)
    bsp = _derived(sp).get(key)
    if bsp is None:
        f = vmap(
            lambda *xs: eval_program(prog, prog.consts, xs),
            in_axes=tuple(0 if m else None for m in mapped),
            out_axes=0,
        )
        avals = [
            ShapedArray((size,) + v.aval.shape, v.aval.dtype) if m else v.aval
            for v, m in zip(prog.invars, mapped)
        ]
        bprog = _retrace(lambda *xs: list(f(*xs)), avals)
        in_sbps = [shift(s) if m else s for s, m in zip(sp.in_sbps, mapped)]
        out_sbps = [shift(s) for s in sp.out_sbps]
        bsp = ShardedProgram(
            bprog,
            sp.placement,
            in_sbps,
            out_sbps,
            name="vmap",
            plan_options=_opts(sp, _kept_of(sp)),
        )
        _derived(sp)[key] = bsp
    outs = bind_call(bsp, moved)
    return list(outs), [0] * len(outs)


def _register_batch_rules():
    vmap_mod.batch_rules[shard_call_p] = _shard_call_batch


_register_batch_rules()


# ----------------------------------------------------------------------------
# Eager global arrays: op-by-op dispatch through the same signatures and boxing

_eager_cache = {}


def _global_dispatch(prim, args, params):
    if not any(is_global(a) for a in args):
        return NotImplemented
    if prim is shard_call_p:
        return _run_call(params["sharded"], list(args))
    if prim is sbp_constraint_p:
        return to_global(args[0], sbp=params["sbp"])
    pl = None
    for a in args:
        if is_global(a):
            if pl is None:
                pl = a.placement
            elif a.placement != pl:
                raise user_error(
                    ValueError,
                    f"{prim.name} got global arrays on different placements ({pl} and "
                    f"{a.placement}); mixing placements is not allowed. Fix: move one with "
                    "to_local() + to_global(), or place both on one placement.",
                )
    ready = [a if is_global(a) else to_global(as_value(a), pl) for a in args]
    avals = tuple(ShapedArray(a.shape, a.dtype) for a in ready)
    sbps = tuple(a.sbp for a in ready)
    try:
        key = (prim, freeze(params), avals, sbps, pl)
        hash(key)
    except TypeError:
        key = None
    sp = _eager_cache.get(key) if key is not None else None
    if sp is None:
        invars = [Var(a) for a in avals]
        out_avals = prim.abstract_eval(*avals, **params)
        out_avals = out_avals if prim.multiple_results else [out_avals]
        outvars = [Var(a) for a in out_avals]
        eqn = Eqn(prim, invars, params, outvars)
        prog = Program(invars, [], [eqn], outvars)
        sp = ShardedProgram(
            prog, pl, list(sbps), [None] * len(outvars), allow_partial_out=True, name="eager"
        )
        if key is not None:
            if len(_eager_cache) > 4096:  # many shapes: start over rather than grow forever
                _eager_cache.clear()
            _eager_cache[key] = sp
    outs = sp.run_global(ready)
    weak = all(getattr(a, "weak_type", False) for a in args)
    for o in outs:
        o._weak = weak and o._weak
    return outs if prim.multiple_results else outs[0]


def _direct_shard_call(eqn):
    """jit's executable for a program that is one shard_call (jit(shard(f)) on global
    arrays): the sharded program runs without re-binding the equation."""
    sp = eqn.params["sharded"]
    array_t = array_mod.Array
    if getattr(sp, "is_mixed", False):
        return None

    pl, sbps, go = sp.placement, sp.in_sbps, sp.global_runner()

    def run(*args):
        for a, s in zip(args, sbps):  # all global, in the program's placement and SBPs
            sh = a._sharding if type(a) is array_t else None
            if sh is None or sh.placement is not pl or sh.sbp != s:
                break
        else:
            return go(args)
        for a in args:
            if type(a) is array_t and a._sharding is not None:
                return _run_call(sp, args)
        with set_current_trace(array_mod.root_trace):  # no global array: as bind at the root
            return shard_call_p.bind(*args, sharded=sp)

    return run


direct_runners[shard_call_p] = _direct_shard_call

__all__ = ["shard", "with_sbp", "shard_call_p", "sbp_constraint_p", "ShardedProgram"]
