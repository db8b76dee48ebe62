"""`jax.scipy.cluster`: `vq.vq` (assign observations to their nearest code)."""

from fflow.scipy.cluster import vq  # noqa: F401
