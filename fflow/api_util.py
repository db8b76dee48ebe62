"""The one wrapper that lifts flat-list transforms to pytrees and `argnums`."""

import numpy as np

from fflow.array import Array
from fflow.core import Tracer
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


def as_value(x):
    """Leaves entering a transform: Python/NumPy scalars become arrays (weak for Python)."""
    t = type(x)
    if t is Array or isinstance(x, Tracer):
        return x
    if t in (float, int, bool, complex):
        from fflow import dtypes

        return Array(np.asarray(x, dtypes.python_scalar_dtype(x)), weak_type=True)
    if t is np.ndarray:
        return Array(x.copy())  # never alias the caller's buffer (JAX copies to the device)
    if isinstance(x, np.generic):
        return Array(np.asarray(x))
    if isinstance(x, Array):
        return x
    from fflow.numpy._util import asarray_value

    try:
        return Array(asarray_value(x))
    except Exception:
        raise TypeError(
            f"a transformed function's argument or result has a leaf of type "
            f"{type(x).__name__}, which is not an array; pass arrays, or make it static "
            f"(static_argnums) or a registered pytree."
        ) from None


def normalize_argnums(argnums, nargs, what="argnums"):
    single = isinstance(argnums, int)
    nums = (argnums,) if single else tuple(argnums)
    out = []
    for n in nums:
        if not -nargs <= n < nargs:
            raise ValueError(f"{what}={argnums} is out of range for {nargs} positional arguments")
        out.append(n % nargs)
    return single, tuple(out)
