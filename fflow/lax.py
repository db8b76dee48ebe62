"""fflow.lax: JAX's `jax.lax` names — thin wrappers over the primitives
(fflow/lax_ops.py), structured control flow (fflow/lax_control.py) and more
(fflow/lax_extra.py).

Binary ops take operands of one shape and dtype; a Python scalar operand is
converted to the other operand's dtype and broadcast, as `jax.lax` allows.

Example:
    >>> import fflow.numpy as jnp
    >>> from fflow import lax
    >>> lax.add(jnp.ones(2), 1.0).tolist()
    [2.0, 2.0]
    >>> lax.fori_loop(0, 3, lambda i, x: x * 2, jnp.ones(2)).tolist()
    [8.0, 8.0]
"""

import importlib

from fflow.core import primitives
from fflow.lax_control import (  # noqa: F401  (re-exported: __all__)
    all_gather,
    associative_scan,
    axis_index,
    cond,
    fori_loop,
    map,
    pmax,
    pmean,
    pmin,
    psum,
    scan,
    switch,
    while_loop,
)
from fflow.lax_conv import (  # noqa: F401  (re-exported: __all__)
    ConvDimensionNumbers,
    conv_dimension_numbers,
    conv_general_shape_tuple,
    padtype_to_pads,
    reduce_window_shape_tuple,
)
from fflow.lax_extra import (  # noqa: F401  (re-exported: __all__)
    Precision,
    conv,
    conv_general_dilated,
    conv_with_general_padding,
    cumlogsumexp,
    reduce,
    reduce_window,
    top_k,
)
from fflow.lax_ops import *  # noqa: F403
from fflow.lax_ops import __all__ as _ops_names

__all__ = sorted(
    (
        set(_ops_names)
        | {
            "all_gather",
            "associative_scan",
            "axis_index",
            "cond",
            "fori_loop",
            "map",
            "pmax",
            "pmean",
            "pmin",
            "psum",
            "scan",
            "switch",
            "while_loop",
            "Precision",
            "conv_general_dilated",
            "conv",
            "conv_with_general_padding",
            "ConvDimensionNumbers",
            "conv_dimension_numbers",
            "conv_general_shape_tuple",
            "padtype_to_pads",
            "reduce_window_shape_tuple",
            "cumlogsumexp",
            "reduce",
            "reduce_window",
            "top_k",
        }
    )
    # fflow-internal names of lax_ops that jax.lax does not have
    - {"stop_gradient_", "take_along_axis", "scatter_add_along_axis", "zeros_like"}
)


def __dir__():
    return list(__all__)


def __getattr__(name):
    # `lax.sin_p`, `lax.add_p`...: the registered primitives, as custom interpreters use them
    if name == "linalg":  # jax.lax.linalg: over fflow.numpy / fflow.scipy, layers above lax
        return importlib.import_module("fflow.lax_linalg")
    if name == "with_sharding_constraint":
        # jax.lax.with_sharding_constraint: the sharding API sits layers above lax
        return importlib.import_module("fflow.jax_sharding").with_sharding_constraint
    prim = primitives.get(name[:-2]) if name.endswith("_p") else None
    if prim is None:
        raise AttributeError(f"module 'fflow.lax' has no attribute {name!r}")
    return prim
