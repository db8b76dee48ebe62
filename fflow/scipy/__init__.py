"""fflow.scipy: the parts of `jax.scipy` that fflow provides (`special`, `stats`,
`linalg`, `signal`, `sparse.linalg.cg`, `fft` (DCT), `integrate.trapezoid`)."""

from fflow.scipy import fft, integrate, linalg, signal, sparse, special, stats  # noqa: F401
