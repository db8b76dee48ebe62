# Errors JAX raises (the error class is the record)
import jax
import jax.numpy as jnp
from jax import lax


def kind(thunk):
    try:
        thunk()
    except Exception as e:  # noqa: BLE001
        return "|".join(
            c.__name__ for c in type(e).__mro__ if c.__module__ == "builtins" and c is not object
        )
    return "no error"


@jax.jit
def branchy(x):
    if x > 0:
        return x
    return -x


result = (
    kind(lambda: branchy(1.0)),
    kind(lambda: jax.jit(lambda d: d["s"])({"s": "a string"})),
    kind(lambda: jnp.sum([1, 2, 3])),
    kind(lambda: lax.add(jnp.float32(1), jnp.int32(1))),
    kind(lambda: jnp.ones(3) + jnp.ones(4)),
    kind(lambda: jax.grad(lambda x: x)(1)),
    kind(lambda: jax.grad(lambda x: x)(jnp.ones(2))),
    kind(lambda: int(jax.jit(lambda x: x)(2.5))),
    kind(lambda: jnp.ones(3).reshape(2, 2)),
)
