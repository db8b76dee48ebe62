# jnp.linalg: solve, inv, det, slogdet, cholesky, qr, eigh, svd, norm, lstsq
import jax.numpy as jnp

a = jnp.array([[4.0, 1.0, 0.5], [1.0, 3.0, 0.2], [0.5, 0.2, 2.0]])
b = jnp.array([1.0, 2.0, 3.0])
w, v = jnp.linalg.eigh(a)
q, r = jnp.linalg.qr(a)
s = jnp.linalg.svd(a, compute_uv=False)
result = (
    jnp.linalg.solve(a, b),
    jnp.linalg.inv(a),
    jnp.linalg.det(a),
    jnp.linalg.slogdet(a),
    jnp.linalg.cholesky(a),
    w,
    jnp.abs(v),
    jnp.abs(jnp.diag(r)),
    s,
    jnp.linalg.norm(a),
    jnp.linalg.norm(b, ord=1),
    jnp.linalg.lstsq(a[:, :2], b)[0],
    jnp.linalg.matrix_power(a, 3),
    jnp.trace(a),
    jnp.linalg.pinv(a[:, :2]),
)
