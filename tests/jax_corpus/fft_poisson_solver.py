# Spectral methods with jnp.fft: a periodic Poisson solve, a convolution by FFT compared
# with jnp.convolve, rfft/irfft round trips and fftfreq, plus a gradient through fft
import jax
import jax.numpy as jnp

n = 16
xs = jnp.linspace(0.0, 2 * jnp.pi, n, endpoint=False)
f = jnp.sin(3 * xs) + 0.5 * jnp.cos(xs)
k = jnp.fft.fftfreq(n, d=1.0 / n)
fk = jnp.fft.fft(f)
uk = jnp.where(k == 0, 0.0, -fk / jnp.where(k == 0, 1.0, k**2))
u = jnp.real(jnp.fft.ifft(uk))
a = jnp.array([1.0, 2.0, 3.0, 0.0, 0.0])
v = jnp.array([0.5, -1.0, 0.0, 0.0, 0.0])
circ = jnp.real(jnp.fft.ifft(jnp.fft.fft(a) * jnp.fft.fft(v)))
r = jnp.fft.rfft(f)
g = jax.grad(lambda f: jnp.sum(jnp.abs(jnp.fft.rfft(f)) ** 2))(f)
img = jnp.outer(jnp.sin(xs[:4]), jnp.cos(xs[:4]))
result = (
    u[:4],
    circ[:3],
    jnp.convolve(a[:3], v[:2]),
    jnp.fft.irfft(r, n)[:4],
    jnp.abs(r[:5]),
    k[:5],
    jnp.fft.rfftfreq(8),
    g[:4],
    jnp.abs(jnp.fft.fft2(img))[:2, :2],
    jnp.fft.fftshift(jnp.arange(6)),
)
