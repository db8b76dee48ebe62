"""`jax.stages`: the objects of ahead-of-time compilation, `jit(f).lower(x)` ->
`Lowered`, `.compile()` -> `Compiled`.

Example:
    >>> import fflow, fflow.numpy as jnp
    >>> from fflow import stages
    >>> lowered = fflow.jit(lambda x: x * 2).lower(jnp.ones(2))
    >>> isinstance(lowered, stages.Lowered), isinstance(lowered.compile(), stages.Compiled)
    (True, True)
"""

from fflow.transforms.jit import Jitted as Wrapped
from fflow.transforms.lowered import Compiled, Lowered

__all__ = ["Compiled", "Lowered", "Wrapped"]
