# jnp.fft: fft/ifft/rfft round trips and frequencies
import jax.numpy as jnp

x = jnp.array([1.0, 2.0, 0.0, -1.0])
X = jnp.fft.fft(x)
result = (
    X,
    jnp.fft.ifft(X).real,
    jnp.fft.rfft(x),
    jnp.fft.irfft(jnp.fft.rfft(x), n=4),
    jnp.fft.fftfreq(4),
    jnp.fft.fft2(jnp.eye(2)),
    jnp.abs(jnp.fft.fftshift(jnp.fft.fft(jnp.ones(4)))),
)
