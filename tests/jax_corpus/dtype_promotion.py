# Type promotion semantics: weak Python scalars, mixed ints and floats, x64 off
import jax.numpy as jnp
import numpy as np

i8 = jnp.int8(3)
u8 = jnp.array([250], dtype=jnp.uint8)
bf = jnp.ones(2, dtype=jnp.bfloat16)
f16 = jnp.ones(2, dtype=jnp.float16)
result = (
    (i8 + 2).dtype.name,
    (i8 + 2.0).dtype.name,
    (u8 + 10),
    (jnp.int32(1) + jnp.float16(1)).dtype.name,
    (bf + f16).dtype.name,
    (bf * 2).dtype.name,
    (jnp.arange(3) / 2).dtype.name,
    (jnp.arange(3) // 2),
    jnp.promote_types(jnp.int8, jnp.uint8).name,
    jnp.result_type(jnp.float32, 1.0).name,
    (jnp.array(1) + np.int64(2)).dtype.name,
    (jnp.ones(2) + np.ones(2)).dtype.name,
    jnp.array([1, 2.0]).dtype.name,
    jnp.array(True) + 1,
    jnp.asarray(3.0).weak_type if hasattr(jnp.asarray(3.0), "weak_type") else None,
    (jnp.float32(2) ** 2).dtype.name,
)
