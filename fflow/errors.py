"""Errors a user can cause, and finding the user's own source line for them."""

import difflib
import functools
import inspect
import os
import sys
import types
import warnings

from fflow.config import config

_internal_dirs = None
_SKIP_FILES = ("contextlib.py", "functools.py", "threading.py")


def _internal_roots():
    global _internal_dirs
    if _internal_dirs is None:
        here = os.path.dirname(os.path.abspath(__file__))
        root = os.path.dirname(here)
        roots = [here]
        for name in ("primitives", "transforms", "lowering"):
            roots.append(os.path.join(root, name))
        # an installed (non-editable) layout puts them inside fflow/ already
        _internal_dirs = tuple(r + os.sep for r in roots)
    return _internal_dirs


_internal_cache = {}  # filename -> bool (abspath per frame per equation was a trace hot spot)


def _is_internal(filename):
    hit = _internal_cache.get(filename)
    if hit is None:
        hit = (
            filename.endswith(_SKIP_FILES)
            or filename.startswith(("<frozen", "<fflow"))  # generated kernels are ours
            or os.path.abspath(filename).startswith(_internal_roots())
        )
        _internal_cache[filename] = hit
    return hit


class SourceInfo:
    """A user's file:line (and function name), attached to equations and errors."""

    __slots__ = ("filename", "lineno", "function")

    def __init__(self, filename, lineno, function):
        self.filename = filename
        self.lineno = lineno
        self.function = function

    def __str__(self):
        return f"{self.filename}:{self.lineno} ({self.function})"

    def short(self):
        return f"{os.path.basename(self.filename)}:{self.lineno}"

    def line_text(self):
        import linecache

        return linecache.getline(self.filename, self.lineno).strip()


# Set while a staged equation is re-bound, so derived equations keep its user line.
forced_source_info = None


def user_source_info(depth_limit=60):
    """The innermost stack frame outside fflow itself, or None."""
    if forced_source_info is not None:
        return forced_source_info
    frame = sys._getframe(1)
    for _ in range(depth_limit):
        if frame is None:
            return None
        code = frame.f_code
        if not _is_internal(code.co_filename):
            return SourceInfo(code.co_filename, frame.f_lineno, code.co_name)
        frame = frame.f_back
    return None


def _where(info):
    if info is None:
        return ""
    text = info.line_text()
    return f"\n  at {info}" + (f"\n    {text}" if text else "")


class FflowError(Exception):
    """Base class of fflow's user-facing errors."""


class ShapeError(FflowError, ValueError, TypeError):
    """Shapes that do not fit an operation.

    Both a ValueError and a TypeError: JAX raises TypeError for mismatched shapes in
    binary ops, dot, reshape and concatenate but ValueError elsewhere, and programs
    written against JAX catch either."""


class DtypeError(FflowError, TypeError):
    """Dtypes that do not fit an operation."""


class UnexpectedTracerError(FflowError):
    """A tracer used outside the transformation that created it."""


class ConcretizationError(FflowError, TypeError):
    """A traced value used where Python needs a concrete one (bool, int, index)."""

    def __init__(self, tracer, what):
        info = user_source_info()
        fixes = {
            "bool": "use fflow.lax.cond / fflow.lax.while_loop / fflow.numpy.where for "
            "value-dependent control flow, or mark the argument static with "
            "static_argnums / static_argnames",
            "int": "mark the argument static with static_argnums / static_argnames, "
            "or keep the value an array",
            "index": "use fflow.lax.dynamic_slice / x.at[i] / fflow.numpy.take for traced "
            "indices, or mark the argument static with static_argnums",
        }
        fix = fixes.get(what, fixes["int"])
        super().__init__(
            f"A traced {tracer.aval.str_short()} value was used as a Python {what} inside "
            f"a transformation that does not know its value (such as jit).{_where(info)}\n"
            f"Fix: {fix}."
        )


def user_error(cls, message):
    """Build an error of class `cls` whose message ends with the user's line."""
    return cls(message + _where(user_source_info()))


def unknown_keyword_error(fn_name, name, valid):
    """TypeError for an unknown keyword argument, listing the valid ones."""
    close = difflib.get_close_matches(name, valid, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return user_error(
        TypeError,
        f"{fn_name}() got an unexpected keyword argument {name!r}.{hint} Fix: use one of "
        f"{', '.join(valid)}.",
    )


def check_keywords(fn):
    """Decorator: an unknown keyword argument raises naming the valid ones (a
    misspelt `in_axis=` must not become a Python-level TypeError without a hint)."""
    params = inspect.signature(fn).parameters.values()
    valid = tuple(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))

    takes_fun = bool(valid) and valid[0] in ("fun", "f")

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        for k in kwargs:
            if k not in valid:
                raise unknown_keyword_error(fn.__name__, k, valid)
        if takes_fun and args and not callable(args[0]):
            raise user_error(
                TypeError,
                f"{fn.__name__} expects a function as its first argument, got "
                f"{type(args[0]).__name__}. Fix: fflow.{fn.__name__}(f)(x), with f a "
                f"Python function of arrays.",
            )
        return fn(*args, **kwargs)

    return wrapped


# JAX computes inf and nan silently; NumPy's RuntimeWarnings raised inside fflow's own
# kernels (eager primitives, generated jit code) would leak to the user as noise.
warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"fflow(\.|$)")


# -- traceback filtering (JAX's): errors leave fflow without its internal frames --------

config.define("traceback_filtering", "auto")  # "off" shows fflow's own frames too

_HIDDEN_NOTE = (
    "(fflow-internal frames are hidden from this traceback; "
    "fflow.config.update('traceback_filtering', 'off') shows them.)"
)


def filter_traceback(tb):
    """`tb` without the frames of fflow's own files (None if nothing is left)."""
    kept = []
    while tb is not None:
        if not _is_internal(tb.tb_frame.f_code.co_filename):
            kept.append(tb)
        tb = tb.tb_next
    out = None
    for t in reversed(kept):
        out = types.TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return out


def filtered_traceback(e):
    """The traceback to re-raise `e` with at an API boundary (None: leave it as is)."""
    if config.traceback_filtering == "off":
        return None
    tb = filter_traceback(e.__traceback__)
    if tb is not None and _HIDDEN_NOTE not in getattr(e, "__notes__", ()):
        e.add_note(_HIDDEN_NOTE)
    return tb


def api_boundary(fn):
    """Decorator for public entry points (grad, vmap, jvp...): an exception leaving
    through it keeps only the user's frames, as JAX's tracebacks do."""

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        __tracebackhide__ = True  # noqa: F841  (pytest and IPython hide this frame)
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            tb = filtered_traceback(e)
            if tb is None:
                raise
            raise e.with_traceback(tb)  # noqa: B904  (the same exception, fewer frames)

    return wrapped
