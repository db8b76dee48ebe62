"""fflow.numpy linear algebra against NumPy: products (dot, matmul, tensordot, einsum
in opt_einsum's order...), norms, solves and decompositions; jit == eager, grad
against finite differences, vmap against a loop."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fflow
import fflow.numpy as jnp

RNG = np.random.RandomState(0)
A = RNG.randn(3, 4)
B = RNG.randn(4, 5)
V = RNG.randn(4)
SPD = A[:, :3].T @ A[:, :3] + 3 * np.eye(3)
SQ = RNG.randn(3, 3) + 3 * np.eye(3)


def _close(out, expected, rtol=1e-10):
    out = np.asarray(out)
    assert out.shape == np.shape(expected)
    np.testing.assert_allclose(out, expected, rtol=rtol, atol=rtol)


@settings(max_examples=15, deadline=None)
@given(data=st.data())
@pytest.mark.usefixtures("x64_case")  # float64 reference on purpose
def test_matmul_broadcasting_matches_numpy(data):
    batch = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=2, max_side=3))
    m, k, n = (data.draw(st.integers(1, 4)) for _ in range(3))
    dtype = data.draw(st.sampled_from([np.float32, np.float64, np.int32]))
    a = RNG.randint(-3, 4, batch.input_shapes[0] + (m, k)).astype(dtype)
    b = RNG.randint(-3, 4, batch.input_shapes[1] + (k, n)).astype(dtype)
    out = jnp.matmul(a, b)
    assert out.dtype == dtype
    _close(out, np.matmul(a, b))
    _close(jnp.asarray(a) @ b, a @ b)
    v = RNG.randint(-3, 4, (k,)).astype(dtype)
    _close(jnp.matmul(a, v), np.matmul(a, v))
    _close(jnp.matmul(v, b), np.matmul(v, b))


@pytest.mark.usefixtures("x64_case")  # float64 reference on purpose
def test_products_match_numpy():
    a3 = RNG.randn(2, 3, 4)
    _close(jnp.dot(A, B), np.dot(A, B))
    _close(jnp.dot(A, V), np.dot(A, V))
    _close(jnp.dot(V, V), np.dot(V, V))
    _close(jnp.dot(a3, B), np.dot(a3, B))
    _close(jnp.dot(2.0, A), 2 * A)
    _close(jnp.vdot(A, A), np.vdot(A, A))
    _close(jnp.inner(A, A), np.inner(A, A))
    _close(jnp.outer(V, A), np.outer(V, A))
    _close(jnp.tensordot(a3, A, axes=([1, 2], [0, 1])), np.tensordot(a3, A, axes=([1, 2], [0, 1])))
    _close(jnp.tensordot(A, B, axes=1), np.tensordot(A, B, axes=1))
    _close(jnp.tensordot(V, V, axes=0), np.tensordot(V, V, axes=0))
    _close(jnp.trace(SQ), np.trace(SQ))
    _close(jnp.trace(a3, offset=1, axis1=1, axis2=2), np.trace(a3, offset=1, axis1=1, axis2=2))
    _close(jnp.diag(V, k=1), np.diag(V, k=1))
    _close(jnp.diag(A, k=-1), np.diag(A, k=-1))
    _close(jnp.diagonal(a3, axis1=0, axis2=2), np.diagonal(a3, axis1=0, axis2=2))
    _close(jnp.kron(SQ[:2, :2], np.eye(2)), np.kron(SQ[:2, :2], np.eye(2)))
    assert jnp.dot(np.ones(2, np.int32), np.ones(2, np.float32)).dtype == np.float32


EINSUM = [
    ("ij->ji", [A]),
    ("ijk->", [RNG.randn(2, 3, 4)]),
    ("ii->i", [SQ]),
    ("ii", [SQ]),
    ("i,j->ij", [V, V]),
    ("ij,jk->ik", [A, B]),
    ("ij,jk", [A, B]),
    ("bij,bjk->bik", [RNG.randn(2, 3, 4), RNG.randn(2, 4, 5)]),
    ("...j,j->...", [RNG.randn(2, 3, 4), V]),
    ("...ij,...jk", [RNG.randn(2, 3, 4), B]),
    ("ij,ij->i", [A, A]),
    ("abc,cd,bd,a->", [RNG.randn(2, 3, 4), RNG.randn(4, 5), RNG.randn(3, 5), RNG.randn(2)]),
    ("ij,jk,kl->il", [A, B, RNG.randn(5, 2)]),
    ("iij->j", [RNG.randn(3, 3, 2)]),
]


@pytest.mark.parametrize("spec, operands", EINSUM, ids=[e[0] for e in EINSUM])
@pytest.mark.usefixtures("x64_case")  # float64 reference on purpose
def test_einsum_matches_numpy(spec, operands):
    _close(jnp.einsum(spec, *operands), np.einsum(spec, *operands))
    _close(fflow.jit(lambda *o: jnp.einsum(spec, *o))(*operands), np.einsum(spec, *operands))


@pytest.mark.usefixtures("x64_case")  # float64 reference on purpose
def test_einsum_grad():
    x, y, z = A, B, RNG.randn(5, 2)
    f = lambda a, b, c: jnp.sum(jnp.einsum("ij,jk,kl->il", a, b, c) ** 2)  # noqa: E731
    gx, gy, gz = fflow.grad(f, argnums=(0, 1, 2))(x, y, z)
    r = x @ y @ z
    _close(gx, 2 * r @ (y @ z).T, 1e-8)
    _close(gy, x.T @ (2 * r) @ z.T, 1e-8)
    _close(gz, (x @ y).T @ (2 * r), 1e-8)


@pytest.mark.usefixtures("x64_case")  # float64 reference on purpose
def test_norms_match_numpy():
    a3 = RNG.randn(2, 3, 4)
    _close(jnp.linalg.norm(a3), np.linalg.norm(a3))
    _close(jnp.linalg.norm(a3, axis=-1), np.linalg.norm(a3, axis=-1))
    _close(
        jnp.linalg.norm(a3, axis=(1, 2), keepdims=True),
        np.linalg.norm(a3, axis=(1, 2), keepdims=True),
    )
    for ord_ in (1, 2, 3, 0, np.inf, -np.inf):
        _close(jnp.linalg.norm(V, ord=ord_), np.linalg.norm(V, ord=ord_))
    for ord_ in (1, -1, 2, -2, np.inf, -np.inf, "fro", "nuc"):
        _close(jnp.linalg.norm(A, ord=ord_), np.linalg.norm(A, ord=ord_))
    g = fflow.grad(lambda a: jnp.linalg.norm(a))(A)
    _close(g, A / np.linalg.norm(A))


@pytest.mark.usefixtures("x64_case")  # float64 reference on purpose
def test_solves_and_decompositions_match_numpy():
    la = jnp.linalg
    _close(la.solve(SQ, V[:3]), np.linalg.solve(SQ, V[:3]))
    _close(la.solve(SQ, A), np.linalg.solve(SQ, A))
    _close(la.inv(SQ), np.linalg.inv(SQ))
    _close(la.det(SQ), np.linalg.det(SQ))
    sign, logdet = la.slogdet(SQ)
    ref = np.linalg.slogdet(SQ)
    _close(sign, ref[0])
    _close(logdet, ref[1])
    _close(la.cholesky(SPD), np.linalg.cholesky(SPD))
    w, v = la.eigh(SPD)
    _close(w, np.linalg.eigvalsh(SPD))
    _close(v @ np.diag(np.asarray(w)) @ np.asarray(v).T, SPD)
    u, s, vt = la.svd(A, full_matrices=False)
    _close(s, np.linalg.svd(A, compute_uv=False))
    _close(np.asarray(u) * np.asarray(s) @ np.asarray(vt), A)
    q, r = la.qr(B.T)
    _close(np.asarray(q) @ np.asarray(r), B.T)
    _close(la.pinv(A), np.linalg.pinv(A))
    _close(la.lstsq(A.T, V)[0], np.linalg.lstsq(A.T, V, rcond=None)[0])
    _close(la.matrix_power(SQ, 3), np.linalg.matrix_power(SQ, 3))
    _close(la.matrix_power(SQ, -2), np.linalg.matrix_power(SQ, -2))
    assert int(la.matrix_rank(A)) == np.linalg.matrix_rank(A)


def _fd_check(f, x, rtol=1e-5):
    g = np.asarray(fflow.grad(f)(x))
    eps = 1e-6
    fd = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = eps
        fd[i] = (float(f(x + e)) - float(f(x - e))) / (2 * eps)
    np.testing.assert_allclose(g, fd, rtol=rtol, atol=1e-7)


W = RNG.randn(3, 3)


@pytest.mark.parametrize(
    "name, f, x",
    [
        ("solve", lambda a: jnp.sum(jnp.linalg.solve(a, V[:3]) * V[1:]), SQ),
        ("inv", lambda a: jnp.sum(jnp.linalg.inv(a) * W), SQ),
        ("det", lambda a: jnp.linalg.det(a), SQ),
        ("slogdet", lambda a: jnp.linalg.slogdet(a)[1], SQ),
        ("cholesky", lambda a: jnp.sum(jnp.linalg.cholesky(a) * W), SPD),
        ("eigh_w", lambda a: jnp.sum(jnp.linalg.eigh(a)[0] * V[:3]), SPD),
        ("eigh_v", lambda a: jnp.sum(jnp.abs(jnp.linalg.eigh(a)[1]) * W), SPD),
        ("svd_s", lambda a: jnp.sum(jnp.linalg.svd(a, compute_uv=False) * V[:3]), A),
        ("svd_uv", lambda a: jnp.sum(jnp.abs(jnp.linalg.svd(a, full_matrices=False)[0])), A),
        ("qr", lambda a: jnp.sum(jnp.linalg.qr(a)[1] * W[:, :2].T[:, :2]), B.T[:, :2]),
        ("pinv", lambda a: jnp.sum(jnp.linalg.pinv(a) * A.T), A),
    ],
)
@pytest.mark.usefixtures("x64_case")  # float64 reference on purpose
def test_linalg_grads_match_finite_differences(name, f, x):
    _fd_check(f, x)
    np.testing.assert_allclose(float(fflow.jit(f)(x)), float(f(x)), rtol=1e-10)


@pytest.mark.usefixtures("x64_case")  # float64 reference on purpose
def test_linalg_vmap_matches_loop():
    mats = np.stack([SQ, SQ + np.eye(3), SPD])
    out = fflow.vmap(jnp.linalg.inv)(mats)
    _close(out, np.stack([np.linalg.inv(m) for m in mats]))
    out = fflow.vmap(lambda m, b: jnp.linalg.solve(m, b))(mats, np.ones((3, 3)))
    _close(out, np.stack([np.linalg.solve(m, np.ones(3)) for m in mats]))
    dets = fflow.vmap(jnp.linalg.det)(mats)
    _close(dets, np.linalg.det(mats))


def _usv(svd):
    def f(a):
        u, s, vt = svd(a, full_matrices=False)
        return (u * s[..., None, :]) @ vt, s  # invariant to the signs of the vectors

    return f


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 4, 4)])
@pytest.mark.usefixtures("x64_case")  # float64 reference on purpose
def test_decomposition_jvps_match_jax(shape):
    # the JVP rules of primitives/linalg.py (lax-level, batched, both svd branches) vs JAX
    jax = pytest.importorskip("jax")
    import jax.numpy as xnp

    rng = np.random.RandomState(1)
    a, t = rng.randn(*shape), rng.randn(*shape)
    cases = [("svd", _usv(jnp.linalg.svd), _usv(xnp.linalg.svd), a, t)]
    if shape[-2] >= shape[-1]:
        cases.append(("qr", jnp.linalg.qr, xnp.linalg.qr, a, t))
    if shape[-2] == shape[-1]:
        spd = a @ np.swapaxes(a, -1, -2) + 4 * np.eye(shape[-1])
        sym = t + np.swapaxes(t, -1, -2)
        cases += [
            ("cholesky", jnp.linalg.cholesky, xnp.linalg.cholesky, spd, sym),
            ("eigh", lambda m: jnp.linalg.eigh(m)[0], lambda m: xnp.linalg.eigh(m)[0], spd, sym),
            (
                "slogdet",
                lambda m: jnp.linalg.slogdet(m)[1],
                lambda m: xnp.linalg.slogdet(m)[1],
                a,
                t,
            ),
        ]
    with jax.enable_x64(True):
        for name, f, g, x, dx in cases:
            ours = jax.tree_util.tree_leaves(fflow.jvp(f, (x,), (dx,))[1])
            ref = jax.jvp(g, (xnp.asarray(x),), (xnp.asarray(dx),))[1]
            for o, r in zip(ours, jax.tree_util.tree_leaves(ref), strict=True):
                np.testing.assert_allclose(np.asarray(o), r, rtol=1e-8, atol=1e-9, err_msg=name)
