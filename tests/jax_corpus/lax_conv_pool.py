# A small CNN forward: conv_general_dilated, reduce_window max/avg pooling
import jax
import jax.numpy as jnp
from jax import lax

key = jax.random.PRNGKey(0)
x = jax.random.normal(key, (2, 1, 6, 6))  # NCHW
w = jax.random.normal(jax.random.fold_in(key, 1), (3, 1, 3, 3))  # OIHW
y = lax.conv_general_dilated(x, w, window_strides=(1, 1), padding="SAME")
y2 = lax.conv_general_dilated(
    jnp.transpose(x, (0, 2, 3, 1)),
    jnp.transpose(w, (2, 3, 1, 0)),
    (2, 2),
    "VALID",
    dimension_numbers=("NHWC", "HWIO", "NHWC"),
)
pooled = lax.reduce_window(y, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
avg = lax.reduce_window(y, 0.0, lax.add, (1, 1, 2, 2), (1, 1, 2, 2), "VALID") / 4
g = jax.grad(lambda w: lax.conv(x, w, (1, 1), "VALID").sum())(w)
result = (
    y.shape,
    y[0, 0, :2, :2],
    y2.shape,
    y2[0, 0, 0],
    pooled.shape,
    pooled[1, 2],
    avg[0, 0],
    g[0, 0],
)
