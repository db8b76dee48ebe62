# JAX's "Type promotion semantics" page: promote_types, result_type, weak scalars,
# mixed int/float/bool arithmetic and jnp.asarray defaults (x64 off)
import jax
import jax.numpy as jnp
import numpy as np

pairs = [
    ("int8", "uint8"),
    ("int32", "float16"),
    ("bfloat16", "float16"),
    ("uint32", "int32"),
    ("bool", "int8"),
    ("float32", "complex64"),
    ("uint8", "float32"),
]
x8 = jnp.ones(2, jnp.int8)
f16 = jnp.ones(2, jnp.float16)
result = (
    [str(jnp.promote_types(a, b)) for a, b in pairs],
    str(jnp.result_type(jnp.int8, 2.0)),
    str(jnp.result_type(x8, 3)),
    (x8 + 3).dtype.name,
    (x8 + 3.5).dtype.name,
    (f16 * 2.0).dtype.name,
    (f16 * np.float32(2.0)).dtype.name,
    (jnp.ones(2, jnp.uint8) + jnp.ones(2, jnp.int8)).dtype.name,
    (jnp.array(True) + 1).dtype.name,
    jnp.asarray(np.arange(3)).dtype.name,
    jnp.asarray(np.ones(2)).dtype.name,
    jnp.array(2**31 - 1).dtype.name,
    jnp.zeros(2, dtype=float).dtype.name,
    jnp.arange(3.0).astype(int).dtype.name,
    (jnp.ones(2, jnp.bfloat16) + jnp.ones(2, jnp.float16)).dtype.name,
    jax.dtypes.canonicalize_dtype(np.float64).name,
    jnp.iinfo(jnp.int16).max,
    float(jnp.finfo(jnp.float16).eps),
    (jnp.int32(5) // 2, jnp.float32(5) / 2),
    jnp.can_cast(jnp.int32, jnp.float32),
    jnp.issubdtype(jnp.float16, jnp.floating),
)
