"""The core: abstract values, the program IR, primitives, traces and `bind`.

Tracing is stackless (as in current JAX): one thread-local slot holds the current
trace; every trace knows its parent and has a unique tag. `bind` hands a primitive
application to the current trace. A trace unboxes only its own tracers; anything
else is a value of an outer level (a constant, from its point of view). Rules run
with the parent as the current trace, so evaluating a program under any trace is
that trace's program-to-program rewrite.
"""

import itertools
import threading

import numpy as np

from fflow import dtypes
from fflow.errors import (
    ConcretizationError,
    UnexpectedTracerError,
    user_error,
    user_source_info,
)
from fflow.printing import pp_program

# ----------------------------------------------------------------------------
# Abstract values


class ShapedArray:
    """The abstract value of an array: its shape, dtype and weak-typedness."""

    __slots__ = ("shape", "dtype", "weak_type")

    def __init__(self, shape, dtype, weak_type=False):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.weak_type = bool(weak_type)

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))

    def update(self, shape=None, dtype=None, weak_type=None):
        return ShapedArray(
            self.shape if shape is None else shape,
            self.dtype if dtype is None else dtype,
            self.weak_type if weak_type is None else weak_type,
        )

    def strip_weak_type(self):
        return ShapedArray(self.shape, self.dtype) if self.weak_type else self

    def __eq__(self, other):
        return (
            isinstance(other, ShapedArray)
            and self.shape == other.shape
            and self.dtype == other.dtype
            and self.weak_type == other.weak_type
        )

    def __hash__(self):
        return hash((self.shape, self.dtype, self.weak_type))

    def str_short(self):
        return f"{dtypes.short_name(self.dtype)}[{','.join(map(str, self.shape))}]"

    def __repr__(self):
        weak = ", weak_type=True" if self.weak_type else ""
        return f"ShapedArray({self.str_short()}{weak})"


def aval_of_value(x):
    """The abstract value of a concrete value or tracer."""
    if isinstance(x, Tracer):
        return x.aval
    aval = getattr(x, "aval", None)
    if aval is not None:
        return aval
    # np.float64 subclasses float, but a NumPy scalar keeps its dtype (not weak)
    if isinstance(x, (bool, int, float, complex)) and not isinstance(x, np.generic):
        return ShapedArray((), dtypes.python_scalar_dtype(x), weak_type=True)
    x = np.asarray(x)
    return ShapedArray(x.shape, dtypes.canonical(x.dtype))


# ----------------------------------------------------------------------------
# The IR

_var_ids = itertools.count()


class Var:
    """A variable of a program, typed by its aval."""

    __slots__ = ("aval", "id")

    def __init__(self, aval):
        self.aval = aval
        self.id = next(_var_ids)

    def __repr__(self):
        return f"Var({self.id}:{self.aval.str_short()})"


class Literal:
    """A scalar constant written into a program (Python scalars become these)."""

    __slots__ = ("value", "aval")

    def __init__(self, value, aval=None):
        self.value = value
        self.aval = aval if aval is not None else aval_of_value(value)

    def __repr__(self):
        return f"Literal({self.value})"


class Eqn:
    """One primitive application: outputs = primitive[params](*inputs)."""

    __slots__ = ("primitive", "inputs", "params", "outputs", "source_info")

    def __init__(self, primitive, inputs, params, outputs, source_info=None):
        self.primitive = primitive
        self.inputs = list(inputs)
        self.params = dict(params)
        self.outputs = list(outputs)
        self.source_info = source_info

    def replace(self, **kw):
        fields = dict(
            primitive=self.primitive,
            inputs=self.inputs,
            params=self.params,
            outputs=self.outputs,
            source_info=self.source_info,
        )
        fields.update(kw)
        return Eqn(**fields)

    def __repr__(self):
        return f"Eqn({self.primitive.name}, {self.inputs} -> {self.outputs})"


class Program:
    """A typed, jaxpr-like program: `{ lambda constvars ; invars. let eqns in outvars }`.

    `consts` holds the values of the constvars (closed-over arrays).
    """

    __slots__ = ("invars", "constvars", "eqns", "outvars", "consts", "__weakref__")

    def __init__(self, invars, constvars, eqns, outvars, consts=()):
        self.invars = list(invars)
        self.constvars = list(constvars)
        self.eqns = list(eqns)
        self.outvars = list(outvars)
        self.consts = list(consts)

    @property
    def in_avals(self):
        return [v.aval for v in self.invars]

    @property
    def out_avals(self):
        return [v.aval for v in self.outvars]

    def replace(self, **kw):
        fields = dict(
            invars=self.invars,
            constvars=self.constvars,
            eqns=self.eqns,
            outvars=self.outvars,
            consts=self.consts,
        )
        fields.update(kw)
        return Program(**fields)

    def __str__(self):
        return pp_program(self)

    __repr__ = __str__

    def pretty_print(self):
        return str(self)


# ----------------------------------------------------------------------------
# Primitives

primitives = {}  # name -> Primitive, walked by the coverage tests


class Primitive:
    """A named operation. Its rules live in each transform's table (e.g. `jvp_rules`).

    `impl` is the NumPy reference implementation (the living specification) and
    `abstract_eval` the shape/dtype rule; `traits` holds registrar tags such as
    "elementwise" or "linear" that let a transform apply a family rule.
    """

    # Eager evaluation runs the shape rule first (eager and jit agree, errors
    # included); False for call primitives whose rule would re-trace the user's
    # function (custom_jvp/custom_vjp: Python control flow must work eagerly).
    eager_shape_rule = True
    # The C math function (libm; "f"-suffixed for float) that computes this elementwise
    # primitive in one call, for the native CPU backend (lowering/native.py declares it
    # `omp declare simd`, so loops vectorize with libmvec); None: not one such call.
    c_math = None
    # "sum" / "max" / "min": the associative combine this primitive computes (a reduction,
    # a scan, or max/min), so partial values of that kind pass through it under shard
    # (transforms/shard_rules.py); None: none.
    sbp_partial = None
    # (NumPy ufunc, dtype kinds): the impl is this ufunc for operands of these kinds (a
    # ufunc impl needs none), so the NumPy backend may call it with out=; None: not one
    ufunc = None

    def __init__(self, name, multiple_results=False):
        self.name = name
        self.multiple_results = multiple_results
        self.impl = None
        self.abstract_eval = None
        self.traits = set()
        if name in primitives:
            raise ValueError(f"primitive {name!r} is defined twice")
        primitives[name] = self

    def bind(self, *args, **params):
        return bind(self, *args, **params)

    def def_impl(self, fn):
        self.impl = fn
        return fn

    def def_abstract_eval(self, fn):
        self.abstract_eval = fn
        return fn

    def get_bind_params(self, params):
        """The keyword arguments `bind` takes for an equation's params (JAX's name, used by
        custom interpreters: `eqn.primitive.bind(*invals, **prim.get_bind_params(...))`)."""
        return dict(params)

    def __repr__(self):
        return self.name


# ----------------------------------------------------------------------------
# Traces and bind

_trace_tags = itertools.count()


class _TraceState(threading.local):
    trace = None  # set to the root EvalTrace by fflow.array


_state = _TraceState()


def current_trace():
    return _state.trace


class set_current_trace:
    """Context manager making `trace` current for the enclosed block."""

    __slots__ = ("trace", "prev")

    def __init__(self, trace):
        self.trace = trace

    def __enter__(self):
        self.prev = _state.trace
        _state.trace = self.trace
        return self.trace

    def __exit__(self, *exc):
        _state.trace = self.prev


class Trace:
    """Base class of all traces. Subclasses implement `process_primitive`."""

    def __init__(self, parent=None):
        self.parent = _state.trace if parent is None else parent
        self.tag = next(_trace_tags)
        self.finished = False

    def process_primitive(self, prim, args, params):
        raise NotImplementedError

    def is_own(self, x):
        return isinstance(x, Tracer) and x._trace is self

    def finish(self):
        self.finished = True

    def __repr__(self):
        return f"{type(self).__name__}(tag={self.tag})"


def bind(prim, *args, **params):
    """Apply `prim` to `args` on the current trace."""
    return _state.trace.process_primitive(prim, args, params)


def check_not_leaked(x, trace=None):
    """Raise if `x` is a tracer whose transform has already returned, or (given the
    `trace` that meets it) a tracer of a transformation that `trace` is not inside."""
    if trace is not None and isinstance(x, Tracer) and not x._trace.finished:
        t = trace.parent
        while t is not None and t is not x._trace:
            t = t.parent
        if t is None:
            raise user_error(
                UnexpectedTracerError,
                f"A value traced by {type(x._trace).__name__} ({x.aval.str_short()}) reached "
                f"{type(trace).__name__}, which runs outside that transformation. A common "
                "cause: a custom_jvp/custom_vjp function or rule that closes over a value "
                "being differentiated. Fix: pass such values as explicit arguments.",
            )
    if isinstance(x, Tracer) and x._trace.finished:
        raise user_error(
            UnexpectedTracerError,
            f"A value traced by {type(x._trace).__name__} escaped its transformation "
            f"(a leaked tracer, {x.aval.str_short()}"
            + (f", created at {x._source_info}" if getattr(x, "_source_info", None) else "")
            + "). Fix: return it from the transformed function instead of storing it "
            "in a global or a closure.",
        )


# ----------------------------------------------------------------------------
# Tracers


class Tracer:
    """A value being traced by a transform. Behaves like an array."""

    __slots__ = ("_trace", "__weakref__")
    __array_priority__ = 1000

    @property
    def aval(self):
        raise NotImplementedError

    @property
    def shape(self):
        return self.aval.shape

    @property
    def dtype(self):
        return self.aval.dtype

    @property
    def ndim(self):
        return len(self.aval.shape)

    @property
    def size(self):
        return self.aval.size

    @property
    def weak_type(self):
        return self.aval.weak_type

    @property
    def nbytes(self):
        return self.aval.size * self.aval.dtype.itemsize

    def copy(self):
        return self  # values are immutable: a copy is the value itself (as in JAX)

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __len__(self):
        if not self.aval.shape:
            raise user_error(TypeError, "len() of a 0-d array. Fix: use x.size or x.shape.")
        return self.aval.shape[0]

    def __iter__(self):
        if not self.aval.shape:
            raise user_error(
                TypeError,
                f"iteration over a 0-d traced array ({self.aval.str_short()}). Fix: a shape "
                "or a count must be a static Python value: pass it as a Python int and mark "
                "the argument static (static_argnums), or use x.shape.",
            )
        return (self[i] for i in range(self.aval.shape[0]))

    def __reduce__(self):
        raise user_error(
            TypeError,
            f"cannot pickle a traced value ({self.aval.str_short()}): inside a "
            "transformation it has no concrete value. Fix: pickle the function's result "
            "outside jit/grad/vmap.",
        )

    def _concrete(self, what):
        """Concrete value if this tracer has one (eager transforms); else raise."""
        value = self.concrete_value()
        if value is None:
            raise ConcretizationError(self, what)
        return value

    def concrete_value(self):
        """The concrete value behind this tracer, or None when it is abstract."""
        return None

    def __bool__(self):
        return bool(self._concrete("bool"))

    def __int__(self):
        return int(self._concrete("int"))

    def __float__(self):
        return float(self._concrete("float"))

    def __complex__(self):
        return complex(self._concrete("complex"))

    def __index__(self):
        return int(self._concrete("index"))

    def __array__(self, dtype=None, copy=None):
        value = np.asarray(self._concrete("array"))
        return value if dtype is None else value.astype(dtype)

    def __hash__(self):
        raise TypeError(
            "fflow arrays and tracers are not hashable; for a static argument "
            "pass a Python value (or a tuple) and list it in static_argnums."
        )

    def __repr__(self):
        return f"{type(self).__name__}<{self.aval.str_short()}>"


def is_tracer(x):
    return isinstance(x, Tracer)


def get_source_info():
    """The user's file:line for the equation being recorded now."""
    return user_source_info()
