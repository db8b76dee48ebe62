"""`jax.scipy.sparse`: `linalg.cg` (iterative solves with a matrix or a linear function)."""

from fflow.scipy.sparse import linalg  # noqa: F401
