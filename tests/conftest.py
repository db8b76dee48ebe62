"""Test-session settings: one BLAS thread per pytest worker (the suite runs with
`-n 2` on 2 cores; more threads only oversubscribe them), set before NumPy loads; and
the planner's device profile."""

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
# one planner profile for simulated devices and for the MPI ranks the tests launch (they
# inherit it), so a program gets the same plan on both and their numbers can be compared
# bit for bit; without it MPI ranks on one node plan with CPU_MPI
# (fflow/device_profile.py `default_profile`, tested in tests/test_device_profile.py)
os.environ.setdefault("FFLOW_DEVICE_PROFILE", "cpu")


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
