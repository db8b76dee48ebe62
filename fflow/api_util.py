"""The one wrapper that lifts flat-list transforms to pytrees and `argnums`."""

import functools
import inspect

import numpy as np

from fflow import dtypes
from fflow.array import Array
from fflow.core import Tracer
from fflow.errors import user_error
from fflow.tree_util import tree_flatten, tree_unflatten


class Store:
    """Receives a value (e.g. the output tree) from inside a traced function."""

    __slots__ = ("value", "filled")

    def __init__(self):
        self.filled = False
        self.value = None

    def set(self, value):
        self.value = value
        self.filled = True


def flatten_fun(fun, in_tree, out_store):
    """`fun(*args, **kwargs)` as a function of flat leaves returning flat leaves."""

    def flat(*leaves):
        args, kwargs = tree_unflatten(in_tree, leaves)
        out = fun(*args, **kwargs)
        out_leaves, out_tree = tree_flatten(out)
        out_store.set(out_tree)
        return [as_value(x) for x in out_leaves]

    return flat


def asarray_value(x):
    """A plain NumPy array for list/tuple input, with JAX's 32-bit defaults."""
    if isinstance(x, (list, tuple)):
        if any(isinstance(e, (Tracer, Array)) for e in _flat(x)):
            raise TypeError("nested sequences of arrays: use fflow.numpy.stack")
        arr = np.asarray(x)
    else:
        arr = np.asarray(x)
    return dtypes.canonical_array(arr)  # JAX's 32-bit defaults unless x64 is on


def _flat(x):
    for e in x:
        if isinstance(e, (list, tuple)):
            yield from _flat(e)
        else:
            yield e


def as_value(x):
    """Leaves entering a transform: Python/NumPy scalars become arrays (weak for Python)."""
    t = type(x)
    if t is Array or isinstance(x, Tracer):
        return x
    if t in (float, int, bool, complex):
        return Array(np.asarray(x, dtypes.python_scalar_dtype(x)), weak_type=True)
    if t is np.ndarray:  # 64-bit NumPy inputs are narrowed unless x64 is on, as in JAX
        narrow = dtypes.canonical_array(x)
        return Array(narrow if narrow is not x else x.copy())  # never alias the caller's buffer
    if isinstance(x, np.generic):
        return Array(dtypes.canonical_array(np.asarray(x)))
    if isinstance(x, Array):
        return x
    try:
        value = asarray_value(x)
    except Exception:
        value = None
    if value is None or value.dtype.kind not in "biufc":
        raise user_error(
            TypeError,
            f"a transformed function got an argument or returned a result of type "
            f"{type(x).__name__} ({_short_repr(x)}), which is not an array. Fix: pass and "
            f"return arrays or numbers; mark a non-array argument static (static_argnums) "
            f"or register its class as a pytree.",
        )
    return Array(value)


def _short_repr(x):
    text = repr(x)
    return text if len(text) <= 40 else text[:37] + "..."


def normalize_argnums(argnums, nargs, what="argnums"):
    single = isinstance(argnums, int)
    nums = (argnums,) if single else tuple(argnums)
    out = []
    for n in nums:
        if type(n) is not int:
            raise user_error(TypeError, f"{what} must be ints, got {argnums!r}. Fix: {what}=0.")
        if not -nargs <= n < nargs:
            raise user_error(
                ValueError,
                f"{what}={argnums} is out of range for a function called with {nargs} "
                f"positional argument{'s' if nargs != 1 else ''}. Fix: pick {what} in "
                f"range({nargs}), or pass the argument positionally.",
            )
        out.append(n % nargs)
    return single, tuple(out)


def sharding_owner(shardings):
    """The first JAX-style sharding (an object with `_fflow_jit`) in a pytree, or None."""
    leaves = tree_flatten(shardings, is_leaf=lambda s: hasattr(s, "_fflow_jit"))[0]
    return next((s for s in leaves if hasattr(s, "_fflow_jit")), None)


def with_keyword_statics(make_jit, fun, static_argnums, static_argnames, donate_argnums):
    """`make_jit(fun, ...)`, except that static_argnames naming keyword-only parameters
    (`def f(x, *, k)`) are handled here: one compiled function per value of those
    keywords, as JAX retraces per static value."""
    try:
        params = inspect.signature(fun).parameters
    except (TypeError, ValueError):
        params = {}
    names = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames)
    kwonly = tuple(n for n in names if n in params and params[n].kind == params[n].KEYWORD_ONLY)
    rest = tuple(n for n in names if n not in kwonly)
    if not kwonly:
        return make_jit(fun, static_argnums, rest, donate_argnums)
    return _KeywordStatic(lambda f: make_jit(f, static_argnums, rest, donate_argnums), fun, kwonly)


class _KeywordStatic:
    def __init__(self, make, fun, names):
        functools.update_wrapper(self, fun)
        self._make, self._fun, self._names, self._by_value = make, fun, names, {}

    def _jitted(self, kwargs):
        static = tuple((n, kwargs.pop(n)) for n in self._names if n in kwargs)
        try:
            jitted = self._by_value.get(static)
        except TypeError:
            raise user_error(
                TypeError,
                f"jit: static keyword arguments must be hashable, got {static!r:.80}. Fix: "
                f"pass a tuple instead of a list, or make the argument dynamic.",
            ) from None
        if jitted is None:
            jitted = self._by_value[static] = self._make(
                functools.partial(self._fun, **dict(static))
            )
        return jitted, kwargs

    def __call__(self, *args, **kwargs):
        jitted, kwargs = self._jitted(dict(kwargs))
        return jitted(*args, **kwargs)

    def lower(self, *args, **kwargs):
        jitted, kwargs = self._jitted(dict(kwargs))
        return jitted.lower(*args, **kwargs)
