# JAX tutorials "Automatic vectorization" and "Introduction to parallel programming"
import jax
import jax.numpy as jnp
from jax import lax

x = jnp.arange(5)
w = jnp.array([2.0, 3.0, 4.0])


def convolve(x, w):
    output = []
    for i in range(1, len(x) - 1):
        output.append(jnp.dot(x[i - 1 : i + 2], w))
    return jnp.array(output)


xs = jnp.stack([x, x])
ws = jnp.stack([w, w])


def manually_batched_convolve(xs, ws):
    output = []
    for i in range(xs.shape[0]):
        output.append(convolve(xs[i], ws[i]))
    return jnp.stack(output)


auto_batch_convolve = jax.vmap(convolve)
auto_batch_convolve_v2 = jax.vmap(convolve, in_axes=1, out_axes=1)
xst = jnp.transpose(xs)
wst = jnp.transpose(ws)
batch_convolve_v3 = jax.vmap(convolve, in_axes=[0, None])
jitted_batch_convolve = jax.jit(auto_batch_convolve)

n = jax.local_device_count()
pmapped = jax.pmap(lambda v: v**2)(jnp.arange(n * 3.0).reshape(n, 3))


def normalize(v):
    return v / lax.psum(v, "i")


pnorm = jax.pmap(normalize, axis_name="i")(jnp.arange(1.0, n + 1.0))
vnorm = jax.vmap(normalize, axis_name="i")(jnp.arange(1.0, 5.0))
vmean = jax.vmap(lambda v: v - lax.pmean(v, "i"), axis_name="i")(jnp.array([1.0, 2.0, 6.0]))
nested = jax.vmap(jax.vmap(lambda a, b: a * b, in_axes=(0, None)), in_axes=(None, 0))(
    jnp.arange(3.0), jnp.arange(4.0)
)
dict_batched = jax.vmap(lambda d: d["a"] + d["b"].sum(), in_axes=({"a": 0, "b": 0},))(
    {"a": jnp.arange(3.0), "b": jnp.ones((3, 2))}
)
result = (
    convolve(x, w),
    manually_batched_convolve(xs, ws),
    auto_batch_convolve(xs, ws),
    auto_batch_convolve_v2(xst, wst),
    batch_convolve_v3(xs, w),
    jitted_batch_convolve(xs, ws),
    pmapped,
    pnorm,
    vnorm,
    vmean,
    nested,
    dict_batched,
    jax.device_count() >= 1,
)
