"""fflow.scipy.interpolate.RegularGridInterpolator against scipy.interpolate's (linear,
nearest, vector values, points outside filled or extrapolated; JAX's record: corpus
grid_interpolation)."""

import numpy as np
import pytest

import fflow
from fflow.scipy.interpolate import RegularGridInterpolator

si = pytest.importorskip("scipy.interpolate")


@pytest.mark.parametrize("method", ["linear", "nearest"])
def test_matches_scipy(method):
    x, y = np.linspace(0.0, 2.0, 5), np.array([0.0, 0.5, 1.5, 3.0])
    data = (np.sin(x)[:, None] * np.cos(y)[None, :]).astype(np.float32)
    pts = np.array([[0.1, 0.2], [1.3, 2.9], [2.0, 3.0], [2.5, 1.0], [0.7, 0.6]], np.float32)
    want = si.RegularGridInterpolator((x, y), data, method=method, bounds_error=False)(pts)
    got = RegularGridInterpolator((x, y), data, method=method)(pts)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)
    vals = np.stack([data, 2 * data], -1)
    want = si.RegularGridInterpolator(
        (x, y), vals, method=method, bounds_error=False, fill_value=None
    )(pts[:4, None])
    got = fflow.jit(
        lambda p: RegularGridInterpolator((x, y), vals, method=method, fill_value=None)(p)
    )(pts[:4, None])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
