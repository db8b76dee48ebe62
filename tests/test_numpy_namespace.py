"""fflow.numpy's public names are jax.numpy's and nothing else (no helper or module
leaks through `import *`), and every name it lists exists."""

import types

import pytest

import fflow.numpy as jnp


def test_every_listed_name_exists():
    missing = [n for n in jnp.__all__ if not hasattr(jnp, n)]
    assert not missing


def test_dir_is_the_public_names():
    public = {n for n in dir(jnp) if not n.startswith("_")}
    assert public == set(jnp.__all__) | {"bfloat16"}


def test_no_internal_module_or_helper_is_public():
    for name in jnp.__all__:
        value = getattr(jnp, name)
        if isinstance(value, types.ModuleType):
            assert name in ("fft", "linalg"), name  # jax.numpy's submodules
    for helper in ("np", "lax", "dtypes", "user_error", "promote_dtypes", "operand", "builtins"):
        assert helper not in dir(jnp)


def test_names_match_jax_numpy():
    jax_numpy = pytest.importorskip("jax.numpy")
    theirs = {n for n in dir(jax_numpy) if not n.startswith("_")}
    ours = {n for n in dir(jnp) if not n.startswith("_")}
    assert ours <= theirs, f"names jax.numpy does not have: {sorted(ours - theirs)}"
    # what is missing is a known list (grows shorter as fflow.numpy grows)
    assert len(theirs - ours) <= 70, sorted(theirs - ours)
