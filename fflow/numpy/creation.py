"""Array creation: array, asarray, zeros, ones, full, *_like, arange, linspace, eye..."""

import numpy as np

from fflow import dtypes
from fflow import lax_ops as lax
from fflow.array import Array, is_eager
from fflow.core import Tracer
from fflow.errors import ConcretizationError, user_error
from fflow.numpy._util import default_dtype_array, info, mark_weak, operand, strong
from fflow.numpy.elementwise import add, multiply, subtract
from fflow.numpy.shapes import broadcast_arrays, broadcast_to, moveaxis, reshape, stack


def _dtype(dtype):
    return None if dtype is None else dtypes.canonicalize(dtype)


def array(object, dtype=None, copy=True, ndmin=0):  # noqa: A002
    """Create an array. Python values get JAX's defaults (float32, int32); 64-bit
    values and dtypes are narrowed to 32 bits unless x64 is on, as in JAX.

    Example:
        >>> import fflow.numpy as jnp
        >>> jnp.array([1.0, 2.0]).dtype
        dtype('float32')
    """
    dtype = _dtype(dtype)
    if isinstance(object, (Array, Tracer)):
        out = object if dtype is None else lax.convert_element_type(object, dtype)
        if copy and isinstance(out, Array) and out is object:
            out = Array(np.array(object._value), object._weak)
    elif isinstance(object, (list, tuple)) and _contains_traced(object):
        out = strong(stack([array(o) for o in object]))  # JAX: a list is never weak
        if dtype is not None:
            out = lax.convert_element_type(out, dtype)
    else:
        weak = isinstance(object, (int, float, complex)) and not isinstance(object, np.generic)
        if isinstance(object, np.ndarray) or isinstance(object, np.generic):
            value = np.array(object, dtype=dtype, copy=True)
        else:
            try:
                value = np.array(object, dtype=dtype)
            except ValueError as e:
                raise _ragged_error(object, e) from None
        if dtype is None:  # 64-bit -> 32-bit unless x64 is on
            value = default_dtype_array(value)
        out = Array(value, weak_type=weak and dtype is None)
    if ndmin and info(out)[2].__len__() < ndmin:
        shape = info(out)[2]
        out = lax.reshape(out, (1,) * (ndmin - len(shape)) + tuple(shape))
    return out


def _contains_traced(seq):
    for e in seq:
        if isinstance(e, (Tracer, Array)):
            return True
        if isinstance(e, (list, tuple)) and _contains_traced(e):
            return True
    return False


def asarray(a, dtype=None, order=None, copy=None):
    """Like `array`, without copying an fflow array that already fits."""
    if isinstance(a, (Array, Tracer)) and (dtype is None or info(a)[0] == _dtype(dtype)):
        return a
    if isinstance(a, np.ndarray) and (dtype is None or a.dtype == _dtype(dtype)):
        value = default_dtype_array(a)
        # the caller may write into `a` later; JAX copies too
        return Array(value.copy() if value is a else value)
    return array(a, dtype=dtype, copy=False)


def _shape(shape):
    """A static shape, checked: JAX rejects float, negative and traced sizes."""
    dims = (shape,) if not isinstance(shape, (tuple, list)) else tuple(shape)
    out = []
    for d in dims:
        if isinstance(d, Tracer):
            raise user_error(
                TypeError,
                f"shapes must be static, got a traced value {d.aval.str_short()} in shape "
                f"{shape!r}. Fix: pass the size as a Python int and mark that argument static "
                "(jit(f, static_argnums=...)), or derive it from x.shape.",
            )
        if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)):
            if isinstance(d, Array) and d.ndim == 0 and d.dtype.kind in "iu":
                d = int(d)
            else:
                raise user_error(
                    TypeError,
                    f"shape {shape!r} has a non-integer entry {d!r}. Fix: use ints, "
                    f"e.g. ({', '.join(str(int(x)) if _num(x) else '...' for x in dims)}).",
                )
        if d < 0:
            raise user_error(
                ValueError,
                f"shape {shape!r} has a negative dimension {int(d)}. Fix: sizes must be >= 0.",
            )
        out.append(int(d))
    return tuple(out)


def _num(x):
    return isinstance(x, (int, float, np.number)) and not isinstance(x, bool)


def zeros(shape, dtype=None):
    return full(shape, 0, dtype or dtypes.float_)


def ones(shape, dtype=None):
    return full(shape, 1, dtype or dtypes.float_)


def empty(shape, dtype=None):
    return zeros(shape, dtype)


def full(shape, fill_value, dtype=None):
    dtype = _dtype(dtype)
    if isinstance(fill_value, (Array, Tracer)):
        out = broadcast_to(fill_value, _shape(shape))
        return out if dtype is None else lax.convert_element_type(out, dtype)
    weak = dtype is None and type(fill_value) in (int, float, complex)
    if dtype is None:
        dtype = default_dtype_array(np.asarray(fill_value)).dtype
    # a broadcast of a scalar: staged as one equation under jit, a view eagerly
    out = lax.full(_shape(shape), np.asarray(fill_value, dtype), dtype)
    if weak:  # JAX: full(shape, 2.0) is weakly typed
        out = mark_weak(out)
    return Array(out) if type(out) is np.ndarray else out  # a 0-d result is an Array too


def _duck_typed(a):
    return (
        not isinstance(a, (Array, Tracer, np.ndarray, np.generic))
        and hasattr(a, "shape")
        and hasattr(a, "dtype")
    )


def zeros_like(a, dtype=None, shape=None):
    return full_like(a, 0, dtype, shape)


def ones_like(a, dtype=None, shape=None):
    return full_like(a, 1, dtype, shape)


def empty_like(a, dtype=None, shape=None):
    return full_like(a, 0, dtype, shape)


def full_like(a, fill_value, dtype=None, shape=None):
    if _duck_typed(a):  # a ShapeDtypeStruct or another shape-and-dtype object, as JAX takes
        d, weak, s = np.dtype(a.dtype), bool(getattr(a, "weak_type", False)), tuple(a.shape)
    else:
        d, weak, s = info(operand(a))  # a Python list raises TypeError, as in JAX
    keep_weak = weak and dtype is None  # JAX: zeros_like(weak) stays weak
    dtype = _dtype(dtype) or d
    shape = s if shape is None else _shape(shape)
    if not isinstance(fill_value, (Tracer, Array)):
        fill_value = np.asarray(fill_value, dtype)
    out = lax.full(shape, fill_value, dtype)
    if keep_weak:
        return mark_weak(out)
    if type(out) is np.ndarray and is_eager():
        return Array(out)  # shape (): still an Array (traced: stays a literal)
    return out


def arange(start, stop=None, step=None, dtype=None):
    """Evenly spaced values (static bounds). Int bounds give int32, floats float32."""
    for v in (start, stop, step):
        if isinstance(v, Tracer):
            raise ConcretizationError(v, "int")
    if stop is None:
        start, stop = 0, start
    if step is None:
        step = 1
    value = np.arange(start, stop, step)
    value = value.astype(_dtype(dtype)) if dtype is not None else default_dtype_array(value)
    return Array(value)


def linspace(start, stop, num=50, endpoint=True, retstep=False, dtype=None, axis=0):
    if isinstance(start, (Tracer, Array)) or isinstance(stop, (Tracer, Array)):
        start, stop = broadcast_arrays(start, stop)
        nd = len(info(start)[2])
        t = np.linspace(0.0, 1.0, num, endpoint=endpoint, dtype=np.float32)
        t = t.reshape((num,) + (1,) * nd)
        delta = subtract(stop, start)
        out = add(reshape(start, (1,) + tuple(info(start)[2])), multiply(t, delta))
        out = moveaxis(out, 0, axis) if axis else out
        if dtype is not None:
            out = out.astype(_dtype(dtype))
        return (out, delta / max(num - 1 if endpoint else num, 1)) if retstep else out
    value, step = np.linspace(start, stop, num, endpoint=endpoint, retstep=True, axis=axis)
    value = value.astype(_dtype(dtype) or dtypes.float_)
    out = Array(value)
    # JAX: the step is an array of the result's dtype (not a Python float64)
    return (out, Array(np.asarray(step, value.dtype))) if retstep else out


def logspace(start, stop, num=50, endpoint=True, base=10.0, dtype=None, axis=0):
    value = np.logspace(start, stop, num, endpoint=endpoint, base=base, axis=axis)
    return Array(value.astype(_dtype(dtype) or dtypes.float_))


def eye(N, M=None, k=0, dtype=None):
    return Array(np.eye(N, M, k, dtype=_dtype(dtype) or dtypes.float_))


def identity(n, dtype=None):
    return eye(n, dtype=dtype)


def tri(N, M=None, k=0, dtype=None):
    return Array(np.tri(N, M, k, dtype=_dtype(dtype) or dtypes.float_))


def meshgrid(*xi, indexing="xy", sparse=False, copy=True):

    n = len(xi)
    shapes = [info(x)[2][0] for x in xi]
    outs = []
    for i, x in enumerate(xi):
        shape = [1] * n
        shape[i] = shapes[i]
        if indexing == "xy" and n >= 2 and i < 2:
            shape[0], shape[1] = shape[1], shape[0]
        full_shape = list(shapes)
        if indexing == "xy" and n >= 2:
            full_shape[0], full_shape[1] = full_shape[1], full_shape[0]
        r = reshape(x, shape)
        outs.append(r if sparse else broadcast_to(r, full_shape))
    return outs


def from_numpy(x):
    return Array(default_dtype_array(np.asarray(x)))


def _ragged_error(obj, err):
    if "inhomogeneous" in str(err) or "sequence" in str(err):
        return user_error(
            ValueError,
            "cannot make an array from a ragged nested sequence (rows of different lengths). "
            "Fix: pad the rows to one length, or keep them as a list of arrays.",
        )
    return user_error(ValueError, f"cannot make an array from {type(obj).__name__}: {err}")


# the jax.numpy names this module gives fflow.numpy (its `import *`)
__all__ = [
    "arange",
    "array",
    "asarray",
    "empty",
    "empty_like",
    "eye",
    "full",
    "full_like",
    "identity",
    "linspace",
    "logspace",
    "meshgrid",
    "ones",
    "ones_like",
    "tri",
    "zeros",
    "zeros_like",
]
