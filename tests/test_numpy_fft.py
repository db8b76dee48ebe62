"""fflow.numpy.fft against numpy.fft (norms, n=, axes, 2-D/N-D), under jit and vmap,
and its derivatives (forward mode on complex inputs, reverse mode through fft)."""

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp
from fflow.experimental import enable_x64

RNG = np.random.RandomState(0)


def _re(z):
    return fflow.lax.convert_element_type(z, np.float64)  # the real part


X = RNG.randn(4, 6)
Z = RNG.randn(4, 6) + 1j * RNG.randn(4, 6)


@pytest.mark.parametrize("norm", [None, "ortho", "forward"])
@pytest.mark.usefixtures("x64_case")  # float64 reference on purpose
def test_transforms_match_numpy(norm):
    cases = [
        (jnp.fft.fft(X, norm=norm), np.fft.fft(X, norm=norm)),
        (jnp.fft.ifft(Z, norm=norm), np.fft.ifft(Z, norm=norm)),
        (jnp.fft.rfft(X, norm=norm), np.fft.rfft(X, norm=norm)),
        (jnp.fft.irfft(np.fft.rfft(X), n=6, norm=norm), np.fft.irfft(np.fft.rfft(X), 6, norm=norm)),
        (jnp.fft.fft(X, n=8, axis=0, norm=norm), np.fft.fft(X, n=8, axis=0, norm=norm)),
        (jnp.fft.fft(X, n=3, norm=norm), np.fft.fft(X, n=3, norm=norm)),
        (jnp.fft.fft2(X, norm=norm), np.fft.fft2(X, norm=norm)),
        (jnp.fft.ifft2(Z, norm=norm), np.fft.ifft2(Z, norm=norm)),
        (jnp.fft.rfft2(X, norm=norm), np.fft.rfft2(X, norm=norm)),
        (
            jnp.fft.irfft2(np.fft.rfft2(X), s=(4, 6), norm=norm),
            np.fft.irfft2(np.fft.rfft2(X), s=(4, 6), norm=norm),
        ),
        (jnp.fft.fftn(X, norm=norm), np.fft.fftn(X, norm=norm)),
        (jnp.fft.rfftn(X, axes=(0,), norm=norm), np.fft.rfftn(X, axes=(0,), norm=norm)),
    ]
    for ours, ref in cases:
        assert np.asarray(ours).shape == ref.shape
        np.testing.assert_allclose(np.asarray(ours), ref, rtol=1e-10, atol=1e-10)


def test_dtypes_and_helpers():
    assert jnp.fft.fft(np.ones(4, np.float32)).dtype == np.complex64
    assert jnp.fft.rfft(np.ones(4, np.float64)).dtype == np.complex64  # x64 off, as in JAX
    with enable_x64():
        assert jnp.fft.rfft(np.ones(4, np.float64)).dtype == np.complex128
    assert jnp.fft.irfft(np.ones(3, np.complex64)).dtype == np.float32
    assert jnp.fft.fft(np.arange(5)).dtype == np.complex64
    np.testing.assert_allclose(np.asarray(jnp.fft.fftfreq(6, 0.5)), np.fft.fftfreq(6, 0.5))
    np.testing.assert_allclose(np.asarray(jnp.fft.rfftfreq(6)), np.fft.rfftfreq(6))
    x32 = X.astype(np.float32)  # a shift moves values: exact in the input's own dtype
    np.testing.assert_array_equal(np.asarray(jnp.fft.fftshift(x32)), np.fft.fftshift(x32))
    np.testing.assert_array_equal(
        np.asarray(jnp.fft.ifftshift(x32, axes=1)), np.fft.ifftshift(x32, axes=1)
    )


@pytest.mark.usefixtures("x64_case")  # float64 reference on purpose
def test_jit_vmap_and_derivatives():
    np.testing.assert_allclose(
        np.asarray(fflow.jit(lambda a: jnp.fft.rfft(a))(X)), np.fft.rfft(X), rtol=1e-10
    )
    np.testing.assert_allclose(
        np.asarray(fflow.vmap(jnp.fft.fft)(X)), np.fft.fft(X, axis=-1), rtol=1e-10
    )
    _, t = fflow.jvp(jnp.fft.fft, (Z,), (Z,))
    np.testing.assert_allclose(np.asarray(t), np.fft.fft(Z), rtol=1e-10)  # linear
    w = RNG.randn(6)
    g = fflow.grad(lambda a: jnp.sum(_re(jnp.fft.fft(a)) * w))(X[0])
    # d/dx_j sum_k w_k Re(F x)_k = sum_k w_k cos(2 pi j k / n)
    n = 6
    ref = np.cos(2 * np.pi * np.outer(np.arange(n), np.arange(n)) / n) @ w
    np.testing.assert_allclose(np.asarray(g), ref, rtol=1e-10)


def _fd_grad(f, x, eps=1e-6):
    out = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = eps
        out[i] = (float(f(x + e)) - float(f(x - e))) / (2 * eps)
    return out


@pytest.mark.usefixtures("x64_case")  # float64 reference on purpose
def test_reverse_mode_through_rfft_and_irfft():
    x = RNG.randn(2, 6)
    w = RNG.randn(2, 4)
    w2 = RNG.randn(2, 6)
    f = lambda a: jnp.sum(_re(jnp.fft.rfft(a)) * w)  # noqa: E731
    np.testing.assert_allclose(np.asarray(fflow.grad(f)(x)), _fd_grad(f, x), rtol=1e-6, atol=1e-8)
    g = lambda a: jnp.sum(jnp.fft.irfft(jnp.fft.rfft(a) * 2.0, n=6) * w2)  # noqa: E731
    np.testing.assert_allclose(np.asarray(fflow.grad(g)(x)), _fd_grad(g, x), rtol=1e-6, atol=1e-8)
    h = lambda a: jnp.sum(jnp.fft.irfft2(jnp.fft.rfft2(a), s=(2, 6)) * w2)  # noqa: E731
    np.testing.assert_allclose(np.asarray(fflow.grad(h)(x)), _fd_grad(h, x), rtol=1e-6, atol=1e-8)
