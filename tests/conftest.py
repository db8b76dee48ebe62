"""Test-session settings: one BLAS thread per pytest worker (the suite runs with
`-n 2` on 2 cores; more threads only oversubscribe them). Set before NumPy loads."""

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
