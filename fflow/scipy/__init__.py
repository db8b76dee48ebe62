"""fflow.scipy: the parts of `jax.scipy` that fflow provides (`special`, `stats`,
`linalg`, `signal`, `sparse.linalg.cg`, `fft` (DCT), `integrate.trapezoid`,
`ndimage.map_coordinates`, `interpolate.RegularGridInterpolator`, `cluster.vq.vq`)."""

from fflow.scipy import (  # noqa: F401
    cluster,
    fft,
    integrate,
    interpolate,
    linalg,
    ndimage,
    signal,
    sparse,
    special,
    stats,
)
