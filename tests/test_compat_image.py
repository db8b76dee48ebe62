"""fflow.image.resize (jax.image.resize) against NumPy: half-pixel-centred linear
interpolation written out by hand, nearest, a constant image staying constant for every
kernel, and JAX's recorded numbers in the corpus program image_resize."""

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp
from fflow.image import resize


def _linear_up(x, n):
    # NumPy reference: sample j at (j + 0.5) * m / n - 0.5, clamped to the edge samples
    m = x.shape[0]
    pos = np.clip((np.arange(n) + 0.5) * m / n - 0.5, 0, m - 1)
    return np.interp(pos, np.arange(m), x)


def test_linear_upsampling_and_nearest_match_numpy():
    x = np.random.default_rng(0).normal(size=7).astype(np.float32)
    np.testing.assert_allclose(resize(x, (16,), "linear"), _linear_up(x, 16), rtol=1e-5, atol=1e-6)
    img = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    want = np.stack([_linear_up(c, 9) for c in np.stack([_linear_up(r, 6) for r in img]).T]).T
    np.testing.assert_allclose(resize(img, (9, 6), "bilinear"), want, rtol=1e-5, atol=1e-6)
    near = resize(np.arange(4.0), (8,), "nearest")
    assert near.tolist() == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0]


@pytest.mark.parametrize("method", ["linear", "cubic", "lanczos3", "lanczos5"])
def test_constant_images_stay_constant(method):
    for shape in ((9, 11), (3, 2)):
        out = fflow.jit(lambda x, shape=shape: resize(x, shape, method))(jnp.full((6, 5), 2.5))
        np.testing.assert_allclose(out, np.full(shape, 2.5), rtol=1e-5)


def test_integer_images_and_errors():
    out = resize(np.array([0, 100, 200], np.uint8), (6,), "linear")
    assert out.dtype == np.float32 and out.tolist() == [0, 25, 75, 125, 175, 200]  # as JAX
    with pytest.raises(ValueError, match="one entry per dimension"):
        resize(np.ones((2, 2)), (4,), "linear")
    with pytest.raises(ValueError, match="unknown method"):
        resize(np.ones(2), (4,), "bogus")
