# jax.image.resize on a small image batch: up- and down-sampling with each method, with
# and without antialiasing, and a resize inside a jitted, differentiated loss
import jax
import jax.numpy as jnp

img = jnp.arange(2 * 6 * 5 * 3, dtype=jnp.float32).reshape(2, 6, 5, 3) / 10.0
img = jnp.sin(img)
result = (
    jax.image.resize(img, (2, 12, 10, 3), "linear")[0, :3, :3, 0],
    jax.image.resize(img, (2, 3, 2, 3), "linear")[1, :, :, 1],
    jax.image.resize(img, (2, 3, 2, 3), "linear", antialias=False)[1, :, :, 1],
    jax.image.resize(img, (2, 9, 7, 3), "cubic")[0, :2, :3, 2],
    jax.image.resize(img, (2, 4, 4, 3), "lanczos3")[1, 0, :, 0],
    jax.image.resize(img, (2, 8, 3, 3), "lanczos5")[0, :2, :, 0],
    jax.image.resize(img, (2, 9, 7, 3), "nearest")[0, :4, :4, 0],
    jax.image.resize(jnp.arange(4.0), (7,), "bilinear"),
    jax.jit(jax.grad(lambda x: jnp.sum(jax.image.resize(x, (2, 4, 3, 3), "linear") ** 2)))(img)[
        0, :2, :2, 0
    ],
)
