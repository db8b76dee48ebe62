"""fflow.typing: JAX's `jax.typing` annotations (`ArrayLike`, `DTypeLike`).

Example:
    >>> import fflow.numpy as jnp
    >>> from fflow.typing import ArrayLike
    >>> def double(x: ArrayLike) -> jnp.ndarray:
    ...     return jnp.asarray(x) * 2
    >>> double(3).tolist()
    6
"""

from typing import Any

import numpy as np

from fflow.array import Array
from fflow.core import Tracer

# Anything fflow.numpy accepts as an array: arrays, tracers, NumPy values, Python scalars
ArrayLike = Array | Tracer | np.ndarray | np.bool_ | np.number | bool | int | float | complex

# Anything that names a dtype: np.dtype, a scalar type, a string, fflow.numpy.float32...
DTypeLike = str | type | np.dtype | Any

__all__ = ["ArrayLike", "DTypeLike"]
