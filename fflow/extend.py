"""`jax.extend`: `fflow.extend.core` holds the names for new primitives and custom
interpreters (`Primitive`, `ClosedJaxpr`, `Jaxpr`, `Literal`, `Var`, `eval_jaxpr`...).

Example:
    >>> import numpy as np, fflow, fflow.numpy as jnp
    >>> from fflow.extend import core
    >>> twice_p = core.Primitive("twice")
    >>> _ = twice_p.def_impl(lambda x: 2 * x)
    >>> _ = twice_p.def_abstract_eval(lambda x: core.ShapedArray(x.shape, x.dtype))
    >>> fflow.jit(lambda x: twice_p.bind(x) + 1)(jnp.ones(2)).tolist()
    [3.0, 3.0]
"""

import types

from fflow import jax_core as core
from fflow.core import primitives as _registry


def _primitives():
    # `jax.extend.core.primitives.sin_p`...: fflow's registered primitives
    ns = types.ModuleType("fflow.extend.core.primitives")
    for name, prim in _registry.items():
        setattr(ns, name + "_p", prim)
    return ns


def __getattr__(name):
    if name == "primitives":
        return _primitives()
    raise AttributeError(f"module 'fflow.extend' has no attribute {name!r}")


__all__ = ["core"]
