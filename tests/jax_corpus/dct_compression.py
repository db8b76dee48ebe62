# jax.scipy.fft's DCT as in image-compression examples: dctn with norm="ortho", keep the
# low frequencies, idctn back; a 1-D dct/idct round trip and jax.scipy.integrate.trapezoid
import jax
import jax.numpy as jnp
from jax.scipy.fft import dct, dctn, idct, idctn
from jax.scipy.integrate import trapezoid

img = jnp.outer(jnp.sin(jnp.linspace(0, 3, 8)), jnp.cos(jnp.linspace(0, 2, 8)))
coef = dctn(img, norm="ortho")
mask = (jnp.arange(8)[:, None] + jnp.arange(8)[None, :]) < 6
approx = idctn(coef * mask, norm="ortho")
x = jnp.array([1.0, 4.0, 2.0, 3.0])
xs = jnp.linspace(0.0, jnp.pi, 9)
result = (
    coef[:2, :3],
    jnp.abs(approx - img).max() < 0.1,
    dct(x),
    idct(dct(x)),
    dct(x, norm="ortho"),
    dct(x, n=6),
    trapezoid(jnp.sin(xs), xs),
    jax.grad(lambda v: jnp.sum(dct(v) ** 2))(x),
)
