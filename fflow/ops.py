"""`fflow.ops`: JAX's segment reductions (`jax.ops.segment_sum` and friends).

Example:
    >>> import fflow, fflow.numpy as jnp
    >>> fflow.ops.segment_sum(jnp.arange(4.0), jnp.array([0, 0, 1, 2]), num_segments=3).tolist()
    [1.0, 2.0, 3.0]
"""

import numpy as np

import fflow.numpy as jnp
from fflow import dtypes

__all__ = ["segment_max", "segment_min", "segment_prod", "segment_sum"]


def _segment(data, segment_ids, num_segments, op, identity):

    data = jnp.asarray(data)
    segment_ids = jnp.asarray(segment_ids)
    if num_segments is None:
        # needs concrete ids, as in JAX (pass num_segments under jit)
        num_segments = int(np.max(np.asarray(segment_ids))) + 1
    dtype = data.dtype
    if identity == "max":
        init = (
            -np.inf
            if dtypes.is_inexact(dtype)
            else (np.iinfo(dtype).min if dtype.kind != "b" else False)
        )
    elif identity == "min":
        init = (
            np.inf
            if dtypes.is_inexact(dtype)
            else (np.iinfo(dtype).max if dtype.kind != "b" else True)
        )
    else:
        init = identity
    out = jnp.full((int(num_segments),) + tuple(data.shape[segment_ids.ndim :]), init, dtype)
    return getattr(out.at[segment_ids], op)(data)


def segment_sum(data, segment_ids, num_segments=None, indices_are_sorted=False,
                unique_indices=False, bucket_size=None, mode=None):  # fmt: skip
    """Sum of `data` over rows sharing a segment id; ids out of range are dropped."""
    return _segment(data, segment_ids, num_segments, "add", 0)


def segment_prod(data, segment_ids, num_segments=None, indices_are_sorted=False,
                 unique_indices=False, bucket_size=None, mode=None):  # fmt: skip
    """Product over segments (empty segments give 1)."""
    return _segment(data, segment_ids, num_segments, "multiply", 1)


def segment_max(data, segment_ids, num_segments=None, indices_are_sorted=False,
                unique_indices=False, bucket_size=None, mode=None):  # fmt: skip
    """Maximum over segments (empty segments give -inf / the dtype's minimum)."""
    return _segment(data, segment_ids, num_segments, "max", "max")


def segment_min(data, segment_ids, num_segments=None, indices_are_sorted=False,
                unique_indices=False, bucket_size=None, mode=None):  # fmt: skip
    """Minimum over segments (empty segments give +inf / the dtype's maximum)."""
    return _segment(data, segment_ids, num_segments, "min", "min")
