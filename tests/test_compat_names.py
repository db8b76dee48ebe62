"""JAX names fflow provides for JAX programs, each against JAX's semantics: values
recorded from JAX 0.10.2 (CPU) as literals, or NumPy/SciPy as the reference."""

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp
from fflow import dtypes, lax


def test_typing_and_version():
    from fflow.typing import ArrayLike, DTypeLike

    assert isinstance(jnp.ones(2), ArrayLike) and isinstance(np.ones(2), ArrayLike)
    assert DTypeLike is not None
    assert fflow.__version_info__ == (0, 10, 2) and fflow.__version__ == "0.10.2"


def test_ravel_pytree_matches_jax():
    from fflow.flatten_util import ravel_pytree

    tree = {"a": jnp.ones(2, jnp.int32), "b": (jnp.arange(3.0).reshape(1, 3), 2.0)}
    flat, unravel = ravel_pytree(tree)
    assert flat.dtype == np.float32 and flat.tolist() == [1.0, 1.0, 0.0, 1.0, 2.0, 2.0]
    back = unravel(flat * 2)
    assert back["a"].dtype == np.int32 and back["a"].tolist() == [2, 2]
    assert back["b"][0].shape == (1, 3) and float(back["b"][1]) == 4.0
    g = fflow.grad(lambda v: jnp.sum(unravel(v)["b"][0] ** 2))(flat)
    np.testing.assert_allclose(g, [0, 0, 0, 2, 4, 0])
    with pytest.raises(ValueError):
        unravel(jnp.ones(5))


def test_importable_scipy_submodules():
    import fflow.scipy.stats.norm as norm
    import scipy.linalg as sl
    import scipy.signal as ss

    from fflow.scipy import linalg, signal

    np.testing.assert_allclose(norm.logpdf(0.0), -0.9189385, rtol=1e-6)
    a = np.array([[4.0, 2.0, 0.5], [2.0, 3.0, 0.1], [0.5, 0.1, 2.0]], np.float32)
    b = np.array([1.0, 2.0, 3.0], np.float32)
    for lower in (False, True):
        got = linalg.cho_solve(linalg.cho_factor(a, lower=lower), b)
        np.testing.assert_allclose(got, sl.cho_solve(sl.cho_factor(a, lower=lower), b), atol=1e-5)
    tri = linalg.solve_triangular(a, b, lower=True, trans=1)
    np.testing.assert_allclose(tri, sl.solve_triangular(a, b, lower=True, trans=1), atol=1e-5)
    np.testing.assert_allclose(linalg.expm(a * 0.3), sl.expm(a * 0.3), rtol=1e-4)
    x = np.random.RandomState(0).rand(5, 6).astype(np.float32)
    k = np.random.RandomState(1).rand(2, 3).astype(np.float32)
    for mode in ("full", "same", "valid"):
        np.testing.assert_allclose(
            signal.convolve2d(x, k, mode), ss.convolve2d(x, k, mode), atol=1e-5
        )
        np.testing.assert_allclose(
            signal.correlate(x, k, mode), ss.correlate(x, k, mode), atol=1e-5
        )


def test_jacobian_policies_and_contexts():
    f = lambda x: jnp.sin(x) * x[0]  # noqa: E731
    x = jnp.array([0.3, 0.7])
    np.testing.assert_allclose(fflow.jacobian(f)(x), fflow.jacfwd(f)(x), rtol=1e-6)
    from fflow.ad_checkpoint import checkpoint, checkpoint_name, checkpoint_policies

    for policy in (
        checkpoint_policies.save_only_these_names("h"),
        checkpoint_policies.save_any_names_but_these("h"),
        checkpoint_policies.dots_saveable,
        checkpoint_policies.save_from_both_policies(
            checkpoint_policies.dots_saveable, checkpoint_policies.nothing_saveable
        ),
    ):
        g = fflow.grad(checkpoint(lambda v: jnp.sin(checkpoint_name(v * 2, "h")), policy=policy))
        np.testing.assert_allclose(g(0.5), 2 * np.cos(1.0), rtol=1e-6)
    with fflow.default_matmul_precision("float32"), fflow.ensure_compile_time_eval():
        with fflow.named_scope("block"):
            assert fflow.named_call(jnp.sin)(0.0) == 0.0
    assert fflow.device_count() == fflow.local_device_count() == len(fflow.local_devices())
    assert fflow.process_index() == 0 and fflow.process_count() == 1


def test_lax_conv_and_shape_helpers_match_jax():
    # values from JAX 0.10.2
    assert lax.conv_general_shape_tuple(
        (2, 5, 7, 3), (3, 3, 3, 4), (2, 1), "VALID", ("NHWC", "HWIO", "NHWC")
    ) == (2, 2, 5, 4)
    assert lax.reduce_window_shape_tuple((5, 7), (3, 2), (2, 2), ((1, 0), (0, 1))) == (2, 4)
    assert lax.padtype_to_pads((7,), (4,), (3,), "SAME_LOWER") == [(2, 1)]
    assert lax.padtype_to_pads((7,), (4,), (3,), "SAME") == [(1, 2)]
    x = np.arange(2 * 3 * 5 * 5, dtype=np.float32).reshape(2, 3, 5, 5) / 50
    w = np.arange(4 * 3 * 3 * 3, dtype=np.float32).reshape(4, 3, 3, 3) / 100
    y = lax.conv(x, w, (1, 1), "SAME")
    assert y.shape == (2, 4, 5, 5)
    np.testing.assert_allclose(float(jnp.sum(y)), 3358.91357421875, rtol=1e-5)


def test_dtypes_functions_and_float8():
    assert dtypes.result_type(jnp.int8, jnp.uint8) == np.int16
    assert dtypes.result_type(jnp.float16, 1.0) == np.float16
    assert dtypes.result_type(jnp.bfloat16, jnp.float16) == np.float32
    assert dtypes.result_type(jnp.arange(2), 1.5, return_weak_type_flag=True) == (np.float32, True)
    assert dtypes.issubdtype(jnp.bfloat16, jnp.floating)
    assert dtypes.issubdtype(jnp.float8_e4m3fn, jnp.floating)
    assert dtypes.issubdtype(jnp.int4, jnp.integer)
    assert not dtypes.issubdtype(jnp.int32, jnp.floating)
    assert jnp.asarray([0.3], jnp.float8_e5m2).astype(jnp.float32).tolist() == [0.3125]
    assert dtypes.canonicalize_dtype(np.float64) == np.float32


def test_vdot_conjugates_and_takes_precision():
    a, b = np.array([1 + 1j, 2], np.complex64), np.array([1j, 1], np.complex64)
    np.testing.assert_allclose(jnp.vdot(a, b, precision=lax.Precision.HIGHEST), np.vdot(a, b))


def test_complex_cholesky_keeps_imaginary_parts():
    a = np.array([[4, 1 + 2j], [1 - 2j, 6]], np.complex64)
    np.testing.assert_allclose(jnp.linalg.cholesky(a), np.linalg.cholesky(a), rtol=1e-6)


def test_nested_checkpoint_gradients():
    ck = fflow.checkpoint
    np.testing.assert_allclose(fflow.grad(ck(ck(jnp.sin)))(1.0), np.cos(1.0), rtol=1e-6)
    g = ck(lambda x: ck(lambda y: ck(jnp.exp)(y) * y)(x) * x)
    ref = lambda x: np.exp(x) * (x * x + 2 * x)  # noqa: E731  d/dx e^x x^2
    np.testing.assert_allclose(fflow.grad(g)(0.7), ref(0.7), rtol=1e-6)
    np.testing.assert_allclose(fflow.jit(fflow.grad(g))(0.7), ref(0.7), rtol=1e-6)
    h = ck(lambda x: jnp.sum(ck(lambda y: jnp.tanh(y) * y)(x) ** 2))
    x = np.array([0.3, 0.5], np.float32)
    plain = fflow.grad(lambda x: jnp.sum((jnp.tanh(x) * x) ** 2))(x)
    np.testing.assert_allclose(fflow.grad(h)(x), plain, rtol=1e-6)
    second = fflow.grad(fflow.grad(ck(ck(jnp.sin))))(1.0)
    np.testing.assert_allclose(second, -np.sin(1.0), rtol=1e-6)


def test_tree_map_with_prefix_trees_and_keys():
    from fflow import tree_util as tu

    # JAX 0.10.2: the first tree is a prefix of the second
    assert tu.tree_map(lambda a, b: a + b[0], [1, 2], [(10, 20), (30,)]) == [11, 32]
    with pytest.raises(ValueError, match="prefix"):
        tu.tree_map(lambda a, b: a, [1, 2], [1])

    class Pair:
        def __init__(self, a, b):
            self.a, self.b = a, b

    tu.register_pytree_with_keys(
        Pair,
        lambda p: ([(tu.GetAttrKey("a"), p.a), (tu.GetAttrKey("b"), p.b)], None),
        lambda aux, children: Pair(*children),
    )
    paths = [tu.keystr(p) for p, _ in tu.tree_flatten_with_path(Pair(1, [2, 3]))[0]]
    assert paths == [".a", ".b[0]", ".b[1]"]
    assert tu.tree_leaves(fflow.jit(lambda p: Pair(p.a * 2, p.b))(Pair(1.0, 2.0))) == [2.0, 2.0]


def test_debug_breakpoint_runs_under_jit(monkeypatch):
    import sys

    hits = []
    monkeypatch.setattr(sys, "breakpointhook", lambda: hits.append(1))
    fflow.jit(lambda x: (fflow.debug.breakpoint(), x * 2)[1])(jnp.ones(2))
    assert hits == [1]


def test_stages_and_config_names():
    from fflow import stages

    lowered = fflow.jit(lambda x: x * 2).lower(jnp.ones(2))
    assert isinstance(lowered, stages.Lowered) and isinstance(lowered.compile(), stages.Compiled)
    fflow.config.update("jax_debug_nans", False)
    fflow.config.update("jax_default_matmul_precision", "float32")
    assert fflow.config.read("jax_default_matmul_precision") == "float32"
    fflow.config.update("jax_default_matmul_precision", None)
    fflow.config.config_with_absl()
    fflow.config.parse_flags_with_absl()
    with pytest.raises(AttributeError):
        fflow.config.update("jax_not_an_option", 1)


def test_fill_mode_static_index_and_tracer_is_an_array():
    a = jnp.arange(12.0)
    # JAX 0.10.2: an out-of-range static index reads the fill value; in range reads a[i]
    assert float(a.at[20].get(mode="fill", fill_value=-1.0)) == -1.0
    assert float(a.at[-3].get(mode="fill", fill_value=-1.0)) == 9.0
    seen = []
    fflow.grad(lambda x: seen.append(isinstance(x, fflow.Array)) or x * 2)(1.0)
    assert seen == [True] and isinstance(a, fflow.Array) and not isinstance(1.0, fflow.Array)


def test_shape_dtype_struct_like():
    # JAX's ShapeDtypeStruct.like: an array's (canonical) shape, dtype and weak type
    s = fflow.ShapeDtypeStruct.like(fflow.numpy.ones((2, 3)))
    assert (s.shape, s.dtype, s.weak_type) == ((2, 3), np.float32, False)
    assert fflow.ShapeDtypeStruct.like(2.0).weak_type
    assert fflow.ShapeDtypeStruct.like(np.ones(2, np.int64)).dtype == np.int32  # x64 off
    assert fflow.ShapeDtypeStruct.like(s) == s
    assert fflow.jit(lambda x: x * fflow.ShapeDtypeStruct.like(x).shape[0])(
        np.ones(2)
    ).tolist() == [2.0, 2.0]


def test_like_functions_take_shape_dtype_structs():
    # JAX's zeros_like / ones_like / full_like take duck-typed shape-and-dtype objects
    # (optax.MultiSteps builds zero updates from jax.eval_shape's ShapeDtypeStructs)
    s = fflow.ShapeDtypeStruct((2, 3), np.float16)
    assert jnp.zeros_like(s).shape == (2, 3) and jnp.zeros_like(s).dtype == np.float16
    assert jnp.ones_like(s, dtype=np.int32).tolist() == [[1, 1, 1]] * 2
    assert float(jnp.full_like(s, 2.5)[1, 2]) == 2.5
    shapes = fflow.eval_shape(lambda x: {"a": x * 2, "b": x.sum()}, np.ones(4, np.float32))
    zeros = fflow.tree_util.tree_map(jnp.zeros_like, shapes)
    assert zeros["a"].tolist() == [0.0] * 4 and zeros["b"].shape == ()


def test_register_dataclass_key_paths_name_fields():
    # recorded from JAX 0.10.2: keystr of a register_dataclass field is "['a'].x"
    import dataclasses
    import functools

    @functools.partial(fflow.tree_util.register_dataclass, data_fields=["x"], meta_fields=["n"])
    @dataclasses.dataclass
    class Box:
        x: object
        n: str

    flat, _ = fflow.tree_util.tree_flatten_with_path({"a": Box(jnp.ones(2), "one")})
    assert [fflow.tree_util.keystr(p) for p, _ in flat] == ["['a'].x"]
    assert fflow.tree_util.tree_map(lambda v: v * 2, Box(jnp.ones(2), "k")).n == "k"
