"""jit: trace once per (pytree structure, shape/dtype of each leaf, static args),
cache the program and its executable, and call the executable on a cache hit.

Under another transformation (grad, vmap, an outer jit) the cached program is
evaluated on the current trace, which is that transformation's rewrite of it.
"""

import difflib
import functools
import inspect
import time
import warnings

import numpy as np
from fflow.transforms.attention_rewrite import rewrite_traced
from fflow.transforms.staging import eval_program, run_at_root, trace_to_program

from fflow import core
from fflow.api_util import Store, as_value, sharding_owner, with_keyword_statics
from fflow.array import Array, root_trace
from fflow.config import config
from fflow.core import ShapedArray, Tracer
from fflow.errors import (
    filtered_traceback,
    unknown_keyword_error,
    user_error,
    user_source_info,
)
from fflow.tree_util import tree_flatten, tree_node, tree_rebuilder, tree_unflatten

RETRACE_WARNING_THRESHOLD = 8


class CompiledEntry:
    """One cache entry: the traced program, its output tree and the executable.

    `call(leaves)` is what a cache hit runs: the executable plus the output pytree.
    """

    __slots__ = ("program", "out_tree", "executable", "in_avals", "lowered", "call", "trace_time")

    def __init__(self, program, out_tree, executable, in_avals, lowered=None):
        self.program = program
        self.out_tree = out_tree
        self.executable = executable
        self.in_avals = in_avals
        self.lowered = lowered
        self.trace_time = 0.0
        self.call = _make_call(executable, out_tree) if executable is not None else None


def _make_call(executable, out_tree):
    # precompute the output unflattening so a cache hit does no tree work: for leaves,
    # tuples, lists, dicts and None one compiled expression, else the generic rebuild
    rebuild = tree_rebuilder(out_tree) or functools.partial(tree_unflatten, out_tree)

    def call(leaves):
        return rebuild(executable(*leaves))

    return call


def _fast_walk(xs, leaves, key):
    """Append the leaves of `xs` (in `tree_flatten`'s order) to `leaves` and one token
    per node to `key`: a leaf signature (a 4-tuple) per Array, (type, length) per tuple
    or list, (dict, sorted keys) per dict, None per None, `tree_node`'s token per
    registered class or namedtuple; NumPy arrays and scalars enter as the Arrays
    `as_value` makes of them. The preorder tokens determine the structure, so equal
    keys mean equal treedefs and leaf signatures. False (and the slow path) for any
    other node: tracers, unregistered dataclasses, OrderedDicts..."""
    for x in xs:
        t = type(x)
        if t is Array:  # _leaf_signature's Array case, inline: the hot path
            v = x._value
            where = x._sharding if type(v) is np.ndarray else _where(x)
            key.append((v.shape, v.dtype, x._weak, where))
            leaves.append(x)
        elif t is tuple or t is list:
            key.append((t, len(x)))
            if not _fast_walk(x, leaves, key):
                return False
        elif t is dict:
            try:
                keys = sorted(x)
            except TypeError:  # keys that do not sort: the slow path says so
                return False
            key.append((dict, tuple(keys)))
            if not _fast_walk([x[k] for k in keys], leaves, key):
                return False
        elif x is None:
            key.append(None)
        elif t in _CONVERTED or isinstance(x, np.generic):  # as the slow path: a copy or
            x = as_value(x)  # a weak scalar, keyed by what it became (x64 mode decides)
            key.append(_leaf_signature(x))
            leaves.append(x)
        else:  # a registered class (nn modules) or a namedtuple (optimizer states)
            node = tree_node(x)
            if node is None:
                return False
            key.append(node[0])
            if not _fast_walk(node[1], leaves, key):
                return False
    return True


_CONVERTED = frozenset((np.ndarray, float, int, bool, complex))


def _leaf_signature(x):
    t = type(x)
    if t is Array:
        v = x._value
        return (v.shape, v.dtype, x._weak, x._sharding if type(v) is np.ndarray else _where(x))
    if isinstance(x, Tracer):
        a = x.aval
        return (a.shape, a.dtype, a.weak_type, None)
    a = as_value(x)
    return (a.shape, a.dtype, a._weak, None)


def _where(x):
    # GPU arrays (fflow.device.DeviceBuffer values) key the cache by their device too
    return x._sharding if x._sharding is not None else getattr(x._value, "device", None)


def default_backend_compile(program, donate, device=None):
    """Pick the lowering for a program: the generated NumPy kernels by default, the CUDA
    backend for inputs on a GPU or when `config.jit_backend` asks for it."""
    if device is not None or config.jit_backend != "numpy":
        from fflow.lowering import cuda_backend  # loads CuPy / NVRTC

        backend = device.backend if device is not None else config.jit_backend
        return cuda_backend.compile_program(program, donate, backend=backend, device=device)
    if config.jit_interpret:
        return run_at_root(program)
    from fflow.lowering import numpy_backend  # lazy: ~50 ms kept off `import fflow`

    return numpy_backend.compile_program(program, donate)


JIT_BACKENDS = ("numpy", "cuda", "cuda_shim")
_good_backend = ["numpy"]


def _check_jit_backend(value):
    """config hook: an unknown backend name raises (instead of silently running NumPy)."""
    if value in JIT_BACKENDS:
        _good_backend[0] = value
        return
    config._values["jit_backend"] = _good_backend[0]  # keep the last valid choice
    close = difflib.get_close_matches(str(value), JIT_BACKENDS + ("gpu",), n=1)
    hint = ""
    if close:
        hint = " (for a GPU use 'cuda')" if close[0] == "gpu" else f" (did you mean {close[0]!r}?)"
    raise user_error(
        ValueError,
        f"unknown jit_backend {value!r}{hint}. Fix: one of {', '.join(map(repr, JIT_BACKENDS))}.",
    )


def _register_backend_check():
    config.on_update("jit_backend", _check_jit_backend)
    if config.jit_backend not in JIT_BACKENDS:  # e.g. a bad FFLOW_JIT_BACKEND
        try:
            _check_jit_backend(config.jit_backend)
        except ValueError as e:
            warnings.warn(f"FFLOW_JIT_BACKEND ignored: {e}", stacklevel=2)


_register_backend_check()


class Jitted:
    """A jit-compiled function. Call it like the original; `.lower(*args)` for AOT.

    `trace_count` counts traces (Python runs of the function); `compile_count`
    counts code generations. A cache hit runs neither.
    """

    def __init__(self, fun, static_argnums=(), static_argnames=(), donate_argnums=()):
        functools.update_wrapper(self, fun)
        self.fun = fun
        self.static_argnums = _as_tuple(static_argnums)
        self.static_argnames = _as_tuple(static_argnames)
        self.donate_argnums = _as_tuple(donate_argnums)
        self.cache = {}  # generic key -> entry
        self.fast_cache = {}  # flat key of the arguments (_fast_walk) -> (call, donated)
        self.trace_count = 0
        self.compile_count = 0
        self._last_key = None
        self._last_arg_sigs = None
        self._signature = None
        if self.static_argnames:
            params = list(self._get_signature().parameters)
            extra = tuple(params.index(n) for n in self.static_argnames if n in params)
            self.static_argnums = tuple(sorted(set(self.static_argnums + extra)))
        self._fast_ok = not self.static_argnums
        self._check_static_argnums()

    def _check_static_argnums(self):
        for i in self.static_argnums + self.donate_argnums:
            if type(i) is not int:
                raise user_error(
                    TypeError, f"static_argnums/donate_argnums must be ints, got {i!r}."
                )
        sig = self._get_signature()
        if sig is None:
            return
        kinds = [p.kind for p in sig.parameters.values()]
        if inspect.Parameter.VAR_POSITIONAL in kinds:
            return
        n = sum(
            k in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
            for k in kinds
        )
        for what, nums in (("static_argnums", self.static_argnums),
                           ("donate_argnums", self.donate_argnums)):  # fmt: skip
            bad = [i for i in nums if not -n <= i < n]
            if bad:
                name = getattr(self.fun, "__name__", "the function")
                raise user_error(
                    ValueError,
                    f"jit: {what}={bad[0]} but {name} takes {n} positional argument"
                    f"{'s' if n != 1 else ''}. Fix: pick {what} in range({n}).",
                )
        for name in self.static_argnames:
            if name not in sig.parameters and inspect.Parameter.VAR_KEYWORD not in kinds:
                raise user_error(
                    ValueError,
                    f"jit: static_argnames={name!r} is not a parameter of "
                    f"{getattr(self.fun, '__name__', 'the function')}; its parameters are "
                    f"{list(sig.parameters)}.",
                )

    def _get_signature(self):
        if self._signature is None:
            try:
                self._signature = inspect.signature(self.fun)
            except (TypeError, ValueError):
                self._signature = False
        return self._signature or None

    # -- the call path ------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        try:
            # fast path: eager, no static args, arguments made of Arrays in tuples, lists,
            # dicts and None: one walk over the arguments builds the leaves and one flat
            # key (structure and leaf signatures), one tuple hash, one call
            if self._fast_ok and not kwargs and _FAST[0] and core._state.trace is root_trace:
                leaves, key = [], []
                if _fast_walk(args, leaves, key):
                    hit = self.fast_cache.get(tuple(key))
                    if hit is not None:
                        call, donated = hit
                        out = call(leaves)
                        for k in donated:  # the leaves of donated arguments
                            if not leaves[k]._deleted:
                                leaves[k].delete()
                        return out
            return self._call_slow(args, kwargs)
        except Exception as e:
            # errors leave without fflow's own frames (JAX's traceback filtering)
            tb = filtered_traceback(e)
            if tb is None:
                raise
            raise e.with_traceback(tb)  # noqa: B904  (the same exception, fewer frames)

    def _call_slow(self, args, kwargs):
        if kwargs and (self.static_argnames or self.static_argnums):
            args, kwargs = self._bind_static_kwargs(args, kwargs)
        dyn_args, static = self._split(args, kwargs)
        leaves, in_tree = tree_flatten((dyn_args, kwargs))
        leaves = [x if type(x) is Array else as_value(x) for x in leaves]
        key = (in_tree, static, tuple(_leaf_signature(x) for x in leaves))
        try:
            entry = self.cache.get(key)
        except TypeError:
            raise self._unhashable_error(static) from None
        if entry is None:
            entry = self._trace(key, dyn_args, kwargs, leaves, in_tree, static, args)
        if core._state.trace is root_trace and entry.call is not None:
            if not _FAST[0]:
                return tree_unflatten(entry.out_tree, _run_checked(entry, leaves))
            if self._fast_ok and not kwargs:
                self._remember_fast(args, entry)  # before the call deletes donated leaves
            out = entry.call(leaves)
            if self.donate_argnums:
                self._mark_donated(args)
            return out
        outs = eval_program(entry.program, entry.program.consts, leaves)
        return tree_unflatten(entry.out_tree, outs)

    def _remember_fast(self, args, entry):
        """Key `entry` by the fast path's flat key of `args` (when it has one), with the
        indices of the leaves that donated arguments hold."""
        fast_key = []
        if _fast_walk(args, [], fast_key):  # (no static args here)
            donated = tuple(self._donated_leaf_indices(args, {}, ()))
            self.fast_cache[tuple(fast_key)] = (entry.call, donated)

    def _bind_static_kwargs(self, args, kwargs):
        sig = self._get_signature()
        if sig is None:
            return args, kwargs
        bound = sig.bind(*args, **kwargs)
        params = list(sig.parameters)
        n = max(
            [len(args)]
            + [
                params.index(k) + 1
                for k in kwargs
                if k in params and params.index(k) in self.static_argnums
            ]
        )
        new_args = []
        rest = dict(kwargs)
        for i in range(n):
            name = params[i]
            if i < len(args):
                new_args.append(args[i])
            elif name in bound.arguments:
                new_args.append(bound.arguments[name])
                rest.pop(name, None)
            else:
                new_args.append(sig.parameters[name].default)
        return tuple(new_args), rest

    def _split(self, args, kwargs):
        if not self.static_argnums:
            return args, ()
        n = len(args)
        nums = {i % n for i in self.static_argnums if -n <= i < n}
        dyn = tuple(a for i, a in enumerate(args) if i not in nums)
        static = tuple((i, _static_key(args[i])) for i in sorted(nums))
        return dyn, static

    def _unhashable_error(self, static):
        for i, value in static:
            try:
                hash(value)
            except TypeError:
                return user_error(
                    TypeError,
                    f"static argument {i} of {getattr(self.fun, '__name__', 'the function')} "
                    f"has an unhashable type {type(_unbox(value)).__name__}: "
                    "static arguments must be hashable. Fix: pass a tuple instead of a "
                    "list/array, or make the argument dynamic (remove it from static_argnums).",
                )
        return TypeError("unhashable static argument")

    def _trace(self, key, dyn_args, kwargs, leaves, in_tree, static, args=None):
        for _, value in static:
            try:
                hash(value)
            except TypeError:
                raise self._unhashable_error(static) from None
        arg_sigs = _argument_signatures(args if args is not None else dyn_args, kwargs, static)
        self._warn_retrace(key, arg_sigs)
        self.trace_count += 1
        in_avals = [ShapedArray(s, d, w) for s, d, w, _ in (k for k in key[2])]
        static_values = dict((i, v.value if isinstance(v, _StaticBox) else v) for i, v in static)
        out_store = Store()
        fun = self.fun

        def flat(*flat_leaves):
            d_args, kw = tree_unflatten(in_tree, flat_leaves)
            full = _merge_args(d_args, static_values)
            out = fun(*full, **kw)
            out_leaves, out_tree = tree_flatten(out)
            out_store.set(out_tree)
            return [as_value(x) for x in out_leaves]

        t0 = time.perf_counter()
        try:
            parent = core._state.trace
            program = rewrite_traced(lambda: trace_to_program(flat, in_avals, parent=parent))
        except Exception as e:
            _note_none_arguments(e, args if args is not None else dyn_args)
            raise
        trace_time = time.perf_counter() - t0
        has_tracer_consts = any(isinstance(c, Tracer) for c in program.consts)
        local = all(
            type(x) is not Array or (x._sharding is None and type(x._value) is np.ndarray)
            for x in leaves
        )
        donate = tuple(self._donated_leaf_indices(dyn_args, kwargs, static))
        executable = None
        if not has_tracer_consts:
            self.compile_count += 1
            device = None
            if not local:  # GPU arrays pick the CUDA backend; global arrays their runtime
                arrays = (x for x in leaves if type(x) is Array and x._sharding is None)
                off_host = next((x for x in arrays if type(x._value) is not np.ndarray), None)
                device = None if off_host is None else _where(off_host)
            if local or hasattr(device, "backend"):
                executable = default_backend_compile(program, donate, device)
            else:  # global (sharded) arrays: the equations run on their runtime
                executable = run_at_root(program)
        entry = CompiledEntry(program, out_store.value, executable, in_avals)
        entry.trace_time = trace_time
        if not has_tracer_consts:
            self.cache[key] = entry
        self._last_key = key
        return entry

    def _donated_leaf_indices(self, dyn_args, kwargs, static):
        if not self.donate_argnums:
            return []
        static_nums = {i for i, _ in static}
        out = []
        pos = 0
        dyn_index = 0
        n_total = len(dyn_args) + len(static_nums)
        for i in range(n_total):
            if i in static_nums:
                continue
            arg = dyn_args[dyn_index]
            dyn_index += 1
            k = len(tree_flatten(arg)[0])
            if i in {d % max(n_total, 1) for d in self.donate_argnums}:
                out.extend(range(pos, pos + k))
            pos += k
        return out

    def _mark_donated(self, args):
        n = len(args)
        for d in self.donate_argnums:
            if -n <= d < n:
                for leaf in tree_flatten(args[d])[0]:
                    if type(leaf) is Array and not leaf._deleted:
                        leaf.delete()

    def _warn_retrace(self, key, arg_sigs):
        last = self._last_arg_sigs
        self._last_arg_sigs = arg_sigs
        count = self.trace_count + 1
        if self._last_key is None or count < RETRACE_WARNING_THRESHOLD:
            return
        if count != RETRACE_WARNING_THRESHOLD and count % 50:
            return
        what = self._describe_change(last, arg_sigs, self._last_key, key)
        warnings.warn(
            f"{getattr(self.fun, '__name__', 'function')} was traced {count} times by jit: "
            f"{what}. Every new shape, dtype or static value retraces; pad shapes to a few "
            f"sizes or mark the argument static (static_argnums) if it takes few values.",
            RetraceWarning,
            stacklevel=4,
        )

    def _describe_change(self, old, new, old_key, new_key):
        if old is not None and new is not None:
            sig = self._get_signature()
            names = list(sig.parameters) if sig is not None else []
            for k in list(new):
                if old.get(k) != new.get(k):
                    if isinstance(k, int):
                        label = f"argument {k}" + (f" ({names[k]!r})" if k < len(names) else "")
                    else:
                        label = f"argument {k!r}"
                    return f"{label} changed from {_fmt_sig(old.get(k))} to {_fmt_sig(new[k])}"
        return _describe_change(old_key, new_key)

    # -- ahead-of-time API ----------------------------------------------------------
    def lower(self, *args, **kwargs):
        """Trace and lower for these arguments: `.as_text()`, `.compile()`."""
        from fflow.transforms.lowered import Lowered  # lazy: loads the lowering passes

        if kwargs and (self.static_argnames or self.static_argnums):
            args, kwargs = self._bind_static_kwargs(args, kwargs)
        dyn_args, static = self._split(args, kwargs)
        leaves, in_tree = tree_flatten((dyn_args, kwargs))
        leaves = [x if type(x) is Array else as_value(x) for x in leaves]
        key = (in_tree, static, tuple(_leaf_signature(x) for x in leaves))
        entry = self.cache.get(key) or self._trace(
            key, dyn_args, kwargs, leaves, in_tree, static, args
        )
        return Lowered(entry, in_tree)

    def clear_cache(self):
        self.cache.clear()
        self.fast_cache.clear()

    def _cache_size(self):
        return len(self.cache)

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return functools.partial(self, obj)


class RetraceWarning(UserWarning):
    """A jitted function was traced again and again (new shapes, dtypes or static args)."""


# False while debug_nans / jit_interpret is on: every call takes the checked path
_FAST = [True]


def _jit_mode_hook(_value):
    _FAST[0] = not (config.debug_nans or config.debug_infs or config.jit_interpret)


for _name in ("debug_nans", "debug_infs", "jit_interpret"):
    config.on_update(_name, _jit_mode_hook)
_jit_mode_hook(None)


def _run_checked(entry, leaves):
    """Run a cached program equation by equation (interpret / debug_nans modes)."""
    from fflow.debug import run_interpreted  # lazy: only for debug_nans / jit_interpret

    return run_interpreted(entry.program, leaves)


def _note_none_arguments(err, args):
    """A None argument is an empty pytree under jit (as in JAX): when tracing fails,
    say so at the call site, since Python's own message cannot."""
    nones = [i for i, a in enumerate(args) if a is None]
    if nones and hasattr(err, "add_note"):
        where = user_source_info()
        err.add_note(
            f"jit: argument {nones[0]} is None, an empty pytree (no array) inside the jitted "
            f"function{f' called at {where}' if where else ''}. Fix: pass an array, or mark "
            f"the argument static (static_argnums) if None is a flag."
        )


def _argument_signatures(args, kwargs, static):
    """Per argument (position or keyword): its leaves' shapes/dtypes or static value."""
    out = {}
    static_pos = {i: v for i, v in static}
    for i, a in enumerate(args):
        if i in static_pos:
            out[i] = ("static", _unbox(static_pos[i]))
            continue
        try:
            out[i] = tuple(
                (
                    tuple(np.shape(x)),
                    str(np.result_type(x)) if not hasattr(x, "dtype") else str(x.dtype),
                )
                for x in tree_flatten(a)[0]
            )
        except Exception:
            out[i] = ("?",)
    for k, a in (kwargs or {}).items():
        try:
            out[k] = tuple((tuple(np.shape(x)), str(x.dtype)) for x in tree_flatten(a)[0])
        except Exception:
            out[k] = ("?",)
    return out


def _fmt_sig(sig):
    if sig is None:
        return "(absent)"
    if sig and sig[0] == "static":
        return f"static value {sig[1]!r}"
    parts = [f"{d}{list(s)}" for s, d in sig if True] if sig != ("?",) else ["?"]
    return ", ".join(parts) if len(parts) != 1 else parts[0]


class _StaticBox:
    """Wraps a static value so that arrays compare by content and hash clearly."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __hash__(self):
        return hash(self.value)

    def __eq__(self, other):
        return (
            isinstance(other, _StaticBox)
            and type(self.value) is type(other.value)
            and self.value == other.value
        )


def _unbox(value):
    return value.value if isinstance(value, _StaticBox) else value


def _static_key(value):
    return _StaticBox(value)


def _merge_args(dyn_args, static_values):
    out = []
    it = iter(dyn_args)
    n = len(dyn_args) + len(static_values)
    for i in range(n):
        out.append(static_values[i] if i in static_values else next(it))
    return out


def _describe_change(old, new):
    if old[0] != new[0]:
        return f"the argument structure changed ({old[0]} -> {new[0]})"
    if old[1] != new[1]:
        for (i, a), (_, b) in zip(old[1], new[1]):
            if a != b:
                return f"static argument {i} changed ({a.value!r} -> {b.value!r})"
    for i, (a, b) in enumerate(zip(old[2], new[2])):
        if a != b:
            return (
                f"leaf {i} of the arguments changed from {a[1]}{list(a[0])} to {b[1]}{list(b[0])}"
            )
    return "the arguments changed"


def _as_tuple(x):
    if x is None:
        return ()
    if isinstance(x, (int, str)):
        return (x,)
    return tuple(x)


# JAX's jit options with no effect on a single-process CPU/GPU program: accepted
_IGNORED_JIT_OPTIONS = tuple(
    "keep_unused inline abstracted_axes compiler_options backend device in_shardings "
    "out_shardings donate_argnames".split()
)


def jit(fun=None, *, static_argnums=(), static_argnames=(), donate_argnums=(), **kwargs):
    """Compile `fun`: traced once per input signature, then called from a cache.

    Example:
        >>> import fflow, fflow.numpy as jnp
        >>> f = fflow.jit(lambda x: x * 2 + 1)
        >>> f(jnp.arange(3.0)).tolist()
        [1.0, 3.0, 5.0]
    """
    unknown = [k for k in kwargs if k not in _IGNORED_JIT_OPTIONS]
    if unknown:
        valid = ("static_argnums", "static_argnames", "donate_argnums") + _IGNORED_JIT_OPTIONS
        raise unknown_keyword_error("jit", unknown[0], valid)
    if fun is None:
        return functools.partial(
            jit,
            static_argnums=static_argnums,
            static_argnames=static_argnames,
            donate_argnums=donate_argnums,
            **kwargs,
        )
    if not callable(fun):
        raise user_error(
            TypeError,
            f"jit expects a function, got {type(fun).__name__} {fun!r:.40}. Fix: "
            f"fflow.jit(f) or the @fflow.jit decorator on a def.",
        )
    shardings = (kwargs.get("in_shardings"), kwargs.get("out_shardings"))
    owner = sharding_owner(shardings)  # JAX's shardings (jax_sharding.py): jit of fflow.shard
    if owner is not None:
        return owner._fflow_jit(fun, *shardings, static_argnums=static_argnums)
    return with_keyword_statics(Jitted, fun, static_argnums, static_argnames, donate_argnums)


def make_jaxpr(fun, static_argnums=(), return_shape=False):
    """A function returning the program that `fun` traces to for given arguments.

    Example:
        >>> import fflow, fflow.numpy as jnp
        >>> print(fflow.make_jaxpr(lambda x: jnp.sin(jnp.cos(x)))(1.0))
        { lambda ; a:f32[]. let b:f32[] = cos a; c:f32[] = sin b in (c,) }
    """
    static_argnums = _as_tuple(static_argnums)

    def make(*args, **kwargs):
        n = len(args)
        nums = {i % n for i in static_argnums}
        static_values = {i: args[i] for i in nums}
        dyn = tuple(a for i, a in enumerate(args) if i not in nums)
        leaves, in_tree = tree_flatten((dyn, kwargs))
        in_avals = [as_value(x).aval if not isinstance(x, Tracer) else x.aval for x in leaves]
        out_store = Store()

        def flat(*flat_leaves):
            d_args, kw = tree_unflatten(in_tree, flat_leaves)
            out = fun(*_merge_args(d_args, static_values), **kw)
            out_leaves, out_tree = tree_flatten(out)
            out_store.set(out_tree)
            return [as_value(x) for x in out_leaves]

        program = rewrite_traced(lambda: trace_to_program(flat, in_avals))
        if return_shape:
            shapes = tree_unflatten(out_store.value, [v.aval for v in program.outvars])
            return program, shapes
        return program

    return make
