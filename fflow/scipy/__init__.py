"""fflow.scipy: the parts of `jax.scipy` that fflow provides (`special`, `stats`,
`linalg`, `signal`, `sparse.linalg.cg`, `fft` (DCT), `integrate.trapezoid`,
`ndimage.map_coordinates`, `interpolate.RegularGridInterpolator`)."""

from fflow.scipy import fft, integrate, interpolate, linalg, ndimage, signal, sparse, special, stats  # noqa: F401
