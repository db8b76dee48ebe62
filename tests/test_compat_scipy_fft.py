"""fflow.scipy.fft (jax.scipy.fft's DCT) and fflow.scipy.integrate.trapezoid against
SciPy / NumPy: every norm, inverse, n, axis and n-D form."""

import numpy as np
import pytest

import fflow
from fflow.scipy import fft, integrate

sf = pytest.importorskip("scipy.fft")


@pytest.mark.parametrize("norm", [None, "ortho"])
def test_dct_family_matches_scipy(norm):
    x = np.random.default_rng(0).normal(size=(4, 5)).astype(np.float32)
    for ours, ref in ((fft.dct, sf.dct), (fft.idct, sf.idct)):
        np.testing.assert_allclose(ours(x, norm=norm), ref(x, norm=norm), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ours(x, n=7, axis=0, norm=norm), ref(x, n=7, axis=0, norm=norm), rtol=1e-5, atol=1e-5)  # fmt: skip
        np.testing.assert_allclose(ours(x, n=3, norm=norm), ref(x, n=3, norm=norm), rtol=1e-5, atol=1e-5)  # fmt: skip
    np.testing.assert_allclose(fft.dctn(x, norm=norm), sf.dctn(x, norm=norm), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        fft.idctn(fft.dctn(x, norm=norm), norm=norm), x, rtol=1e-4, atol=1e-5
    )
    np.testing.assert_allclose(fflow.jit(lambda v: fft.dct(v, norm=norm))(x), sf.dct(x, norm=norm), rtol=1e-5, atol=1e-5)  # fmt: skip
    with pytest.raises(NotImplementedError):
        fft.dct(x, type=3)


def test_trapezoid_matches_numpy():
    xs = np.linspace(0.0, np.pi, 9)
    np.testing.assert_allclose(
        integrate.trapezoid(np.sin(xs), xs), np.trapezoid(np.sin(xs), xs), rtol=1e-6
    )
