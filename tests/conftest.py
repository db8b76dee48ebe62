"""Test-session settings: one BLAS thread per pytest worker (the suite runs with
`-n 2` on 2 cores; more threads only oversubscribe them), set before NumPy loads."""

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")


import pytest  # noqa: E402


@pytest.fixture(scope="module")
def x64():
    """64-bit mode on for a module that tests float64 on purpose:
    `pytestmark = pytest.mark.usefixtures("x64")`."""
    from fflow.experimental import enable_x64

    with enable_x64():
        yield


@pytest.fixture
def x64_case():
    """64-bit mode on for one test (`@pytest.mark.usefixtures("x64_case")`)."""
    from fflow.experimental import enable_x64

    with enable_x64():
        yield
