# Image warping with jax.scipy.ndimage.map_coordinates (order 0 and 1, every mode), a
# rotation grid built with meshgrid, and a gradient with respect to the image
import jax
import jax.numpy as jnp
from jax.scipy.ndimage import map_coordinates

img = jnp.sin(jnp.arange(30.0).reshape(5, 6) / 4.0)
yy, xx = jnp.meshgrid(jnp.arange(5.0), jnp.arange(6.0), indexing="ij")
theta = 0.3
cy, cx = 2.0, 2.5
ry = jnp.cos(theta) * (yy - cy) - jnp.sin(theta) * (xx - cx) + cy
rx = jnp.sin(theta) * (yy - cy) + jnp.cos(theta) * (xx - cx) + cx
outs = [map_coordinates(img, [ry, rx], order=o, mode=m, cval=0.5)[1:4, 1:4]
        for o in (0, 1) for m in ("constant", "nearest", "wrap", "mirror", "reflect")]  # fmt: skip
g = jax.grad(lambda im: jnp.sum(map_coordinates(im, [ry, rx], order=1) ** 2))(img)
result = (outs, g[:2, :3], jax.jit(lambda im: map_coordinates(im, [ry, rx], order=1))(img)[0, :3])
