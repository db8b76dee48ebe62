"""fflow.experimental: JAX's `jax.experimental` names that fflow provides.

`enable_x64()` / `disable_x64()` switch 64-bit mode for a block, as JAX's do;
`io_callback` is `fflow.callbacks.io_callback`.

Example:
    >>> import numpy as np, fflow.numpy as jnp
    >>> from fflow.experimental import enable_x64
    >>> with enable_x64():
    ...     print(jnp.asarray(np.ones(2)).dtype)
    float64
    >>> jnp.asarray(np.ones(2)).dtype
    dtype('float32')
"""

import contextlib

from fflow import dtypes
from fflow.config import config


@contextlib.contextmanager
def enable_x64(new_val=True):
    """64-bit mode on (or `new_val`) inside the block, restored after it."""
    old = config.enable_x64
    config.update("enable_x64", bool(new_val))
    try:
        yield
    finally:
        config.update("enable_x64", old)


def disable_x64():
    """64-bit mode off inside the block (a context manager)."""
    return enable_x64(False)


def x64_enabled():
    return dtypes.x64_enabled()


def __getattr__(name):
    # submodules JAX programs import from jax.experimental
    import importlib

    if name in ("shard_map", "pjit", "mesh_utils", "multihost_utils", "checkify", "ode"):
        return importlib.import_module(f"fflow.experimental.{name}")
    if name == "io_callback":
        return importlib.import_module("fflow.callbacks").io_callback
    raise AttributeError(f"module 'fflow.experimental' has no attribute {name!r}")
