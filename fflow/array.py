"""The concrete array type and the root (eager) trace.

`Array` wraps a NumPy array (a CuPy array on a GPU; per-device shards for a
global array). Eager evaluation calls a primitive's NumPy implementation
directly: no program is built or compiled per operation.
"""

import numpy as np

from fflow import core
from fflow.core import ShapedArray
from fflow.errors import user_error as _user_error


class Array:
    """An immutable array with JAX semantics.

    Example:
        >>> import fflow.numpy as jnp
        >>> x = jnp.arange(3.0)
        >>> (x * 2 + 1).tolist()
        [1.0, 3.0, 5.0]
        >>> x.at[1].set(7.0).tolist()
        [0.0, 7.0, 2.0]
    """

    __slots__ = ("_value", "_weak", "_sharding", "_deleted", "__weakref__")
    __array_priority__ = 1000

    def __init__(self, value, weak_type=False):
        self._value = value
        self._weak = weak_type
        self._sharding = None
        self._deleted = False

    # -- metadata ------------------------------------------------------------
    @property
    def shape(self):
        return self._value.shape

    @property
    def dtype(self):
        return self._value.dtype

    @property
    def ndim(self):
        return self._value.ndim

    @property
    def size(self):
        return self._value.size

    @property
    def weak_type(self):
        return self._weak

    @property
    def aval(self):
        return ShapedArray(self._value.shape, self._value.dtype, self._weak)

    @property
    def nbytes(self):
        return self._value.nbytes

    @property
    def placement(self):
        return None if self._sharding is None else self._sharding.placement

    @property
    def sbp(self):
        return None if self._sharding is None else self._sharding.sbp

    # -- conversion ----------------------------------------------------------
    def _check_alive(self):
        if self._deleted:
            raise RuntimeError(
                "This array was donated to a jitted function (donate_argnums) and its "
                "buffer was reused; use the function's output instead."
            )

    def __array__(self, dtype=None, copy=None):
        self._check_alive()
        value = _to_numpy(self._value)
        if dtype is not None and np.dtype(dtype) != value.dtype:
            return value.astype(dtype)
        if copy:
            return value.copy()
        return value

    def __len__(self):
        if self._value.ndim == 0:
            raise _user_error(TypeError, "len() of a 0-d array. Fix: use x.size or x.shape.")
        return self._value.shape[0]

    def __iter__(self):
        if self.ndim == 0:
            raise _user_error(
                TypeError, "iteration over a 0-d array. Fix: use x.item() or x.shape."
            )
        for i in range(self.shape[0]):
            yield self[i]

    def __bool__(self):
        return bool(self._value)

    def __int__(self):
        return int(self._value)

    def __float__(self):
        return float(self._value)

    def __complex__(self):
        return complex(self._value)

    def __index__(self):
        if self.dtype.kind not in "iub":
            raise TypeError(f"only integer arrays can be used as an index, not {self.dtype}")
        return int(self._value)

    def __hash__(self):
        raise TypeError(
            "fflow arrays are not hashable; for a static argument pass a Python value "
            "(or a tuple) and list it in static_argnums."
        )

    def item(self, *args):
        return np.asarray(self).item(*args)

    def tolist(self):
        return np.asarray(self).tolist()

    def block_until_ready(self):
        return self

    def copy(self):
        if self._sharding is not None:  # a global array: copy each shard, keep the sharding
            gv = self._value
            shards = {i: np.array(s) for i, s in gv.shards.items()}
            return _rebuild_global(type(gv)(gv.shape, gv.dtype, gv.sharding, shards), self._weak)
        return Array(np.array(np.asarray(self)), self._weak)

    def view(self, dtype=None):
        """The same bytes read as `dtype` (NumPy's `view`; a new immutable array)."""
        if dtype is None:
            return self
        return Array(np.asarray(self).view(np.dtype(dtype)).copy())

    # to_global / to_local / to_local_shards: added by fflow/sharding.py (above this module)

    def delete(self):
        self._deleted = True
        self._value = _DELETED

    def is_deleted(self):
        return self._deleted

    def __repr__(self):
        if self._deleted:
            return "Array(<deleted>)"
        body = np.array2string(np.asarray(self), separator=", ", prefix="Array(", threshold=20)
        extra = ""
        if self.size == 0:  # as JAX: an empty body does not show the shape
            body = f"{body}, shape={self.shape}"
        if self._weak:
            extra = ", weak_type=True"
        if self._sharding is not None:
            extra = f", placement={self.placement}, sbp={self.sbp}"
        return f"Array({body}, dtype={self.dtype.name}{extra})"

    def __str__(self):
        return str(np.asarray(self))

    def __format__(self, spec):
        if self.ndim == 0:
            return format(np.asarray(self).item(), spec)
        return format(str(self), spec)

    def __reduce__(self):
        if self._sharding is not None:
            # a global array pickles its placement, SBP and this process' shards
            return (_rebuild_global, (self._value, self._weak))
        return (_rebuild, (np.asarray(self), self._weak))

    def __deepcopy__(self, memo):
        return self.copy()

    def __copy__(self):
        return self


class _Deleted:
    """Stands in for a donated buffer; any use raises."""

    shape = dtype = ndim = size = property(lambda self: _raise_deleted())

    def __array__(self, *a, **k):
        _raise_deleted()


def _raise_deleted():
    raise RuntimeError(
        "This array was donated to a jitted function (donate_argnums) and its buffer "
        "was reused; use the function's output instead."
    )


_DELETED = _Deleted()


def _rebuild(value, weak):
    return Array(value, weak)


def _rebuild_global(global_value, weak):
    out = Array(global_value, weak)
    out._sharding = global_value.sharding
    return out


def _to_numpy(value):
    if type(value) is np.ndarray:
        return value
    if hasattr(value, "get"):  # a CuPy array
        return value.get()
    return np.asarray(value)


# Hooks for arrays that are not plain local NumPy arrays (global arrays, GPU
# arrays): each is `hook(prim, args, params)` returning NotImplemented to pass.
special_dispatch = []


def _wrap(out):
    if type(out) is np.ndarray:
        return Array(out)
    return Array(np.asarray(out))


class EvalTrace(core.Trace):
    """The root trace: applies primitives to concrete values right away.

    Every application first runs the primitive's shape rule, the same one tracing
    runs, so eager and staged code agree on shapes, dtypes, weak types and errors.
    """

    def process_primitive(self, prim, args, params):
        vals = []
        avals = []
        raw = None  # caller-owned buffers among the inputs (results must not alias them)
        for a in args:
            t = type(a)
            if t is Array:
                v = a._value
                if a._sharding is not None or type(v) is not np.ndarray:
                    return _dispatch_special(prim, args, params)
                vals.append(v)
                avals.append((v.shape, v.dtype, a._weak))
                continue
            if isinstance(a, core.Tracer):
                core.check_not_leaked(a, self)
                raise core.UnexpectedTracerError(
                    f"a tracer of {a._trace} reached eager evaluation of {prim.name}; "
                    "a traced value escaped its transformation."
                )
            aval = core.aval_of_value(a)  # canonical: x64 off narrows NumPy's 64-bit inputs
            v = np.asarray(a, aval.dtype)
            vals.append(v)
            avals.append((aval.shape, aval.dtype, aval.weak_type))
            if v.ndim and not aval.weak_type:
                raw = vals
        out_avals = _shape_rule(prim, avals, params)
        out = prim.impl(*vals, **params)
        if prim.multiple_results:
            if out_avals is None:
                return [_wrap(_own(o, raw)) for o in out]
            return [_wrap_as(_own(o, raw), av) for o, av in zip(out, out_avals)]
        if out_avals is None:
            return _wrap(_own(out, raw))
        return _wrap_as(_own(out, raw), out_avals)


_rule_cache = {}  # (prim, avals, params) -> the shape rule's result, for eager speed


def _shape_rule(prim, avals, params):
    rule = prim.abstract_eval
    if rule is None or not prim.eager_shape_rule:
        return None
    try:
        key = (prim, *avals, *params.items())
        out = _rule_cache.get(key)
    except TypeError:  # unhashable params (rare): no caching
        return rule(*[_aval(*a) for a in avals], **params)
    if out is None:
        out = rule(*[_aval(*a) for a in avals], **params)
        if len(_rule_cache) > 8192:
            _rule_cache.clear()
        _rule_cache[key] = out
    return out


def _aval(shape, dtype, weak):
    # ShapedArray without re-normalising: NumPy's shape and dtype already are
    aval = object.__new__(ShapedArray)
    aval.shape = shape
    aval.dtype = dtype
    aval.weak_type = weak
    return aval


def _own(out, raw):
    """A result that may be a view of a caller's NumPy buffer is copied (JAX copies
    inputs to the device; a later write into the caller's buffer must not show)."""
    if raw is not None and type(out) is np.ndarray and out.base is not None:
        if any(type(v) is np.ndarray and np.may_share_memory(out, v) for v in raw):
            return out.copy()
    return out


def _wrap_as(out, aval):
    """Wrap an impl's result with the shape rule's dtype and weak type."""
    if type(out) is not np.ndarray:
        out = np.asarray(out)
    if out.dtype != aval.dtype:
        out = out.astype(aval.dtype)
    return Array(out, aval.weak_type) if aval.weak_type else Array(out)


def _dispatch_special(prim, args, params):
    for hook in special_dispatch:
        out = hook(prim, args, params)
        if out is not NotImplemented:
            return out
    for a in args:
        if type(a) is Array:
            a._check_alive()
    raise TypeError(f"no eager implementation of {prim.name} for these arrays: {args}")


root_trace = EvalTrace(parent=None)
root_trace.parent = None
core._state.trace = root_trace
core._TraceState.trace = root_trace


def is_eager():
    return core._state.trace is root_trace
