"""fflow.scipy.ndimage.map_coordinates (jax.scipy.ndimage) against scipy.ndimage for
order 0 and 1 and every mode JAX supports (JAX's own records: corpus ndimage_warp)."""

import numpy as np
import pytest

import fflow
from fflow.scipy.ndimage import map_coordinates

ndi = pytest.importorskip("scipy.ndimage")


@pytest.mark.parametrize("mode", ["constant", "nearest", "wrap", "mirror", "reflect"])
def test_matches_scipy(mode):
    x = (np.arange(20.0).reshape(4, 5) ** 1.5).astype(np.float32)
    # away from exact .5 ties for order 0 (SciPy and JAX round those differently)
    c = [np.array([-1.3, 0.4, 2.2, 3.9, 5.6]), np.array([-0.6, 1.3, 4.7, 2.1, 6.2])]
    if mode == "constant":
        # SciPy gives cval for any point outside [0, n - 1]; JAX (and fflow) give each
        # outside corner cval and blend: compare SciPy inside, JAX's record at the edges
        c_jax = [np.array([-1.3, 0.5, 2.2, 3.9, 5.5]), np.array([-0.6, 1.5, 4.7, 2.0, 6.2])]
        np.testing.assert_allclose(
            map_coordinates(x, c_jax, order=1, cval=-1.0),
            [-1.0, 9.261405944824219, 16.84112548828125, 6.1092729568481445, -1.0],
            rtol=1e-5,
        )
        c = [np.array([0.0, 0.4, 2.2, 2.9]), np.array([0.3, 1.3, 3.7, 2.1])]
    for order in (0, 1):
        want = ndi.map_coordinates(
            x, c, order=order, mode=mode if mode != "wrap" else "grid-wrap", cval=-1.0
        )
        got = map_coordinates(x, c, order=order, mode=mode, cval=-1.0)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{mode} {order}")
    assert fflow.jit(lambda a: map_coordinates(a, c, order=1, mode=mode))(x).shape == c[0].shape


def test_integer_input_rounds_and_errors():
    out = map_coordinates(np.arange(6).reshape(2, 3), [np.array([0.5]), np.array([0.5])], order=1)
    assert out.dtype == np.int32 and out.tolist() == [2]  # (0 + 1 + 3 + 4) / 4 = 2 (JAX: 2)
    with pytest.raises(NotImplementedError):
        map_coordinates(np.ones((2, 2)), [np.zeros(1), np.zeros(1)], order=3)
    with pytest.raises(ValueError, match="one array"):
        map_coordinates(np.ones((2, 2)), [np.zeros(1)], order=1)
