"""`fflow.tree`: the short names of JAX's `jax.tree` module.

Example:
    >>> import fflow
    >>> fflow.tree.map(lambda x: x + 1, {"a": 1, "b": (2, 3)})
    {'a': 2, 'b': (3, 4)}
"""

from fflow.tree_util import (
    tree_all as all,  # noqa: A004
)
from fflow.tree_util import (
    tree_flatten as flatten,
)
from fflow.tree_util import (
    tree_flatten_with_path as flatten_with_path,
)
from fflow.tree_util import (
    tree_leaves as leaves,
)
from fflow.tree_util import (
    tree_leaves_with_path as leaves_with_path,
)
from fflow.tree_util import (
    tree_map as map,  # noqa: A004
)
from fflow.tree_util import (
    tree_map_with_path as map_with_path,
)
from fflow.tree_util import (
    tree_reduce as reduce,
)
from fflow.tree_util import (
    tree_structure as structure,
)
from fflow.tree_util import (
    tree_transpose as transpose,
)
from fflow.tree_util import (
    tree_unflatten as unflatten,
)

__all__ = [
    "all",
    "flatten",
    "flatten_with_path",
    "leaves_with_path",
    "map_with_path",
    "leaves",
    "map",
    "reduce",
    "structure",
    "transpose",
    "unflatten",
]
