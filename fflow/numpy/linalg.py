"""fflow.numpy.linalg: norms, solves, decompositions (cholesky, eigh, svd, qr) and the
functions built on them (inv, det, slogdet, pinv, lstsq, matrix_power...), with JAX's
names and semantics. Each decomposition is a primitive with a JVP (primitives/linalg.py),
so all of these work under jit, grad and vmap.

Example:
    >>> import fflow.numpy as jnp
    >>> a = jnp.array([[2.0, 1.0], [1.0, 3.0]])
    >>> [round(float(v), 4) for v in jnp.linalg.solve(a, jnp.array([1.0, 2.0]))]
    [0.2, 0.6]
"""

from collections import namedtuple

import numpy as np

from fflow import dtypes
from fflow import lax_ops as lax
from fflow.errors import user_error
from fflow.numpy import elementwise as _ew
from fflow.numpy import reductions as _red
from fflow.numpy import shapes as _sh
from fflow.numpy._util import info, operand
from fflow.numpy._util import promote_dtypes as _promote_dtypes
from fflow.numpy.linalg_ops import matmul, outer, tensordot, trace, vdot  # noqa: F401
from fflow.numpy.statistics import cross as _cross
from fflow.primitives.linalg import cholesky_p, eigh_p, qr_p, slogdet_p, solve_p, svd_p
from fflow.primitives.unary import integer_pow_by_squaring as _pow_by_squaring

EighResult = namedtuple("EighResult", ["eigenvalues", "eigenvectors"])
SVDResult = namedtuple("SVDResult", ["U", "S", "Vh"])
QRResult = namedtuple("QRResult", ["Q", "R"])
SlogdetResult = namedtuple("SlogdetResult", ["sign", "logabsdet"])


def _float(a):
    a = operand(a)
    return a if dtypes.is_inexact(info(a)[0]) else lax.convert_element_type(a, dtypes.float_)


def _mT(x):
    return _sh.swapaxes(x, -1, -2)


def matrix_transpose(x):
    return _sh.matrix_transpose(x)


# -- norm --------------------------------------------------------------------------


def norm(x, ord=None, axis=None, keepdims=False):
    """Vector and matrix norms (None/2-norm, 1, inf, -inf, 0, p; 'fro' for matrices)."""
    x = operand(x)
    if not dtypes.is_inexact(info(x)[0]):
        x = lax.convert_element_type(x, dtypes.float_)
    nd = len(info(x)[2])
    if axis is None and (ord is None or ord == "fro"):
        return _ew.sqrt(_red.sum(_ew.multiply(x, x), axis=None, keepdims=keepdims))
    if axis is None:
        axis = tuple(range(nd))
    if isinstance(axis, int):
        axis = (axis,)
    if len(axis) == 1:
        if ord is None or ord == 2:
            return _ew.sqrt(_red.sum(_ew.multiply(x, x), axis=axis, keepdims=keepdims))
        if ord == np.inf:
            return _red.max(_ew.absolute(x), axis=axis, keepdims=keepdims)
        if ord == -np.inf:
            return _red.min(_ew.absolute(x), axis=axis, keepdims=keepdims)
        if ord == 0:
            return _red.sum(_ew.not_equal(x, 0).astype(info(x)[0]), axis=axis, keepdims=keepdims)
        if ord == 1:
            return _red.sum(_ew.absolute(x), axis=axis, keepdims=keepdims)
        p = float(ord)
        return _ew.power(
            _red.sum(_ew.power(_ew.absolute(x), p), axis=axis, keepdims=keepdims), 1 / p
        )
    if ord is None or ord == "fro":
        return _ew.sqrt(_red.sum(_ew.multiply(x, x), axis=axis, keepdims=keepdims))
    r, c = axis
    if ord == 1:
        return _red.max(
            _red.sum(_ew.absolute(x), axis=r, keepdims=True), axis=axis, keepdims=keepdims
        )
    if ord == np.inf:
        return _red.max(
            _red.sum(_ew.absolute(x), axis=c, keepdims=True), axis=axis, keepdims=keepdims
        )
    if ord == -1:
        return _red.min(
            _red.sum(_ew.absolute(x), axis=r, keepdims=True), axis=axis, keepdims=keepdims
        )
    if ord == -np.inf:
        return _red.min(
            _red.sum(_ew.absolute(x), axis=c, keepdims=True), axis=axis, keepdims=keepdims
        )
    if ord in (2, -2, "nuc"):
        s = svd(_sh.moveaxis(x, (r, c), (-2, -1)), compute_uv=False)
        out = _red.max(s, -1) if ord == 2 else _red.min(s, -1) if ord == -2 else _red.sum(s, -1)
        if keepdims:
            out = _sh.expand_dims(out, tuple(sorted(a % nd for a in axis)))
        return out
    raise NotImplementedError(f"norm with ord={ord!r} over two axes")


def vector_norm(x, axis=None, keepdims=False, ord=2):
    return norm(x, ord=ord, axis=axis, keepdims=keepdims)


def matrix_norm(x, keepdims=False, ord="fro"):
    return norm(x, ord=ord, axis=(-2, -1), keepdims=keepdims)


def solve(a, b):
    """Solve a x = b; b is a vector [..., n] or a stack of columns [..., n, k]."""
    a, b = _float(a), _float(b)
    dtype, _ = _promote(a, b)
    a, b = a.astype(dtype), b.astype(dtype)
    if b.ndim == a.ndim - 1:
        return solve_p.bind(a, b[..., None])[..., 0]
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = _sh.broadcast_to(a, batch + a.shape[-2:])
    b = _sh.broadcast_to(b, batch + b.shape[-2:])
    return solve_p.bind(a, b)


def _promote(*xs):

    return _promote_dtypes(*xs)


def inv(a):
    a = _float(a)
    n = a.shape[-1]
    eye = _sh.broadcast_to(np.eye(n, dtype=a.dtype), a.shape)
    return solve_p.bind(a, eye)


def _mH(x):
    return _ew.conjugate(_mT(x)) if info(x)[0].kind == "c" else _mT(x)


def cholesky(a, *, upper=False, symmetrize_input=True):
    a = _float(a)
    if symmetrize_input:  # (a + a^H) / 2: Hermitian, so complex inputs keep their phase
        a = _ew.multiply(_ew.add(a, _mH(a)), 0.5)
    L = cholesky_p.bind(a)
    return _mH(L) if upper else L


def eigh(a, UPLO=None, symmetrize_input=True):  # noqa: N803  (JAX's name)
    a = _float(a)
    if symmetrize_input:
        a = _ew.multiply(_ew.add(a, _mT(a)), 0.5)
    w, v = eigh_p.bind(a)
    return EighResult(w, v)


def eigvalsh(a, UPLO="L"):
    return eigh(a).eigenvalues


def svd(a, full_matrices=True, compute_uv=True, hermitian=False):
    """Singular value decomposition (reduced matrices only: full_matrices needs m == n)."""
    a = _float(a)
    m, n = a.shape[-2:]
    if full_matrices and m != n and compute_uv:
        raise user_error(
            NotImplementedError,
            "svd(full_matrices=True) of a non-square matrix is not supported. "
            "Fix: pass full_matrices=False.",
        )
    u, s, vt = svd_p.bind(a)
    if not compute_uv:
        return s
    return SVDResult(u, s, vt)


def svdvals(a):
    return svd(a, compute_uv=False)


def qr(a, mode="reduced"):
    a = _float(a)
    m, n = a.shape[-2:]
    if mode == "complete" and m > n:
        raise user_error(NotImplementedError, "qr(mode='complete') with m > n is not supported")
    q, r = qr_p.bind(a)
    if mode == "r":
        return r
    return QRResult(q, r)


def slogdet(a):
    sign, logabsdet = slogdet_p.bind(_float(a))
    return SlogdetResult(sign, logabsdet)


def det(a):
    sign, logabsdet = slogdet(a)
    return _ew.multiply(sign, _ew.exp(logabsdet))


def pinv(a, rtol=None, hermitian=False):
    a = _float(a)
    m, n = a.shape[-2:]
    u, s, vt = svd_p.bind(a)
    if rtol is None:
        rtol = max(m, n) * float(dtypes.finfo(a.dtype).eps)
    cutoff = _ew.multiply(rtol, _red.max(s, axis=-1, keepdims=True))
    keep = _ew.greater(s, cutoff)
    s_inv = _ew.where(keep, _ew.reciprocal(_ew.where(keep, s, 1)), 0)
    return matmul(_mT(vt), _ew.multiply(_sh.expand_dims(s_inv, -1), _mT(u)))


def lstsq(a, b, rcond=None, *, numpy_resid=False):
    """Least squares via the pseudo-inverse: (x, residuals, rank, singular values)."""
    a, b = _float(a), _float(b)
    x = matmul(pinv(a, rtol=rcond), b)
    s = svd(a, compute_uv=False)
    rank = matrix_rank(a)
    r = _ew.subtract(matmul(a, x), b)
    resid = _red.sum(_ew.square(r), axis=0)
    return x, resid, rank, s


def matrix_rank(a, rtol=None, *, tol=None):
    a = _float(a)
    s = svd(a, compute_uv=False)
    m, n = a.shape[-2:]
    if tol is None:
        rtol = max(m, n) * float(dtypes.finfo(a.dtype).eps) if rtol is None else rtol
        tol = _ew.multiply(_red.max(s, axis=-1, keepdims=True), rtol)
    return _red.sum(_ew.greater(s, tol), axis=-1)


def matrix_power(a, n):
    a = operand(a)
    if not isinstance(n, (int, np.integer)):
        raise TypeError("matrix_power: the exponent must be an integer")
    n = int(n)
    if n == 0:
        return _sh.broadcast_to(np.eye(a.shape[-1], dtype=info(a)[0]), a.shape)
    if n < 0:
        a, n = inv(a), -n

    return _pow_by_squaring(a, n, mul=matmul)


def multi_dot(arrays):
    out = arrays[0]
    for a in arrays[1:]:
        out = matmul(out, a)
    return out


def cond(x, p=None):
    s = svd(x, compute_uv=False)
    return _ew.divide(s[..., 0], s[..., -1])


def eigvals(a):
    raise user_error(
        NotImplementedError,
        "eig/eigvals of general (non-symmetric) matrices are not supported; for symmetric "
        "matrices use fflow.numpy.linalg.eigh.",
    )


eig = eigvals


def cross(a, b, axis=-1):

    return _cross(a, b, axis=axis)


# the public names: jax's (jax.numpy.linalg) that fflow has
__all__ = [
    "cholesky",
    "cond",
    "cross",
    "det",
    "eig",
    "eigh",
    "eigvals",
    "eigvalsh",
    "inv",
    "lstsq",
    "matmul",
    "matrix_norm",
    "matrix_power",
    "matrix_rank",
    "matrix_transpose",
    "multi_dot",
    "norm",
    "outer",
    "pinv",
    "qr",
    "slogdet",
    "solve",
    "svd",
    "svdvals",
    "tensordot",
    "trace",
    "vector_norm",
]


def __dir__():
    return list(__all__)
