"""fflow.scipy: the parts of `jax.scipy` that fflow provides (`special`, `stats`,
`linalg`, `signal`)."""

from fflow.scipy import linalg, signal, special, stats  # noqa: F401
