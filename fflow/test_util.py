"""Gradient checking in JAX's manner (`jax.test_util.check_grads`).

Forward mode is checked against central finite differences along one random
direction; reverse mode is checked against forward mode by inner products
(`<u, J v> == <J^T u, v>`), and both recurse to higher orders by differentiating
the derivative functions themselves.

Example:
    >>> import numpy as np
    >>> import fflow.numpy as jnp
    >>> from fflow.test_util import check_grads
    >>> check_grads(lambda x: jnp.sin(x) * x, (np.linspace(0.1, 1.0, 4),), order=2)
"""

import numpy as np

from fflow import dtypes
from fflow.array import Array
from fflow.core import Program
from fflow.transforms.ad_api import jvp, vjp
from fflow.tree_util import tree_flatten, tree_map

EPS = 1e-4

# Finite-difference steps: central differences have error ~ eps**2 (truncation)
# + ulp / eps (rounding); these balance the two for each precision.
_DEFAULT_EPS = {"float64": 1e-4, "float32": 3e-3, "float16": 3e-2, "bfloat16": 1e-1}

# Tolerances of gradient checks (JAX's `default_gradient_tolerance`).
_DEFAULT_TOL = {
    "float64": 1e-5,
    "float32": 2e-3,
    "float16": 1e-2,
    "bfloat16": 1e-1,
    "complex128": 1e-5,
    "complex64": 1e-3,
}


def _np(x):
    return np.asarray(x)


def _is_float(dtype):
    return dtypes.is_inexact(np.dtype(dtype))


def _leaves(tree):
    return [_np(x) for x in tree_flatten(tree)[0]]


def _tol(trees, given):
    if given is not None:
        return given
    tol = 0.0
    for tree in trees:
        for x in _leaves(tree):
            tol = max(tol, _DEFAULT_TOL.get(x.dtype.name, 0.0))
    return tol or 1e-5


def _eps(args, given):
    if given is not None:
        return given
    eps = 0.0
    for x in _leaves(args):
        if _is_float(x.dtype):
            eps = max(eps, _DEFAULT_EPS.get(x.dtype.name, EPS))
    return eps or EPS


def _to_fflow(tree):

    return tree_map(lambda x: Array(dtypes.canonical_array(np.asarray(x))), tree)


def _rand_like(rng, x):
    x = _np(x)
    if not _is_float(x.dtype):
        return np.zeros(x.shape, x.dtype)
    return np.asarray(rng.standard_normal(x.shape), dtype=x.dtype)


def _add_scaled(args, tangent, scale):
    def add(a, t):
        a = _np(a)
        if not _is_float(a.dtype):
            return a
        # the step is taken in float64 and rounded once, so f32 steps stay symmetric
        return np.asarray(a.astype(np.float64) + scale * t.astype(np.float64), a.dtype)

    return tree_map(add, args, tangent)


def numerical_jvp(f, args, tangent, eps):
    """(f(args + eps t) - f(args - eps t)) / (2 eps), leaf by leaf, in float64."""
    f_pos = f(*_to_fflow(_add_scaled(args, tangent, eps)))
    f_neg = f(*_to_fflow(_add_scaled(args, tangent, -eps)))
    return tree_map(
        lambda p, n: (_np(p).astype(np.float64) - _np(n).astype(np.float64)) * (0.5 / eps),
        f_pos,
        f_neg,
    )


def _inner_prod(xs, ys):
    x_leaves, ys_leaves = _leaves(xs), _leaves(ys)
    if len(x_leaves) != len(ys_leaves):
        raise AssertionError(f"inner product of trees with {len(x_leaves)} and {len(ys_leaves)}")
    total = 0.0
    for x, y in zip(x_leaves, ys_leaves):
        if x.shape != y.shape:
            raise AssertionError(f"inner product of shapes {x.shape} and {y.shape}")
        if _is_float(x.dtype) and _is_float(y.dtype):
            total += np.vdot(x.astype(np.float64), y.astype(np.float64)).real
    return total


def check_close(actual, expected, atol=None, rtol=None, err_msg=""):
    """Assert two pytrees of arrays are close (tolerances default by dtype)."""
    a_leaves, a_tree = tree_flatten(actual)
    e_leaves, e_tree = tree_flatten(expected)
    if a_tree != e_tree:
        raise AssertionError(f"{err_msg}: structures differ: {a_tree} vs {e_tree}")
    tol = _tol([actual], None)
    for a, e in zip(a_leaves, e_leaves):
        a, e = _np(a), _np(e)
        if a.shape != e.shape:
            raise AssertionError(f"{err_msg}: shapes differ: {a.shape} vs {e.shape}")
        if dtypes.float0 in (a.dtype, e.dtype):
            continue  # the tangent of an integer value carries no data (JAX's float0)
        if not (_is_float(a.dtype) or _is_float(e.dtype)):
            np.testing.assert_array_equal(a, e, err_msg=err_msg)
            continue
        np.testing.assert_allclose(
            a.astype(np.float64),
            e.astype(np.float64),
            atol=tol if atol is None else atol,
            rtol=tol if rtol is None else rtol,
            err_msg=err_msg,
        )


def check_jvp(f, f_jvp, args, atol=None, rtol=None, eps=EPS, err_msg=""):
    """Check `f_jvp(primals, tangents)` against central finite differences of `f`."""
    rng = np.random.RandomState(0)
    tangent = tree_map(lambda x: _rand_like(rng, x), args)
    v_out, t_out = f_jvp(_to_fflow(args), _to_fflow(tangent))
    v_expected = f(*_to_fflow(args))
    t_expected = numerical_jvp(f, args, tangent, eps)
    check_close(v_out, v_expected, atol, rtol, f"{err_msg} primal")
    tol_a = _tol([v_out], atol)
    tol_r = _tol([v_out], rtol)
    check_close(t_out, t_expected, tol_a, tol_r, f"{err_msg} tangent")


def check_vjp(f, f_vjp, args, atol=None, rtol=None, eps=EPS, err_msg=""):
    """Check `f_vjp(*args) -> (out, vjp_fn)` by `<vjp(u), v> == <u, fd_jvp(v)>`."""
    rng = np.random.RandomState(0)
    v_out, vjp_fn = f_vjp(*_to_fflow(args))
    v_expected = f(*_to_fflow(args))
    check_close(v_out, v_expected, atol, rtol, f"{err_msg} primal")
    tangent = tree_map(lambda x: _rand_like(rng, x), args)
    t_out = numerical_jvp(f, args, tangent, eps)
    cotangent = tree_map(lambda x: _rand_like(rng, x), v_out)
    ct_out = vjp_fn(_to_fflow(cotangent))
    ip = _inner_prod(tangent, ct_out)
    ip_expected = _inner_prod(t_out, cotangent)
    tol_a = _tol([v_out], atol)
    tol_r = _tol([v_out], rtol)
    np.testing.assert_allclose(
        ip, ip_expected, atol=tol_a, rtol=tol_r, err_msg=f"{err_msg} inner product"
    )


def check_grads(f, args, order=2, modes=("fwd", "rev"), atol=None, rtol=None, eps=None):
    """Check derivatives of `f` at `args` up to `order` against finite differences.

    Args:
        f: a function of positional array arguments (pytrees allowed) returning a
            pytree of float arrays.
        args: tuple of arguments. Use float64 inputs with x64 on for tight checks.
        order: highest derivative order to check.
        modes: any of "fwd" (jvp vs. finite differences) and "rev" (vjp vs. jvp by
            inner products).
        atol, rtol: tolerances; by default 2e-3 for float32 and 1e-5 for float64.
        eps: finite-difference step; by default 1e-4 for float64 (3e-3 for float32).

    Raises:
        AssertionError: when a derivative does not match.

    Example:
        >>> import numpy as np
        >>> import fflow.numpy as jnp
        >>> from fflow.test_util import check_grads
        >>> check_grads(jnp.tanh, (np.array([0.1, -0.5]),), order=2)
    """

    args = tuple(args)
    # as JAX: 64-bit inputs are checked as 32-bit ones unless x64 is on
    args = tree_map(lambda x: dtypes.canonical_array(_np(x)), args)
    eps = _eps(args, eps)
    unknown = set(modes) - {"fwd", "rev"}
    if unknown:
        raise ValueError(f"check_grads: unknown modes {sorted(unknown)}; use 'fwd' and/or 'rev'")

    def _check(f, args, order, err_msg):
        if "fwd" in modes:
            msg = f"JVP of {err_msg}" if err_msg else "JVP"
            check_jvp(f, lambda p, t: jvp(f, p, t), args, atol, rtol, eps, msg)
            if order > 1:

                def f_jvp(primals, tangents):
                    return jvp(f, tuple(primals), tuple(tangents))

                _check(f_jvp, (args, args), order - 1, msg)
        if "rev" in modes:
            msg = f"VJP of {err_msg}" if err_msg else "VJP"
            check_vjp(f, lambda *a: vjp(f, *a), args, atol, rtol, eps, msg)
            if order > 1:

                def f_vjp(*a):
                    out, vjp_fn = vjp(f, *a)
                    return vjp_fn(out)

                _check(f_vjp, args, order - 1, msg)

    _check(f, args, order, "")


def primitive_names(program):
    """The names of the primitives a Program uses, its sub-programs' included.

    Example:
        >>> import fflow, fflow.numpy as jnp
        >>> sorted(primitive_names(fflow.make_jaxpr(lambda x: jnp.sin(x) * x)(1.0)))
        ['mul', 'sin']
    """
    names = set()
    for e in program.eqns:
        names.add(e.primitive.name)
        for v in e.params.values():
            if isinstance(v, Program):
                names |= primitive_names(v)
    return names


__all__ = [
    "primitive_names",
    "check_grads",
    "check_jvp",
    "check_vjp",
    "check_close",
    "numerical_jvp",
]
