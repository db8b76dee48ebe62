# einsum, broadcasting, outer products, matmul with batch dims, tensordot
import jax.numpy as jnp

a = jnp.arange(6.0).reshape(2, 3)
b = jnp.arange(12.0).reshape(3, 4)
batch = jnp.arange(24.0).reshape(2, 3, 4)
result = (
    jnp.einsum("ij,jk->ik", a, b),
    jnp.einsum("bij,j->bi", batch, jnp.ones(4)),
    jnp.einsum("ii->", jnp.eye(3) * 2),
    jnp.einsum("i,j->ij", jnp.arange(2.0), jnp.arange(3.0)),
    a[:, None, :] + a[None, :, :],
    jnp.outer(jnp.arange(3), jnp.arange(2)),
    jnp.matmul(batch, b.T[:4, :3].T if False else jnp.ones((4, 2))),
    jnp.tensordot(a, b, axes=1),
    jnp.broadcast_to(jnp.arange(3), (2, 3)),
    jnp.kron(jnp.eye(2), jnp.ones((2, 2))),
    jnp.dot(a, b).dtype.name,
)
