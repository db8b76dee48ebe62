"""fflow.scipy: the parts of `jax.scipy` that fflow provides (`special`)."""

from fflow.scipy import special, stats  # noqa: F401
