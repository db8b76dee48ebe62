"""`jax.experimental.shard_map`: `shard_map` (see fflow/jax_sharding.py).

Example:
    >>> import numpy as np, fflow
    >>> from fflow import lax
    >>> from fflow.experimental.shard_map import shard_map
    >>> from fflow.jax_sharding import PartitionSpec as P, make_mesh
    >>> f = shard_map(lambda b: lax.psum(b.sum(), "x"), make_mesh((2,), ("x",)), P("x"), P())
    >>> float(f(np.arange(4.0)))
    6.0
"""

from fflow.jax_sharding import shard_map

__all__ = ["shard_map"]
