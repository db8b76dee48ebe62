"""fflow.scipy: the parts of `jax.scipy` that fflow provides (`special`, `stats`,
`linalg`, `signal`, `sparse.linalg.cg`)."""

from fflow.scipy import linalg, signal, sparse, special, stats  # noqa: F401
