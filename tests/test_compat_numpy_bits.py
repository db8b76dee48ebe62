"""jnp.packbits / unpackbits / bitwise_count, convolve's dtype and Primitive.get_bind_params
against NumPy and values recorded from JAX 0.10.2 (programs of tests/jax_corpus use them)."""

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("bitorder", ["big", "little"])
def test_packbits_unpackbits_match_numpy(axis, bitorder):
    rng = np.random.default_rng(0)
    bits = rng.integers(-2, 3, (3, 11)).astype(np.int32)  # nonzero (negative too) packs as 1
    want = np.packbits(bits != 0, axis=axis, bitorder=bitorder)
    got = jnp.packbits(bits, axis=axis, bitorder=bitorder)
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(
        fflow.jit(jnp.packbits, static_argnums=(1, 2))(bits, axis, bitorder), want
    )
    u = rng.integers(0, 256, (3, 4)).astype(np.uint8)
    for count in (None, 5, 9, -3, 40):
        want = np.unpackbits(u, axis=axis, count=count, bitorder=bitorder)
        got = jnp.unpackbits(u, axis=axis, count=count, bitorder=bitorder)
        assert got.dtype == np.uint8
        np.testing.assert_array_equal(got, want)


def test_unpackbits_rejects_non_uint8_and_bitwise_count_counts_abs():
    with pytest.raises(TypeError):
        jnp.unpackbits(jnp.array([1, 2]))
    x = np.array([-1, -16, 5, -128, 127], np.int8)
    np.testing.assert_array_equal(jnp.bitwise_count(x), np.bitwise_count(x))  # |x|'s bits
    assert jnp.bitwise_count(x).dtype == np.uint8


def test_convolve_of_integers_is_float_as_jax():
    # recorded from JAX: integer and bool inputs convolve / correlate in float32
    out = jnp.convolve(jnp.array([1, 2, 1]), jnp.array([1, 1, 1]))
    assert out.dtype == np.float32 and out.tolist() == [1.0, 3.0, 4.0, 3.0, 1.0]
    out = jnp.correlate(jnp.array([1, 2, 1], jnp.int8), jnp.array([1, 1, 1], jnp.int8), "full")
    assert out.dtype == np.float32 and out.tolist() == [1.0, 3.0, 4.0, 3.0, 1.0]
    out = jnp.convolve(jnp.array([True, False]), jnp.array([True, True]))
    assert out.dtype == np.float32 and out.tolist() == [1.0, 1.0, 0.0]
    np.testing.assert_allclose(
        jnp.convolve(jnp.array([1.0, 2, 1]), jnp.array([0.5, 1, -1]), "same"),
        np.convolve([1.0, 2, 1], [0.5, 1, -1], "same"),
    )


def test_custom_interpreter_rebinds_equations_with_get_bind_params():
    """JAX's custom-interpreter tutorial: re-evaluating a jaxpr's equations through
    `prim.bind(*invals, **prim.get_bind_params(eqn.params))` gives the function's values."""

    def f(x):
        return jnp.exp(jnp.tanh(x)) * fflow.lax.cumsum(x, axis=0) + 2.0

    closed = fflow.make_jaxpr(f)(jnp.ones(4))
    env = {}
    read = lambda v: v.val if type(v) is fflow.extend.core.Literal else env[v]  # noqa: E731
    x = jnp.linspace(-1.0, 1.0, 4)
    env.update(zip(closed.jaxpr.invars, [x]))
    env.update(zip(closed.jaxpr.constvars, closed.consts))
    for eqn in closed.jaxpr.eqns:
        outs = eqn.primitive.bind(
            *map(read, eqn.invars), **eqn.primitive.get_bind_params(eqn.params)
        )
        env.update(zip(eqn.outvars, outs if eqn.primitive.multiple_results else [outs]))
    np.testing.assert_allclose(read(closed.jaxpr.outvars[0]), f(x), rtol=1e-6)


def test_promote_types_takes_dtype_names_as_jax():
    # recorded from JAX 0.10.2: JAX's lattice (int64 with float32 is float32), bf16 by name
    assert jnp.promote_types("bfloat16", "float16") == np.float32
    assert jnp.promote_types("int64", "float32") == np.float32
    assert jnp.promote_types(int, "int8") == np.int8
    assert jnp.promote_types("uint8", "int8") == np.int16


def test_lists_are_rejected_as_jax_and_block_matches_numpy():
    # JAX: jnp functions take arrays or scalars (a list raises TypeError); sequences of
    # arrays (concatenate, stack, block) and shapes stay lists
    for f in (lambda: jnp.sum([1, 2, 3]), lambda: jnp.dot(jnp.ones(3), [1.0, 2.0, 3.0]),
              lambda: jnp.where(jnp.ones(3) > 0, [1.0, 2.0, 3.0], 0.0),
              lambda: jnp.zeros_like([1, 2])):  # fmt: skip
        with pytest.raises(TypeError, match="asarray"):
            f()
    a, b, c = np.arange(4.0).reshape(2, 2), np.ones((2, 1)), np.zeros((1, 3))
    for arrays in ([[a, b], [c]], [a, a], [[1.0, 2.0], [3.0, 4.0]], [[[a]]]):
        np.testing.assert_array_equal(jnp.block(arrays), np.block(arrays))
    assert jnp.concatenate([a, a]).shape == (4, 2) and jnp.reshape(a, [4]).shape == (4,)
