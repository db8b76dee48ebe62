# pure_callback into NumPy under jit and vmap; io_callback for logging; debug.print
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback


def np_sinc(x):
    return np.sinc(x).astype(x.dtype)


def f(x):
    return jax.pure_callback(
        np_sinc, jax.ShapeDtypeStruct(x.shape, x.dtype), x, vmap_method="sequential"
    )


logged = []


def log(x):
    logged.append(np.asarray(x).copy())
    return np.array(0, np.int32)


@jax.jit
def g(x):
    io_callback(log, jax.ShapeDtypeStruct((), jnp.int32), x.sum())
    jax.debug.print("x sum {s}", s=x.sum())
    return x * 2


x = jnp.linspace(-1.0, 1.0, 5)
result = (
    jax.jit(f)(x),
    jax.vmap(f)(x.reshape(5, 1)).ravel(),
    g(x),
    len(logged),
    float(logged[0]),
    jax.jit(
        lambda x: jax.pure_callback(
            lambda a: np.cumsum(a), jax.ShapeDtypeStruct((5,), jnp.float32), x
        )
    )(x),
)
