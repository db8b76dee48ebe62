"""JAX's 64-bit rule: with x64 off (the default) NumPy float64/int64/uint64/complex128
inputs and requested 64-bit dtypes become 32-bit, eagerly and under jit, grad and
vmap, with JAX's weak types; `jax_enable_x64` (config or environment) keeps them.

Expected dtypes were recorded from JAX 0.10.2 (CPU), x64 off and on.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp
from fflow import lax
from fflow.experimental import enable_x64

F64 = np.linspace(-1.0, 1.0, 3)  # float64
I64 = np.arange(3)  # int64
U64 = np.arange(3, dtype=np.uint64)
C128 = np.ones(2, np.complex128)

# (name, thunk, (dtype, weak) with x64 off, (dtype, weak) with x64 on), from JAX 0.10.2
CASES = [
    ("i32 + 2.5", lambda: jnp.int32(1) + 2.5, ("float32", True), ("float64", True)),
    ("asarray u64", lambda: jnp.asarray(U64), ("uint32", False), ("uint64", False)),
    ("asarray f64", lambda: jnp.asarray(F64), ("float32", False), ("float64", False)),
    ("array f64", lambda: jnp.array(F64), ("float32", False), ("float64", False)),
    ("sin of f64", lambda: jnp.sin(F64), ("float32", False), ("float64", False)),
    ("jit", lambda: fflow.jit(lambda x: x * 2)(F64), ("float32", False), ("float64", False)),
    (
        "grad",
        lambda: fflow.grad(lambda x: (x**2).sum())(F64),
        ("float32", False),
        ("float64", False),
    ),
    ("vmap", lambda: fflow.vmap(lambda x: x * 2)(F64), ("float32", False), ("float64", False)),
    ("Python float", lambda: jnp.asarray(2.0), ("float32", True), ("float64", True)),
    ("zeros", lambda: jnp.zeros(3), ("float32", False), ("float64", False)),
    ("arange", lambda: jnp.arange(3), ("int32", False), ("int64", False)),
    ("jnp.float64(1.0)", lambda: jnp.float64(1.0), ("float32", False), ("float64", False)),
    (
        "astype f64",
        lambda: jnp.ones(3).astype(np.float64),
        ("float32", False),
        ("float64", False),
    ),
    ("i64 + 1.5", lambda: jnp.asarray(I64) + 1.5, ("float32", True), ("float64", True)),
    ("lax.add of NumPy", lambda: lax.add(F64, F64), ("float32", False), ("float64", False)),
    ("u32 + i32", lambda: jnp.uint32(1) + jnp.int32(1), ("int32", False), ("int64", False)),
    ("np f64 * f32", lambda: np.float64(2.0) * jnp.ones(3), ("float32", False), ("float64", False)),
    ("f32 * np f64", lambda: jnp.ones(3) * np.float64(2.0), ("float32", False), ("float64", False)),
    ("f32 * np f64[]", lambda: jnp.ones(3) * np.ones(3), ("float32", False), ("float64", False)),
    ("sum of ints", lambda: jnp.sum(jnp.arange(3)), ("int32", False), ("int64", False)),
    ("mean of ints", lambda: jnp.mean(jnp.arange(3)), ("float32", False), ("float64", False)),
    ("Python complex", lambda: jnp.asarray(1 + 2j), ("complex64", True), ("complex128", True)),
    ("NumPy complex128", lambda: jnp.asarray(C128), ("complex64", False), ("complex128", False)),
    (
        "jit of Python float",
        lambda: fflow.jit(lambda x: x)(2.0),
        ("float32", True),
        ("float64", True),
    ),
    (
        "grad of Python float",
        lambda: fflow.grad(lambda x: x**2)(2.0),
        ("float32", True),
        ("float64", True),
    ),
    ("zeros(dtype=int64)", lambda: jnp.zeros(2, jnp.int64), ("int32", False), ("int64", False)),
    (
        "convert_element_type f64",
        lambda: lax.convert_element_type(jnp.ones(2), np.float64),
        ("float32", False),
        ("float64", False),
    ),
    ("list of floats", lambda: jnp.array([1.0, 2.0]), ("float32", False), ("float64", False)),
    ("np.int64 scalar", lambda: jnp.asarray(np.int64(3)), ("int32", False), ("int64", False)),
    (
        "jit of np.int64",
        lambda: fflow.jit(lambda i: i + 1)(I64),
        ("int32", False),
        ("int64", False),
    ),
    (
        "vmap of grad",
        lambda: fflow.vmap(fflow.grad(lambda x: jnp.sin(x)))(F64),
        ("float32", False),
        ("float64", False),
    ),
    (
        "jit(grad)",
        lambda: fflow.jit(fflow.grad(lambda x: jnp.sum(x * x)))(F64),
        ("float32", False),
        ("float64", False),
    ),
    (
        "closed-over NumPy f64 under jit",
        lambda: fflow.jit(lambda x: x + F64)(jnp.ones(3, jnp.float32)),
        ("float32", False),
        ("float64", False),
    ),
    (
        "random.normal f64",
        lambda: fflow.random.normal(fflow.random.PRNGKey(0), (2,), np.float64),
        ("float32", False),
        ("float64", False),
    ),  # fmt: skip
]


def _check(thunk, want):
    out = thunk()
    assert (str(out.dtype), bool(out.weak_type)) == want


@pytest.mark.parametrize("name,thunk,off,on", CASES, ids=[c[0] for c in CASES])
def test_x64_off_canonicalises_to_32_bit(name, thunk, off, on):
    _check(thunk, off)


@pytest.mark.parametrize("name,thunk,off,on", CASES, ids=[c[0] for c in CASES])
def test_x64_on_keeps_64_bit(name, thunk, off, on):
    with enable_x64():
        _check(thunk, on)


def test_values_match_numpy_in_32_bit():
    x = np.random.RandomState(0).standard_normal(5)
    np.testing.assert_allclose(jnp.tanh(x), np.tanh(x).astype(np.float32), rtol=1e-6)
    g = fflow.jit(fflow.grad(lambda w: jnp.sum(jnp.tanh(w))))(x)
    assert g.dtype == np.float32
    np.testing.assert_allclose(g, 1 / np.cosh(x) ** 2, rtol=1e-5)


def test_jit_cache_separates_x64_modes():
    f = fflow.jit(lambda x: x + 1.0)
    assert f(F64).dtype == np.float32
    with enable_x64():
        assert f(F64).dtype == np.float64
    assert f(F64).dtype == np.float32


def test_config_names_and_flag_reads():
    assert not fflow.config.jax_enable_x64 and not fflow.config.enable_x64
    fflow.config.update("jax_enable_x64", True)
    try:
        assert fflow.config.jax_enable_x64 and fflow.config.read("jax_enable_x64")
        assert jnp.zeros(1).dtype == np.float64 and jnp.float_.dtype == np.float64
    finally:
        fflow.config.update("jax_enable_x64", False)
    assert jnp.zeros(1).dtype == np.float32 and jnp.float_.dtype == np.float32


@pytest.mark.parametrize("var", ["JAX_ENABLE_X64", "FFLOW_ENABLE_X64"])
def test_environment_turns_x64_on(var):
    code = "import numpy as np, fflow.numpy as jnp; print(jnp.asarray(np.ones(1)).dtype)"
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_ENABLE_X64", "FFLOW_ENABLE_X64")}
    env[var] = "1"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "float64"


def test_jax_agrees_when_installed():
    jax = pytest.importorskip("jax")
    import jax.numpy as real_jnp

    # the recorded table above, re-checked against the installed JAX (x64 off)
    if jax.config.jax_enable_x64:
        pytest.skip("JAX runs with x64 on in this process")
    assert real_jnp.asarray(F64).dtype == np.float32
    assert (real_jnp.asarray(I64) + 1.5).weak_type
