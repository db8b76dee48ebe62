"""NumPy-style operators and methods, shared by `Array` and every `Tracer`.

On concrete arrays outside any transformation, the arithmetic operators take a
fast path straight to NumPy when the result is the same as the primitive's
(a float array with a Python scalar, or two arrays of one dtype and shape): this
keeps eager fflow close to NumPy's per-op cost.
"""

import numpy as np

import fflow.numpy as jnp
from fflow import core, dtypes
from fflow import lax_ops as lax
from fflow.array import Array, root_trace
from fflow.errors import user_error
from fflow.numpy.indexing import _IndexUpdateHelper, getitem


def _binop(name, ufunc, reflected=False):
    def method(self, other):
        fn = getattr(jnp, name)
        return fn(other, self) if reflected else fn(self, other)

    return method


def _fast_binop(name, ufunc, reflected=False):
    """An operator with an eager fast path for same-dtype operands."""
    state = core._state

    def method(self, other):
        if state.trace is root_trace and type(self) is Array and self._sharding is None:
            v = self._value
            t = type(other)
            if t is float or t is int:
                if v.dtype.kind == "f" and type(v) is np.ndarray:
                    out = ufunc(other, v) if reflected else ufunc(v, other)
                    out = out if type(out) is np.ndarray else np.asarray(out, v.dtype)
                    return Array(out, self._weak)  # a Python scalar keeps weakness (JAX)
            elif t is Array and other._sharding is None:
                w = other._value
                if (
                    type(v) is np.ndarray
                    and type(w) is np.ndarray
                    and v.dtype == w.dtype
                    and v.shape == w.shape
                    and v.dtype.kind == "f"
                ):
                    out = ufunc(w, v) if reflected else ufunc(v, w)
                    out = out if type(out) is np.ndarray else np.asarray(out, v.dtype)
                    return Array(out, self._weak and other._weak)
        fn = getattr(jnp, name)
        return fn(other, self) if reflected else fn(self, other)

    return method


class _AtProperty:
    def __get__(self, obj, objtype=None):
        return _IndexUpdateHelper(obj)


def _getitem(self, idx):
    return getitem(self, idx)


def _setitem(self, idx, value):
    raise user_error(
        TypeError,
        "fflow arrays are immutable: x[idx] = v is not supported. Fix: x = x.at[idx].set(v).",
    )


def _method(name):
    def method(self, *args, **kwargs):
        return getattr(jnp, name)(self, *args, **kwargs)

    method.__name__ = name
    return method


def _astype(self, dtype, copy=False):
    return lax.convert_element_type(self, dtypes.canonicalize(dtype))


def _reshape(self, *shape, order="C"):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    return jnp.reshape(self, shape, order=order)


def _transpose(self, *axes):
    if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
        axes = axes[0]
    return jnp.transpose(self, axes or None)


def _T(self):
    return jnp.transpose(self)


def _mT(self):
    return jnp.matrix_transpose(self)


def _flatten(self, order="C"):
    return jnp.ravel(self, order)


def _squeeze(self, axis=None):
    return jnp.squeeze(self, axis)


def _real(self):
    return jnp.real(self) if self.dtype.kind == "c" else self


def _conj(self):
    return jnp.conjugate(self) if self.dtype.kind == "c" else self


def _neg(self):
    if (
        core._state.trace is root_trace
        and type(self) is Array
        and type(self._value) is np.ndarray
        and self._sharding is None
    ):
        out = np.negative(self._value)
        # a 0-d input gives a NumPy scalar: keep the Array's value an ndarray
        return Array(out if type(out) is np.ndarray else np.asarray(out), self._weak)
    return jnp.negative(self)


def install(cls):
    ops = {
        "__add__": ("add", np.add, False),
        "__radd__": ("add", np.add, True),
        "__sub__": ("subtract", np.subtract, False),
        "__rsub__": ("subtract", np.subtract, True),
        "__mul__": ("multiply", np.multiply, False),
        "__rmul__": ("multiply", np.multiply, True),
        "__truediv__": ("true_divide", np.true_divide, False),
        "__rtruediv__": ("true_divide", np.true_divide, True),
    }
    for dunder, (name, ufunc, reflected) in ops.items():
        setattr(cls, dunder, _fast_binop(name, ufunc, reflected))
    slow = {
        "__floordiv__": ("floor_divide", False),
        "__rfloordiv__": ("floor_divide", True),
        "__mod__": ("remainder", False),
        "__rmod__": ("remainder", True),
        "__pow__": ("power", False),
        "__rpow__": ("power", True),
        "__matmul__": ("matmul", False),
        "__rmatmul__": ("matmul", True),
        "__lt__": ("less", False),
        "__le__": ("less_equal", False),
        "__gt__": ("greater", False),
        "__ge__": ("greater_equal", False),
        "__eq__": ("equal", False),
        "__ne__": ("not_equal", False),
        "__and__": ("bitwise_and", False),
        "__rand__": ("bitwise_and", True),
        "__or__": ("bitwise_or", False),
        "__ror__": ("bitwise_or", True),
        "__xor__": ("bitwise_xor", False),
        "__rxor__": ("bitwise_xor", True),
        "__lshift__": ("left_shift", False),
        "__rlshift__": ("left_shift", True),
        "__rshift__": ("right_shift", False),
        "__rrshift__": ("right_shift", True),
    }
    for dunder, (name, reflected) in slow.items():
        setattr(cls, dunder, _binop(name, None, reflected))
    cls.__neg__ = _neg
    cls.__pos__ = lambda self: self
    cls.__abs__ = _method("absolute")
    cls.__invert__ = _method("invert")
    cls.__getitem__ = _getitem
    cls.__setitem__ = _setitem
    cls.__divmod__ = lambda self, other: jnp.divmod(self, other)
    cls.__rdivmod__ = lambda self, other: jnp.divmod(other, self)
    cls.at = _AtProperty()
    cls.astype = _astype
    cls.reshape = _reshape
    cls.transpose = _transpose
    cls.T = property(_T)
    cls.mT = property(_mT)
    cls.flatten = _flatten
    cls.ravel = _flatten
    cls.squeeze = _squeeze
    cls.real = property(_real)
    cls.imag = property(lambda self: jnp.imag(self))
    cls.compress = lambda self, condition, axis=None: jnp.compress(condition, self, axis)
    cls.itemsize = property(lambda self: self.dtype.itemsize)
    cls.conj = _conj
    cls.conjugate = _conj
    for name in (
        "sum",
        "mean",
        "var",
        "std",
        "max",
        "min",
        "prod",
        "argmax",
        "argmin",
        "all",
        "any",
        "cumsum",
        "cumprod",
        "clip",
        "round",
        "dot",
        "swapaxes",
        "take",
        "repeat",
        "sort",
        "argsort",
        "trace",
        "diagonal",
        "nonzero",
        "ptp",
        "searchsorted",
        "argpartition",
        "choose",
    ):
        setattr(cls, name, _method(name))
    # the method named `round` on arrays maps to jnp.round
    return cls
