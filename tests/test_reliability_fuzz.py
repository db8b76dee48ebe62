"""Differential fuzzing (issue 16): hypothesis draws small programs over the op
families (elementwise, reductions, shapes, indexing, dynamic_slice, dot, cumulative,
select, sort) and runs each under f, jit, vmap, grad and jvp. Every result is checked
against an independent reference: the same program written in NumPy (float64), and
central finite differences of that NumPy program for the derivatives.

FFLOW_FUZZ_EXAMPLES=2000 runs a longer campaign locally; FFLOW_FUZZ_JAX=1 also
compares every program with JAX itself (values, dtypes, weak types, gradients).
"""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fflow
import fflow.numpy as jnp
from fflow import lax

N_EXAMPLES = int(os.environ.get("FFLOW_FUZZ_EXAMPLES", "120"))
SETTINGS = settings(
    max_examples=N_EXAMPLES,
    deadline=None,
    derandomize=True,  # the same programs every run: the suite stays deterministic
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _np_start(i, d, n):
    i = i + d if i < 0 else i  # JAX: a negative start counts from the end, then clamps
    return min(max(i, 0), d - n)


def _np_dynamic_slice0(v, s, n):
    s = _np_start(s, v.shape[0], n)
    return v[s : s + n]


class _NumpyLax:
    """The one lax function the programs use, in NumPy (JAX's documented semantics)."""

    @staticmethod
    def dynamic_slice_in_dim(v, i, n, axis=0):
        assert axis == 0
        return _np_dynamic_slice0(v, i, n)


# Each op is written once over a NumPy-like namespace `m` and a lax-like `L`: run with
# fflow (fflow.numpy, fflow.lax), with NumPy (the reference) or with JAX (where
# installed). name -> (applies to this shape?, op(v, params, m, L), smooth?)
OPS = {
    "sin": (lambda s: True, lambda v, p, m, L: m.sin(v), True),
    "tanh": (lambda s: True, lambda v, p, m, L: m.tanh(v), True),
    "exp_tanh": (lambda s: True, lambda v, p, m, L: m.exp(m.tanh(v)), True),
    "log1p_sq": (lambda s: True, lambda v, p, m, L: m.log1p(v * v), True),
    "sqrt": (lambda s: True, lambda v, p, m, L: m.sqrt(v * v + 1.0), True),
    "affine": (lambda s: True, lambda v, p, m, L: v * p["c"] + p["d"], True),
    "square": (lambda s: True, lambda v, p, m, L: v**2, True),
    "div": (lambda s: True, lambda v, p, m, L: v / (1.0 + v * v), True),
    "mod": (lambda s: True, lambda v, p, m, L: v % 1.5 + v // 2.0, False),
    "maximum": (lambda s: True, lambda v, p, m, L: m.maximum(v, p["c"]), False),
    "where": (lambda s: True, lambda v, p, m, L: m.where(v > 0, v, 0.5 * v), False),
    "sum_last": (lambda s: len(s) >= 2, lambda v, p, m, L: m.sum(v, axis=-1), True),
    "mean0_keep": (lambda s: True, lambda v, p, m, L: m.mean(v, axis=0, keepdims=True), True),
    "max_last": (lambda s: len(s) >= 2, lambda v, p, m, L: m.max(v, axis=-1), False),
    "cumsum": (lambda s: True, lambda v, p, m, L: m.cumsum(v, axis=-1), True),
    "transpose": (lambda s: True, lambda v, p, m, L: v.T, True),
    "ravel": (lambda s: True, lambda v, p, m, L: v.reshape(-1), True),
    "slice": (lambda s: s[-1] > 1, lambda v, p, m, L: v[..., 1:], True),
    "rev": (lambda s: True, lambda v, p, m, L: v[::-1], True),
    "concat": (
        lambda s: s[0] <= 6,
        lambda v, p, m, L: m.concatenate([v, 2.0 * v], axis=0),
        True,
    ),
    "matmul": (lambda s: len(s) == 2, lambda v, p, m, L: v @ v.T, True),
    "outer": (lambda s: len(s) == 1 and s[0] <= 6, lambda v, p, m, L: m.outer(v, v), True),
    "dyn_slice": (
        lambda s: True,
        lambda v, p, m, L: L.dynamic_slice_in_dim(v, p["i"], p["n"], axis=0),
        True,
    ),
    "index": (lambda s: len(s) >= 2, lambda v, p, m, L: v[p["i"]], True),
    "sort": (lambda s: True, lambda v, p, m, L: m.sort(v, axis=-1), False),
    "clip": (lambda s: True, lambda v, p, m, L: m.clip(v, -0.5, 0.5), False),
}


@st.composite
def programs(draw):
    """(input shape, list of (op name, params)) with every op valid for its input."""
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=2)))
    steps = []
    cur = shape
    for _ in range(draw(st.integers(1, 5))):
        names = [n for n, op in OPS.items() if op[0](cur)]
        name = draw(st.sampled_from(names))
        d = cur[0]
        params = {
            "c": draw(st.sampled_from([-1.5, -0.5, 0.25, 2.0])),
            "d": draw(st.sampled_from([0.0, 1.0, -0.75])),
            "n": draw(st.integers(1, d)),
            "i": draw(st.integers(-d - 2, d + 1)) if name == "dyn_slice" else None,
        }
        if name == "index":
            params["i"] = draw(st.integers(-d, d - 1))
        steps.append((name, params))
        cur = np.shape(OPS[name][1](np.zeros(cur), params, np, _NumpyLax))
        if not cur:  # keep at least one axis
            steps.pop()
            break
        if int(np.prod(cur)) > 64:
            break
    return shape, steps


def _run(steps, v, m, L):
    for name, params in steps:
        v = OPS[name][1](v, params, m, L)
    return v


def _fflow_fn(steps):
    return lambda x: _run(steps, x, jnp, lax)


def _numpy_fn(steps):
    return lambda x: _run(steps, np.asarray(x, np.float64), np, _NumpyLax)


def _input(shape, seed):
    rng = np.random.RandomState(seed)
    return rng.uniform(-2.0, 2.0, shape).astype(np.float32)


def _close(actual, expected, what, scale=1.0):
    actual = np.asarray(actual)
    assert actual.shape == np.shape(expected), (
        f"{what}: shape {actual.shape} vs {np.shape(expected)}"
    )
    assert actual.dtype == np.float32, f"{what}: dtype {actual.dtype}"
    tol = 2e-3 * max(1.0, scale)
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol, err_msg=what)


@SETTINGS
@given(prog=programs(), seed=st.integers(0, 2**16))
def test_drawn_programs_match_numpy_under_f_jit_vmap(prog, seed):
    shape, steps = prog
    f, ref = _fflow_fn(steps), _numpy_fn(steps)
    x = _input(shape, seed)
    expected = ref(x)
    scale = float(np.max(np.abs(expected), initial=1.0))
    _close(f(jnp.asarray(x)), expected, f"f {steps}", scale)
    _close(fflow.jit(f)(x), expected, f"jit {steps}", scale)
    xs = np.stack([x, _input(shape, seed + 1)])
    batched = np.stack([ref(xs[0]), ref(xs[1])])
    _close(fflow.vmap(f)(xs), batched, f"vmap {steps}", float(np.max(np.abs(batched), initial=1.0)))


def _fd_directional(ref, x, v, eps=1e-4):
    x = x.astype(np.float64)
    return (ref(x + eps * v) - ref(x - eps * v)) / (2 * eps)


@SETTINGS
@given(prog=programs(), seed=st.integers(0, 2**16))
def test_drawn_programs_derivatives_match_finite_differences(prog, seed):
    shape, steps = prog
    if not all(OPS[name][2] for name, _ in steps):
        steps = [(n, p) for n, p in steps if OPS[n][2]] or [("sin", steps[0][1])]
        # the smooth ops alone still form a valid program only if shapes allow it
        try:
            _numpy_fn(steps)(np.zeros(shape))
        except Exception:
            return
    f, ref = _fflow_fn(steps), _numpy_fn(steps)
    x = _input(shape, seed)
    v = np.random.RandomState(seed + 7).standard_normal(shape)
    fd = _fd_directional(ref, x, v)
    scale = float(np.max(np.abs(fd), initial=1.0))
    _, t = fflow.jvp(f, (x,), (v.astype(np.float32),))
    _close(t, fd, f"jvp {steps}", scale)
    w = np.random.RandomState(seed + 11).standard_normal(np.shape(fd))

    def loss(x):
        return jnp.sum(f(x) * w.astype(np.float32))

    for name, g_fn in (("grad", fflow.grad(loss)), ("jit(grad)", fflow.jit(fflow.grad(loss)))):
        g = np.asarray(g_fn(x), np.float64)
        # <grad, v> equals the directional derivative of the weighted sum
        lhs, rhs = float(np.sum(g * v)), float(np.sum(w * fd))
        tol = 2e-3 * max(1.0, float(np.sum(np.abs(w * fd))), float(np.sum(np.abs(g * v))))
        assert abs(lhs - rhs) <= tol, f"{name} {steps}: <g,v>={lhs} vs fd {rhs}"


@settings(SETTINGS, max_examples=max(10, N_EXAMPLES // 6))  # JAX's dispatch is slow
@given(prog=programs(), seed=st.integers(0, 2**16))
def test_drawn_programs_match_jax(prog, seed):
    """The same program under JAX, with its dtypes and weak types. JAX compiles every
    new op and shape (seconds per example on a loaded machine), so this campaign runs
    with FFLOW_FUZZ_JAX=1 where JAX is installed."""
    if os.environ.get("FFLOW_FUZZ_JAX") != "1":
        pytest.skip("set FFLOW_FUZZ_JAX=1 to fuzz against JAX (slow)")
    jax = pytest.importorskip("jax")
    shape, steps = prog
    x = _input(shape, seed)
    ours = _fflow_fn(steps)
    theirs = lambda v: _run(steps, v, jax.numpy, jax.lax)  # noqa: E731
    a, b = ours(jnp.asarray(x)), theirs(jax.numpy.asarray(x))
    assert a.dtype == b.dtype and a.weak_type == b.weak_type, f"{steps}: {a!r} vs {b!r}"
    scale = float(np.max(np.abs(np.asarray(b)), initial=1.0))
    _close(a, np.asarray(b, np.float64), f"f vs jax {steps}", scale)
    if all(OPS[name][2] for name, _ in steps):
        g_ours = fflow.grad(lambda v: jnp.sum(ours(v)))(x)
        g_theirs = jax.grad(lambda v: jax.numpy.sum(theirs(v)))(x)
        gs = float(np.max(np.abs(np.asarray(g_theirs)), initial=1.0))
        _close(g_ours, np.asarray(g_theirs, np.float64), f"grad vs jax {steps}", gs)


def test_fuzz_reference_catches_a_wrong_answer():
    # the checker itself: a wrong program (sin instead of tanh) must fail the comparison
    x = _input((3,), 0)
    with pytest.raises(AssertionError):
        _close(_fflow_fn([("sin", {})])(x), _numpy_fn([("tanh", {})])(x), "self-check")
