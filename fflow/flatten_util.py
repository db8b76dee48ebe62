"""fflow.flatten_util: `ravel_pytree`, JAX's flattening of a pytree into one vector.

Example:
    >>> import fflow.numpy as jnp
    >>> from fflow.flatten_util import ravel_pytree
    >>> flat, unravel = ravel_pytree({"a": jnp.ones(2), "b": jnp.zeros((1, 2))})
    >>> flat.tolist()
    [1.0, 1.0, 0.0, 0.0]
    >>> unravel(flat)["b"].shape
    (1, 2)
"""

import numpy as np

from fflow import dtypes
from fflow import numpy as jnp
from fflow.tree_util import tree_flatten, tree_unflatten


def ravel_pytree(pytree):
    """Flatten every leaf of `pytree` into one 1-D array (JAX's `ravel_pytree`).

    Leaves are promoted to their common dtype, as in JAX; `unravel(vector)` casts
    each part back to its leaf's dtype and shape and rebuilds the tree.

    Args:
        pytree: a pytree of arrays or scalars.

    Returns:
        (flat, unravel): the 1-D array and the function that inverts the flattening.
    """
    leaves, treedef = tree_flatten(pytree)
    leaves = [jnp.asarray(x) for x in leaves]
    shapes = [tuple(jnp.shape(x)) for x in leaves]
    leaf_dtypes = [jnp.result_type(x) for x in leaves]
    sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
    if leaves:
        to = jnp.result_type(*leaves)
        flat = jnp.concatenate([jnp.ravel(x).astype(to) for x in leaves])
    else:
        to = dtypes.float_
        flat = jnp.zeros((0,), to)

    def unravel(vector):
        if tuple(jnp.shape(vector)) != (sum(sizes),):
            raise ValueError(
                f"The unravel function expected an array of shape {(sum(sizes),)}, "
                f"got shape {tuple(jnp.shape(vector))}."
            )
        if jnp.result_type(vector) != to:
            raise TypeError(
                f"The unravel function expected an array of dtype {to}, "
                f"got dtype {jnp.result_type(vector)}."
            )
        parts, start = [], 0
        for shape, dtype, size in zip(shapes, leaf_dtypes, sizes):
            part = jnp.reshape(vector[start : start + size], shape)
            parts.append(part.astype(dtype) if dtype != to else part)
            start += size
        return tree_unflatten(treedef, parts)

    return flat, unravel


__all__ = ["ravel_pytree"]
