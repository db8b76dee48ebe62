"""fflow.scipy.linalg: JAX's `jax.scipy.linalg` names over fflow.numpy.linalg
(cholesky, cho_factor/cho_solve, solve_triangular, lu_factor-free solves, qr, svd,
eigh, inv, det, expm, block_diag...). Every function works under jit, grad and vmap.

Example:
    >>> import fflow.numpy as jnp
    >>> from fflow.scipy.linalg import cho_factor, cho_solve
    >>> a = jnp.array([[4.0, 2.0], [2.0, 3.0]])
    >>> [round(float(v), 4) for v in cho_solve(cho_factor(a), jnp.array([1.0, 2.0]))]
    [-0.125, 0.75]
"""

import fflow.numpy as jnp
from fflow.numpy import linalg as _la

det = _la.det
inv = _la.inv
pinv = _la.pinv
svd = _la.svd
qr = _la.qr
norm = _la.norm


def _mH(x):
    return jnp.conj(jnp.swapaxes(x, -1, -2))


def cholesky(a, lower=False, overwrite_a=False, check_finite=True):
    """The Cholesky factor (upper by default, as SciPy)."""
    L = _la.cholesky(a)
    return L if lower else _mH(L)


def cho_factor(a, lower=False, overwrite_a=False, check_finite=True):
    return cholesky(a, lower=lower), lower


def solve_triangular(a, b, trans=0, lower=False, unit_diagonal=False, overwrite_b=False,
                     debug=None, check_finite=True):  # fmt: skip
    """Solve `op(a) x = b` for triangular `a` (`trans` 0: a, 1: a^T, 2: a^H)."""
    a = jnp.asarray(a)
    tri = jnp.tril(a) if lower else jnp.triu(a)
    if unit_diagonal:
        n = a.shape[-1]
        tri = tri * (1 - jnp.eye(n, dtype=a.dtype)) + jnp.eye(n, dtype=a.dtype)
    if trans in (1, "T"):
        tri = jnp.swapaxes(tri, -1, -2)
    elif trans in (2, "C"):
        tri = _mH(tri)
    return _la.solve(tri, b)


def cho_solve(c_and_lower, b, overwrite_b=False, check_finite=True):
    c, lower = c_and_lower
    if lower:
        y = solve_triangular(c, b, lower=True)
        return solve_triangular(c, y, trans=2, lower=True)
    y = solve_triangular(c, b, trans=2, lower=False)
    return solve_triangular(c, y, lower=False)


def solve(a, b, lower=False, overwrite_a=False, overwrite_b=False, debug=False,
          check_finite=True, assume_a="gen"):  # fmt: skip
    return _la.solve(a, b)


def eigh(a, b=None, lower=True, eigvals_only=False, overwrite_a=False, overwrite_b=False,
         turbo=True, eigvals=None, type=1, check_finite=True):  # noqa: A002  # fmt: skip
    if b is not None:
        raise NotImplementedError("eigh with a second matrix b is not supported")
    w, v = _la.eigh(a)
    return w if eigvals_only else (w, v)


def expm(A, *, upper_triangular=False, max_squarings=16):  # noqa: N803  (SciPy's name)
    """Matrix exponential by scaling and squaring with a degree-12 Taylor sum."""
    A = jnp.asarray(A)
    n = A.shape[-1]
    norm1 = jnp.max(jnp.sum(jnp.abs(A), axis=-2), axis=-1)
    s = jnp.clip(jnp.ceil(jnp.log2(jnp.maximum(norm1, 1e-30))) + 1, 0, max_squarings)
    scaled = A / (2.0**s)[..., None, None]
    eye = jnp.broadcast_to(jnp.eye(n, dtype=A.dtype), A.shape)
    term, out = eye, eye
    for k in range(1, 13):
        term = term @ scaled / k
        out = out + term
    for i in range(max_squarings):
        out = jnp.where((i < s)[..., None, None], out @ out, out)
    return out


def _lu_packed(a):
    """Doolittle LU with partial pivoting, unrolled over the (static) columns in
    fflow.numpy ops (so jit, vmap and grad see it): (lu, pivots, permutation)."""
    a = jnp.asarray(a)
    a = a.astype(jnp.result_type(a, jnp.float32))
    m, n = a.shape[-2:]
    rows, cols = jnp.arange(m), jnp.arange(n)
    eye = jnp.eye(m, dtype=a.dtype)
    perm = jnp.broadcast_to(jnp.arange(m), a.shape[:-2] + (m,))
    pivots = []
    for k in range(min(m, n)):
        col = jnp.where(rows >= k, jnp.abs(a[..., :, k]), -1)
        p = jnp.argmax(col, axis=-1).astype(jnp.int32)
        pivots.append(p)
        ek, ep = (rows == k).astype(a.dtype), (rows == p[..., None]).astype(a.dtype)
        swap = eye - ek[:, None] * ek - ep[..., :, None] * ep[..., None, :]
        swap = swap + ek[:, None] * ep[..., None, :] + ep[..., :, None] * ek
        a = swap @ a  # rows k and p exchanged (exact: 0/1 weights)
        pk = jnp.take_along_axis(perm, p[..., None], -1)[..., 0]
        perm = jnp.where(
            rows == k, pk[..., None], jnp.where(rows == p[..., None], perm[..., k : k + 1], perm)
        )
        pivot = a[..., k : k + 1, k]
        safe = jnp.where(pivot == 0, 1, pivot)
        f = jnp.where((rows > k) & (pivot != 0), a[..., :, k] / safe, 0)
        urow = jnp.where(cols > k, a[..., k, :], 0)
        a = a - f[..., :, None] * urow[..., None, :]
        a = jnp.where((rows[:, None] > k) & (cols == k), f[..., :, None], a)
    return a, jnp.stack(pivots, -1), perm


def lu_factor(a, overwrite_a=False, check_finite=True):
    """(lu, piv): L below the diagonal (unit diagonal implied), U on and above it."""
    lu_, piv, _ = _lu_packed(a)
    return lu_, piv


def lu(a, permute_l=False, overwrite_a=False, check_finite=True):
    """`a = p @ l @ u` (or `(p @ l, u)` with permute_l), as jax.scipy.linalg.lu."""
    lu_, _, perm = _lu_packed(a)
    m, n = lu_.shape[-2:]
    k = min(m, n)
    l_ = jnp.tril(lu_[..., :, :k], -1) + jnp.eye(m, k, dtype=lu_.dtype)
    u = jnp.triu(lu_[..., :k, :])
    p = (perm[..., None, :] == jnp.arange(m)[:, None]).astype(lu_.dtype)
    return (p @ l_, u) if permute_l else (p, l_, u)


def block_diag(*arrs):
    arrs = [jnp.atleast_2d(jnp.asarray(a)) for a in arrs]
    rows = sum(a.shape[0] for a in arrs)
    cols = sum(a.shape[1] for a in arrs)
    dtype = jnp.result_type(*arrs)
    out = jnp.zeros((rows, cols), dtype)
    r = c = 0
    for a in arrs:
        out = out.at[r : r + a.shape[0], c : c + a.shape[1]].set(a.astype(dtype))
        r, c = r + a.shape[0], c + a.shape[1]
    return out


__all__ = ["block_diag", "cho_factor", "cho_solve", "cholesky", "det", "eigh", "expm", "inv",
           "lu", "lu_factor", "norm", "pinv", "qr", "solve", "solve_triangular", "svd"]  # fmt: skip
