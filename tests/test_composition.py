"""The composition matrix: f, jit(f), jvp(jit(f)), grad(jit(f)), jit(grad(f)),
grad(grad(f)), jacfwd(f) == jacrev(f), hessian(f) agree with each other and with
finite differences of the untransformed function (float64 throughout)."""

import importlib.util

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp
from fflow import lax

pytestmark = pytest.mark.usefixtures("x64")  # float64 references on purpose

HAS_VMAP = importlib.util.find_spec("fflow.transforms.vmap") is not None
needs_vmap = pytest.mark.skipif(not HAS_VMAP, reason="fflow.transforms.vmap is not available")

A = np.random.RandomState(0).randn(4, 4) * 0.5
X0 = np.array([0.31, -0.72, 1.13, 0.45])


@fflow.custom_jvp
def _softplus(x):
    return jnp.log1p(jnp.exp(x))


_softplus.defjvps(lambda t, ans, x: t * lax.logistic(x))


def _scan_fn(x):
    carry, ys = lax.scan(lambda c, xi: (c * jnp.cos(xi) + xi, c * xi), 1.0, x)
    return carry + jnp.sum(ys)


def _cond_fn(x):
    return lax.cond(jnp.sum(x) > 0, lambda v: jnp.sum(jnp.sin(v) ** 2), lambda v: jnp.sum(v), x)


FUNCS = {
    "sin_poly": lambda x: jnp.sum(jnp.sin(x) * x**2),
    "tanh_matmul": lambda x: jnp.sum(jnp.tanh(x @ A) ** 2),
    "logsumexp": lambda x: jnp.log(jnp.sum(jnp.exp(x))),
    "max_prod": lambda x: jnp.max(x * 2.0) + jnp.prod(x),
    "slices": lambda x: jnp.sum(x[1:] * x[:-1]) + x[0] ** 3,
    "where": lambda x: jnp.sum(jnp.where(x > 0, x**2, jnp.sin(x))),
    "cumsum_sort": lambda x: jnp.sum(jnp.cumsum(x) * jnp.sort(x)),
    "norm_div": lambda x: jnp.linalg.norm(x) / (1.0 + x[2] ** 2),
    "outer_reshape": lambda x: jnp.sum(jnp.reshape(jnp.outer(x, x), (2, 8)).T @ x[:2]),
    "custom_jvp": lambda x: jnp.sum(_softplus(x) * x),
    "checkpoint": fflow.checkpoint(lambda x: jnp.sum(jnp.exp(jnp.sin(x)) * x)),
    "scan": _scan_fn,
    "cond": _cond_fn,
}


def _fd_grad(f, x, eps=1e-5):
    x = np.asarray(x, np.float64)
    g = np.zeros_like(x)
    for i in range(x.size):
        e = np.zeros_like(x)
        e.flat[i] = eps
        g.flat[i] = (float(f(x + e)) - float(f(x - e))) / (2 * eps)
    return g


def _fd_hessian(f, x, eps=1e-4):
    grad = fflow.grad(f)
    x = np.asarray(x, np.float64)
    rows = []
    for i in range(x.size):
        e = np.zeros_like(x)
        e.flat[i] = eps
        rows.append((np.asarray(grad(x + e)) - np.asarray(grad(x - e))) / (2 * eps))
    return np.stack(rows)


def _close(a, b, tol=1e-7):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


@pytest.fixture(params=sorted(FUNCS))
def f(request):
    return FUNCS[request.param]


def test_jit_matches_eager(f):
    _close(fflow.jit(f)(X0), f(X0), 1e-12)


def test_jvp_of_jit_matches_finite_differences(f):
    t = np.array([0.5, -1.0, 0.25, 2.0])
    y, ty = fflow.jvp(fflow.jit(f), (X0,), (t,))
    y2, ty2 = fflow.jvp(f, (X0,), (t,))
    _close(y, f(X0), 1e-12)
    _close(ty, ty2, 1e-10)
    eps = 1e-6
    _close(ty, (float(f(X0 + eps * t)) - float(f(X0 - eps * t))) / (2 * eps), 1e-6)


def test_grads_compose(f):
    ref = _fd_grad(f, X0)
    g = fflow.grad(f)(X0)
    _close(g, ref, 1e-6)
    _close(fflow.grad(fflow.jit(f))(X0), g, 1e-10)
    _close(fflow.jit(fflow.grad(f))(X0), g, 1e-10)
    _close(fflow.jit(fflow.grad(fflow.jit(f)))(X0), g, 1e-10)
    v, g2 = fflow.value_and_grad(f)(X0)
    _close(v, f(X0), 1e-12)
    _close(g2, g, 1e-12)


def test_grad_of_grad(f):
    # a scalar slice through f (float64, as Python floats would give float32)
    def along(s):
        return f(X0 * s)

    one, h = np.float64(1.0), np.float64(1e-4)
    expected = (float(fflow.grad(along)(one + h)) - float(fflow.grad(along)(one - h))) / (2 * h)
    _close(fflow.grad(fflow.grad(along))(one), expected, 1e-6)
    _close(fflow.jit(fflow.grad(fflow.grad(along)))(one), expected, 1e-6)
    _close(fflow.grad(fflow.jit(fflow.grad(along)))(one), expected, 1e-6)


@needs_vmap
def test_jacfwd_equals_jacrev(f):
    def vec(x):  # a vector-valued relative of f
        return jnp.stack([f(x), f(x * 0.5) * x[1], jnp.sum(x) * f(x)])

    jf = fflow.jacfwd(vec)(X0)
    jr = fflow.jacrev(vec)(X0)
    assert np.shape(jf) == (3, 4)
    _close(jf, jr, 1e-10)
    _close(np.asarray(jf)[0], _fd_grad(f, X0), 1e-6)


@needs_vmap
def test_hessian(f):
    h = fflow.hessian(f)(X0)
    _close(h, _fd_hessian(f, X0), 1e-5)
    _close(h, np.asarray(h).T, 1e-8)
    _close(fflow.jit(fflow.hessian(f))(X0), h, 1e-10)
