"""Dense linear algebra: cholesky, eigh, svd, qr, solve, slogdet.

NumPy's LAPACK-backed routines are the implementations; every primitive takes
leading batch dimensions (NumPy's stacked-matrix convention), which is also its
batching rule. JVPs follow JAX's (jax/_src/lax/linalg.py); `solve` is linear in its
right-hand side, so its transpose covers reverse mode of every rule here.
"""

import numpy as np
from fflow.transforms import vmap as vm
from fflow.transforms.autodiff import Zero, instantiate, is_undefined, jvp_rules, transpose_rules
from fflow.transforms.shard_rules import Sig, def_sbp

from fflow import dtypes
from fflow import lax_ops as lax
from fflow.array import Array
from fflow.core import Primitive, ShapedArray
from fflow.errors import DtypeError, ShapeError, user_error
from fflow.sbp import S

# The JVP rules below are written over lax-level helpers (matrices with the same
# leading batch dimensions; constants broadcast over them), not over fflow.numpy,
# which sits above the primitives.


def _mm(a, b):
    """a [..., m, k] @ b [..., k, n] (one batch shape)."""
    nb = a.ndim - 2
    batch = tuple(range(nb))
    return lax.dot_general(a, b, (((nb + 1,), (nb,)), (batch, batch)))


def _along(v, shape, axis):
    """v [..., k] broadcast to the matrices `shape` [..., m, n] along `axis` (-1: v[j]
    at (i, j); -2: v[i] at (i, j))."""
    nd = len(shape)
    return lax.broadcast_in_dim(v, shape, tuple(range(nd - 2)) + (nd + axis,))


def _const(value, shape):
    """A NumPy [m, n] constant broadcast to the matrices `shape`."""
    nd = len(shape)
    return lax.broadcast_in_dim(Array(value), shape, (nd - 2, nd - 1))


def _keep(x, mask):
    """x where the [m, n] NumPy mask is True, else 0 (tril/triu/diagonal without fflow.numpy)."""
    return lax.select(_const(mask, x.shape), x, lax.full_like(x, 0))


def _diag(x):
    """The diagonal of x [..., n, n] as [..., n]."""
    return lax.reduce_sum(_keep(x, np.eye(x.shape[-1], dtype=bool)), (x.ndim - 1,))


def _check_matrix(name, a, square=True):
    if a.ndim < 2 or (square and a.shape[-1] != a.shape[-2]):
        raise user_error(
            ShapeError,
            f"{name} needs {'square ' if square else ''}matrices (shape [..., m, n]), got "
            f"{a.str_short()}.",
        )
    if not dtypes.is_inexact(a.dtype):
        raise user_error(DtypeError, f"{name} needs a float input, got {a.str_short()}")


def _mT(x):
    nd = x.ndim
    return lax.transpose(x, tuple(range(nd - 2)) + (nd - 1, nd - 2))


def _linalg_prim(name, impl, abstract_eval, multiple_results=False):
    prim = Primitive(name, multiple_results=multiple_results)
    prim.amp_class = "fp32"
    # a dense decomposition/solve: the CUDA plan runs it through cuSOLVER (CuPy), one step
    prim.traits.add("solver")
    prim.def_impl(impl)
    prim.def_abstract_eval(abstract_eval)
    return prim


# ----------------------------------------------------------------------------
# solve(a, b): a [..., n, n], b [..., n, k]


def _solve_impl(a, b):
    try:
        return np.linalg.solve(a, b).astype(b.dtype)
    except np.linalg.LinAlgError:
        # JAX (LU without a singularity check) returns inf/nan for a singular matrix
        return _lu_solve_unchecked(a, b).astype(b.dtype)


def _lu_solve_unchecked(a, b):
    """Gaussian elimination with partial pivoting that divides by a zero pivot
    instead of raising (inf/nan results, as XLA's LU-based solve gives)."""
    a = np.array(a, dtype=np.result_type(a, np.float32))
    x = np.array(b, dtype=a.dtype)
    n = a.shape[-1]
    batch = a.shape[:-2]
    a = a.reshape((-1, n, n))
    x = x.reshape((-1, n, x.shape[-1]))
    rows = np.arange(a.shape[0])
    with np.errstate(divide="ignore", invalid="ignore"):
        for k in range(n):
            p = k + np.argmax(np.abs(a[:, k:, k]), axis=1)
            a[rows, k], a[rows, p] = a[rows, p].copy(), a[rows, k].copy()
            x[rows, k], x[rows, p] = x[rows, p].copy(), x[rows, k].copy()
            f = a[:, k + 1 :, k] / a[:, k : k + 1, k]
            a[:, k + 1 :] -= f[:, :, None] * a[:, k : k + 1]
            x[:, k + 1 :] -= f[:, :, None] * x[:, k : k + 1]
        for k in range(n - 1, -1, -1):
            x[:, k] = (x[:, k] - np.einsum("bj,bjc->bc", a[:, k, k + 1 :], x[:, k + 1 :])) / a[
                :, k, k : k + 1
            ]
    return x.reshape(batch + x.shape[1:])


def _solve_abstract(a, b):
    _check_matrix("solve", a)
    if b.ndim != a.ndim or b.shape[:-2] != a.shape[:-2] or b.shape[-2] != a.shape[-1]:
        raise user_error(ShapeError, f"solve: shapes {a.shape} and {b.shape} do not match")
    return ShapedArray(b.shape, b.dtype)


solve_p = _linalg_prim("linalg_solve", _solve_impl, _solve_abstract)


def _solve_jvp(primals, tangents):
    a, b = primals
    a_dot, b_dot = tangents
    x = solve_p.bind(a, b)
    rhs = None if type(b_dot) is Zero else b_dot
    if type(a_dot) is not Zero:
        term = lax.neg(_mm(a_dot, x))
        rhs = term if rhs is None else lax.add(rhs, term)
    if rhs is None:
        return x, Zero(ShapedArray(np.shape(x), x.dtype))
    return x, solve_p.bind(a, rhs)


def _solve_transpose(ct, a, b):
    if is_undefined(a):
        raise NotImplementedError("solve is linear in its right-hand side only")
    if type(ct) is Zero:
        return [None, None]
    return [None, solve_p.bind(_mT(a), instantiate(ct))]


jvp_rules[solve_p] = _solve_jvp
transpose_rules[solve_p] = _solve_transpose
solve_p.traits.add("linear_in_one")

# ----------------------------------------------------------------------------
# cholesky(a): lower-triangular L with L L^T = a


def _cholesky_impl(a):
    try:
        return np.linalg.cholesky(a).astype(a.dtype)
    except np.linalg.LinAlgError:
        # JAX returns NaNs for a matrix that is not positive definite
        return np.full(a.shape, np.nan, a.dtype)


def _cholesky_abstract(a):
    _check_matrix("cholesky", a)
    return ShapedArray(a.shape, a.dtype)


cholesky_p = _linalg_prim("cholesky", _cholesky_impl, _cholesky_abstract)


def _cholesky_jvp(primals, tangents):
    (a,), (a_dot,) = primals, tangents
    L = cholesky_p.bind(a)
    if type(a_dot) is Zero:
        return L, a_dot
    sigma = lax.mul(lax.add(a_dot, _mT(a_dot)), 0.5)
    # phi(L^-1 sigma L^-T), sigma symmetric: X = L^-1 sigma, then L^-1 X^T
    inner = solve_p.bind(L, _mT(solve_p.bind(L, sigma)))
    n = a.shape[-1]
    half_diag = np.where(np.eye(n, dtype=bool), 0.5, 1.0).astype(a.dtype)
    phi = lax.mul(_keep(inner, np.tri(n, dtype=bool)), _const(half_diag, inner.shape))
    return L, _mm(L, phi)


jvp_rules[cholesky_p] = _cholesky_jvp

# ----------------------------------------------------------------------------
# eigh(a) -> (w ascending, v): a = v diag(w) v^T for symmetric a


def _eigh_impl(a):
    w, v = np.linalg.eigh(a)
    return [w.astype(a.dtype), v.astype(a.dtype)]


def _eigh_abstract(a):
    _check_matrix("eigh", a)
    return [ShapedArray(a.shape[:-1], a.dtype), ShapedArray(a.shape, a.dtype)]


eigh_p = _linalg_prim("eigh", _eigh_impl, _eigh_abstract, multiple_results=True)


def _eigh_jvp(primals, tangents):
    (a,), (a_dot,) = primals, tangents
    w, v = eigh_p.bind(a)
    if type(a_dot) is Zero:
        return [w, v], [Zero(ShapedArray(w.shape, w.dtype)), Zero(ShapedArray(v.shape, v.dtype))]
    vdag_adot_v = _mm(_mm(_mT(v), a_dot), v)
    diffs = lax.sub(_along(w, v.shape, -1), _along(w, v.shape, -2))  # w[j] - w[i]
    off = ~np.eye(a.shape[-1], dtype=bool)
    F = _keep(lax.div(1.0, lax.select(_const(off, v.shape), diffs, lax.full_like(diffs, 1))), off)
    v_dot = _mm(v, lax.mul(F, vdag_adot_v))
    w_dot = _diag(vdag_adot_v)
    return [w, v], [w_dot, v_dot]


jvp_rules[eigh_p] = _eigh_jvp

# ----------------------------------------------------------------------------
# svd(a) -> (u, s, vt), reduced (full_matrices=False)


def _svd_impl(a):
    u, s, vt = np.linalg.svd(a, full_matrices=False)
    return [u.astype(a.dtype), s.astype(a.dtype), vt.astype(a.dtype)]


def _svd_abstract(a):
    _check_matrix("svd", a, square=False)
    m, n = a.shape[-2:]
    k = min(m, n)
    batch = a.shape[:-2]
    return [
        ShapedArray(batch + (m, k), a.dtype),
        ShapedArray(batch + (k,), a.dtype),
        ShapedArray(batch + (k, n), a.dtype),
    ]


svd_p = _linalg_prim("svd", _svd_impl, _svd_abstract, multiple_results=True)


def _svd_jvp(primals, tangents):
    (a,), (a_dot,) = primals, tangents
    u, s, vt = svd_p.bind(a)
    if type(a_dot) is Zero:
        return [u, s, vt], [Zero(ShapedArray(np.shape(o), o.dtype)) for o in (u, s, vt)]
    ut, v = _mT(u), _mT(vt)
    dS = _mm(_mm(ut, a_dot), v)
    ds = _diag(dS)
    k = s.shape[-1]
    eye = _const(np.eye(k, dtype=a.dtype), dS.shape)
    s_row, s_col = _along(s, dS.shape, -1), _along(s, dS.shape, -2)  # s[j], s[i] at (i, j)
    s_diffs = lax.mul(lax.add(s_row, s_col), lax.sub(s_row, s_col))
    F = lax.sub(lax.div(1.0, lax.add(s_diffs, eye)), eye)
    dSS = lax.mul(s_row, dS)
    SdS = lax.mul(s_col, dS)
    s_zero = lax.convert_element_type(lax.eq(s, 0.0), a.dtype)
    s_inv = lax.sub(lax.div(1.0, lax.add(s, s_zero)), s_zero)
    s_inv_mat = lax.mul(_along(s_inv, dS.shape, -2), eye)
    dUdV_diag = lax.mul(lax.mul(lax.sub(dS, _mT(dS)), 0.5), s_inv_mat)
    dU = _mm(u, lax.add(lax.mul(F, lax.add(dSS, _mT(dSS))), dUdV_diag))
    dV = _mm(v, lax.mul(F, lax.add(SdS, _mT(SdS))))
    m, n = a.shape[-2:]
    if m > n:
        dAV = _mm(a_dot, v)
        rest = lax.sub(dAV, _mm(u, _mm(ut, dAV)))
        dU = lax.add(dU, lax.div(rest, _along(s, rest.shape, -1)))
    if n > m:
        dAHU = _mm(_mT(a_dot), u)
        rest = lax.sub(dAHU, _mm(v, _mm(vt, dAHU)))
        dV = lax.add(dV, lax.div(rest, _along(s, rest.shape, -1)))
    return [u, s, vt], [dU, ds, _mT(dV)]


jvp_rules[svd_p] = _svd_jvp

# ----------------------------------------------------------------------------
# qr(a) -> (q, r), reduced


def _qr_impl(a):
    q, r = np.linalg.qr(a, mode="reduced")
    return [q.astype(a.dtype), r.astype(a.dtype)]


def _qr_abstract(a):
    _check_matrix("qr", a, square=False)
    m, n = a.shape[-2:]
    k = min(m, n)
    return [
        ShapedArray(a.shape[:-2] + (m, k), a.dtype),
        ShapedArray(a.shape[:-2] + (k, n), a.dtype),
    ]


qr_p = _linalg_prim("qr", _qr_impl, _qr_abstract, multiple_results=True)


def _qr_jvp(primals, tangents):
    (a,), (a_dot,) = primals, tangents
    q, r = qr_p.bind(a)
    if type(a_dot) is Zero:
        return [q, r], [Zero(ShapedArray(np.shape(o), o.dtype)) for o in (q, r)]
    m, n = a.shape[-2:]
    if m < n:
        raise NotImplementedError("the derivative of qr needs a matrix with m >= n")
    dx_rinv = _mT(solve_p.bind(_mT(r), _mT(a_dot)))  # a_dot @ inv(r)
    qt_dx_rinv = _mm(_mT(q), dx_rinv)
    lower = _keep(qt_dx_rinv, np.tri(n, k=-1, dtype=bool))
    do = lax.sub(lower, _mT(lower))
    dq = lax.add(_mm(q, lax.sub(do, qt_dx_rinv)), dx_rinv)
    dr = _mm(lax.sub(qt_dx_rinv, do), r)
    return [q, r], [dq, dr]


jvp_rules[qr_p] = _qr_jvp

# ----------------------------------------------------------------------------
# slogdet(a) -> (sign, log|det a|)


def _slogdet_impl(a):
    sign, logabsdet = np.linalg.slogdet(a)
    return [np.asarray(sign, a.dtype), np.asarray(logabsdet, a.dtype)]


def _slogdet_abstract(a):
    _check_matrix("slogdet", a)
    return [ShapedArray(a.shape[:-2], a.dtype), ShapedArray(a.shape[:-2], a.dtype)]


slogdet_p = _linalg_prim("slogdet", _slogdet_impl, _slogdet_abstract, multiple_results=True)


def _slogdet_jvp(primals, tangents):
    (a,), (a_dot,) = primals, tangents
    sign, logdet = slogdet_p.bind(a)
    zero = Zero(ShapedArray(np.shape(sign), sign.dtype))
    if type(a_dot) is Zero:
        return [sign, logdet], [zero, zero]
    return [sign, logdet], [zero, lax.reduce_sum(_diag(solve_p.bind(a, a_dot)), (a.ndim - 2,))]


jvp_rules[slogdet_p] = _slogdet_jvp

# ----------------------------------------------------------------------------
# Batching: each primitive takes leading batch dims already


def _register_batch_rules():

    def unary_rule(prim):
        def rule(args, dims):
            (a,), (d,) = args, dims
            out = prim.bind(vm.moveaxis(a, d, 0))
            return (out, [0] * len(out)) if prim.multiple_results else (out, 0)

        return rule

    def solve_rule(args, dims):
        size = vm.batch_size(args, dims)
        a, b = (vm.bdim_to_front(x, d, size) for x, d in zip(args, dims))
        return solve_p.bind(a, b), 0

    for prim in (cholesky_p, eigh_p, svd_p, qr_p, slogdet_p):
        vm.batch_rules[prim] = unary_rule(prim)
    vm.batch_rules[solve_p] = solve_rule


_register_batch_rules()


# ----------------------------------------------------------------------------
# SBP signatures (transforms/shard_rules.py): a split batch dimension stays split;
# the matrix dimensions themselves are never split (all-broadcast is implicit).


def _register_sbp_rules():

    def batch_split_rule(in_avals, out_avals, **params):
        nb = in_avals[0].ndim - 2
        n_in, n_out = len(in_avals), len(out_avals)
        return [Sig((S(k),) * n_in, (S(k),) * n_out) for k in range(nb)]

    for prim in (solve_p, cholesky_p, eigh_p, svd_p, qr_p, slogdet_p):
        def_sbp(prim, batch_split_rule)


_register_sbp_rules()
