"""Reproducers for silent wrong answers (issue 16): each checked against JAX's
documented semantics written out in NumPy (and against JAX itself where installed)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fflow
import fflow.numpy as jnp
from fflow import lax
from fflow.errors import DtypeError, ShapeError

# -- 1. dynamic_slice family: a negative start counts from the end, then clamps -------


def _np_start(i, d, n):
    """JAX: `i + d` for a negative start, then clamped so the window fits."""
    i = i + d if i < 0 else i
    return min(max(i, 0), d - n)


def _np_dynamic_slice(x, starts, sizes):
    s = [_np_start(i, d, n) for i, d, n in zip(starts, x.shape, sizes)]
    return x[tuple(slice(a, a + n) for a, n in zip(s, sizes))]


def _np_dynamic_update_slice(x, u, starts):
    s = [_np_start(i, d, n) for i, d, n in zip(starts, x.shape, u.shape)]
    out = x.copy()
    out[tuple(slice(a, a + n) for a, n in zip(s, u.shape))] = u
    return out


def test_dynamic_slice_negative_start_issue_example():
    out = lax.dynamic_slice(jnp.arange(5.0), (-1,), (1,))
    np.testing.assert_array_equal(np.asarray(out), [4.0])


_WRAPS = {
    "eager": lambda f: f,
    "jit": fflow.jit,
}


@pytest.mark.parametrize("wrap", ["eager", "jit"])
@settings(max_examples=30, deadline=None)
@given(start=st.integers(-9, 9), size=st.integers(0, 5))
def test_dynamic_slice_and_update_match_jax_semantics(wrap, start, size):
    x = np.arange(5.0, dtype=np.float32)
    u = np.full((size,), 7.0, np.float32)
    ds = _WRAPS[wrap](lambda x, i: lax.dynamic_slice(x, (i,), (size,)))
    dus = _WRAPS[wrap](lambda x, u, i: lax.dynamic_update_slice(x, u, (i,)))
    np.testing.assert_array_equal(
        np.asarray(ds(x, np.int32(start))), _np_dynamic_slice(x, (start,), (size,))
    )
    np.testing.assert_array_equal(
        np.asarray(dus(x, u, np.int32(start))), _np_dynamic_update_slice(x, u, (start,))
    )


def test_dynamic_slice_in_dim_and_index_in_dim_wrap():
    x = np.arange(12.0, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(np.asarray(lax.dynamic_slice_in_dim(x, -2, 2, axis=1)), x[:, 2:4])
    np.testing.assert_array_equal(
        np.asarray(lax.dynamic_index_in_dim(x, -1, axis=0, keepdims=False)), x[2]
    )
    upd = lax.dynamic_update_slice_in_dim(x, np.zeros((3, 1), np.float32), -1, axis=1)
    expect = x.copy()
    expect[:, 3] = 0
    np.testing.assert_array_equal(np.asarray(upd), expect)


def test_dynamic_slice_negative_start_under_vmap_grad_jvp():
    x = np.arange(5.0, dtype=np.float32)
    starts = np.array([-1, -3, -7, 2, 4], np.int32)
    out = fflow.vmap(lambda i: lax.dynamic_slice(x, (i,), (2,)))(starts)
    expect = np.stack([_np_dynamic_slice(x, (int(i),), (2,)) for i in starts])
    np.testing.assert_array_equal(np.asarray(out), expect)
    # the gradient of a window sum is the window's indicator, at the wrapped start
    for i in (-2, -7, 3):
        g = fflow.grad(lambda v, i=i: jnp.sum(lax.dynamic_slice(v, (i,), (2,)) ** 2))(x)
        s = _np_start(i, 5, 2)
        expect = np.zeros(5, np.float32)
        expect[s : s + 2] = 2 * x[s : s + 2]
        np.testing.assert_allclose(np.asarray(g), expect)
        gj = fflow.jit(fflow.grad(lambda v, i: jnp.sum(lax.dynamic_slice(v, (i,), (2,)) ** 2)))
        np.testing.assert_allclose(np.asarray(gj(x, np.int32(i))), expect)
    _, t = fflow.jvp(lambda v: lax.dynamic_slice(v, (-2,), (2,)), (x,), (np.ones(5, np.float32),))
    np.testing.assert_array_equal(np.asarray(t), [1.0, 1.0])


def test_traced_negative_index_counts_from_the_end():
    x = np.arange(5.0, dtype=np.float32)
    assert float(fflow.jit(lambda x, i: x[i])(x, -2)) == 3.0


def test_dynamic_slice_matches_jax_where_installed():
    jax = pytest.importorskip("jax")
    x = np.arange(5.0, dtype=np.float32)
    for i in range(-8, 8):
        ours = lax.dynamic_slice(x, (i,), (2,))
        theirs = jax.lax.dynamic_slice(x, (i,), (2,))
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))


# -- 2. no aliasing of the caller's NumPy buffers -----------------------------------

_MAKERS = {
    "asarray": jnp.asarray,
    "array": jnp.array,
    "jit identity": fflow.jit(lambda x: x),
    "jit reshape": fflow.jit(lambda x: x.reshape(3, 2)),
    "jit slice": fflow.jit(lambda x: x[0]),
    "jit transpose": fflow.jit(lambda x: x.T),
    "jit astype same": fflow.jit(lambda x: x.astype(np.float32)),
    "jit broadcast_to": fflow.jit(lambda x: jnp.broadcast_to(x, (2, 2, 3))),
    "eager reshape": lambda x: jnp.reshape(x, (3, 2)),
    "eager transpose": jnp.transpose,
    "eager squeeze no-op": jnp.squeeze,
    "eager ravel": jnp.ravel,
    "lax reshape": lambda x: lax.reshape(x, (6,)),
    "lax transpose": lambda x: lax.transpose(x, (1, 0)),
    "vmap identity": fflow.vmap(lambda x: x),
    "grad aux": lambda x: fflow.grad(lambda v: (jnp.sum(v), v), has_aux=True)(x)[1],
}


@pytest.mark.parametrize("name", sorted(_MAKERS))
def test_arrays_do_not_alias_callers_numpy_buffer(name):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    y = _MAKERS[name](x)
    before = np.array(y)
    x[...] = -1.0  # a data loader refilling its batch buffer
    np.testing.assert_array_equal(np.asarray(y), before)


# -- 3. closed-over NumPy arrays are captured when traced ---------------------------


def test_closed_over_numpy_array_captured_at_trace_time():
    c = np.ones(3, np.float32)
    f = fflow.jit(lambda v: v + c)
    g = fflow.jit(lambda v: v + 2 * c)
    v = jnp.zeros(3)
    np.testing.assert_array_equal(np.asarray(f(v)), [1, 1, 1])
    np.testing.assert_array_equal(np.asarray(g(v)), [2, 2, 2])
    c[:] = 10.0  # JAX: the traced functions keep the values they were traced with
    np.testing.assert_array_equal(np.asarray(f(v)), [1, 1, 1])
    np.testing.assert_array_equal(np.asarray(g(v)), [2, 2, 2])


def test_closed_over_0d_numpy_array_captured_at_trace_time():
    c = np.array(2.0, np.float32)
    f = fflow.jit(lambda v: v * c)
    assert float(f(jnp.ones(()))) == 2.0
    c[...] = 5.0
    assert float(f(jnp.ones(()))) == 2.0


# -- 4. eager lax runs the shape rule that tracing runs: eager and jit agree ----------

_BAD_LAX = {
    "add f32 i32": (lambda a, b: lax.add(a, b), DtypeError),
    "dynamic_slice too big": (lambda a, b: lax.dynamic_slice(a, (0,), (7,)), ShapeError),
    "select mismatched": (lambda a, b: lax.select(a > 0, a, b[:1]), ShapeError),
    "concatenate f32 i32": (lambda a, b: lax.concatenate([a, b], 0), TypeError),
    "mul shapes": (lambda a, b: lax.mul(a, b[:2]), ShapeError),
}


@pytest.mark.parametrize("name", sorted(_BAD_LAX))
@pytest.mark.parametrize("wrap", ["eager", "jit"])
def test_eager_lax_raises_like_jit(name, wrap):
    fn, err = _BAD_LAX[name]
    a = np.ones(5, np.float32)
    b = np.ones(5, np.int32) if "i32" in name else np.ones(5, np.float32)
    with pytest.raises(err):
        _WRAPS[wrap](fn)(a, b)


def test_eager_and_jit_agree_on_dtypes_and_weak_types():
    cases = [
        lambda: lax.add(jnp.ones(3, jnp.float32), 2.0),
        lambda: lax.mul(2, 3),
        lambda: lax.convert_element_type(jnp.arange(3), jnp.float32),
        lambda: lax.concatenate([jnp.ones(2), jnp.zeros(1)], 0),
    ]
    for case in cases:
        eager = case()
        staged = fflow.jit(case)()
        assert eager.dtype == staged.dtype
        assert eager.weak_type == staged.weak_type
        np.testing.assert_array_equal(np.asarray(eager), np.asarray(staged))


# -- 5. weak types, fflow Arrays for Python scalars, float0 tangents ----------------


def _weak(x):
    return lax.mul(x, 1.0) if isinstance(x, float) else lax.mul(x, 1)


@pytest.mark.parametrize("wrap", ["eager", "jit"])
def test_weak_types_of_mod_floordiv_and_concatenate(wrap):
    # JAX: weak (Python-scalar-born) operands with a weak promotion give a weak result
    def f(w, i):
        return (
            w % 3,
            w // 3,
            i % 2,
            i // 2,
            jnp.fmod(w, 2),
            jnp.concatenate([i[None], w[None]]),
            jnp.ones(3) % 2,  # a strong operand: strong
        )

    outs = _WRAPS[wrap](f)(_weak(7.0), _weak(7))
    assert [o.weak_type for o in outs] == [True] * 6 + [False]
    assert outs[5].dtype == np.float32
    np.testing.assert_array_equal(np.asarray(outs[0]), np.float32(7.0) % 3)
    np.testing.assert_array_equal(np.asarray(outs[3]), 7 // 2)


_SCALAR_FNS = ["sum", "max", "min", "prod", "transpose", "squeeze", "floor", "round", "real",
               "isnan", "isfinite", "nansum", "clip", "conj", "positive", "amax"]  # fmt: skip


@pytest.mark.parametrize("name", _SCALAR_FNS)
def test_numpy_functions_return_arrays_for_python_scalars(name):
    out = getattr(jnp, name)(3)
    assert isinstance(out, fflow.Array), type(out)
    np.testing.assert_array_equal(np.asarray(out), getattr(np, name)(3))


def test_zero_d_creation_returns_arrays():
    for out in (jnp.ones(()), jnp.zeros(()), jnp.full((), 2.0), jnp.zeros_like(1.0)):
        assert isinstance(out, fflow.Array)


def test_jvp_tangent_of_integer_and_bool_outputs_is_float0():
    x = np.arange(3.0, dtype=np.float32)
    (y, i, b), (ty, ti, tb) = fflow.jvp(
        lambda v: (v * 2, jnp.argmax(v), v > 1), (x,), (np.ones(3, np.float32),)
    )
    np.testing.assert_array_equal(np.asarray(ty), 2 * np.ones(3))
    assert ti.dtype == fflow.dtypes.float0 and ti.shape == ()
    assert tb.dtype == fflow.dtypes.float0 and tb.shape == (3,)
    # JAX accepts float0 tangents for integer primals
    y, t = fflow.jvp(lambda k: k * 2, (np.int32(3),), (np.zeros((), fflow.dtypes.float0),))
    assert int(y) == 6 and t.dtype == fflow.dtypes.float0


# -- 6. silently accepted misuse now raises ------------------------------------------


def test_misuse_that_used_to_be_accepted_raises():
    with pytest.raises(TypeError, match="non-integer"):
        jnp.zeros((2.5, 3))
    with pytest.raises(ValueError, match="static_argnums=3"):
        fflow.jit(lambda a: a, static_argnums=3)
    for make in (lambda: fflow.jit(lambda a: a, static_argnum=0),
                 lambda: fflow.vmap(lambda a: a, in_axis=0),
                 lambda: fflow.grad(lambda a: a, argnum=0)):  # fmt: skip
        with pytest.raises(TypeError, match="unexpected keyword"):
            make()
    with pytest.raises(TypeError, match="not an array"):
        fflow.jit(lambda a: a)(object())
    with pytest.raises(TypeError, match="not an array"):
        fflow.jit(lambda a: "abc")(np.ones(2))
    with pytest.raises(ValueError, match="jit_backend"):
        fflow.config.update("jit_backend", "cdua")
    assert fflow.config.jit_backend == "numpy"


def test_in_sbp_arity_mismatch_raises():
    from fflow.sharding import S

    pl = fflow.placement("cpu", [0, 1])
    f = fflow.shard(lambda a, b: a + b, pl, in_sbp=(S(0),))
    with pytest.raises(ValueError, match="1 entry for 2 arguments"):
        f(np.ones(4, np.float32), np.ones(4, np.float32))
    g = fflow.shard(lambda a, b: a + b, pl, in_sbp=(S(0), S(0)))
    np.testing.assert_array_equal(np.asarray(g(np.ones(4, np.float32), np.ones(4, np.float32))), 2)


# -- errors where JAX works: tracer methods -------------------------------------------


def test_tracer_var_copy_nbytes_and_array_view():
    x = np.arange(4.0, dtype=np.float32)
    v, c, n = fflow.jit(lambda a: (a.var(), a.copy(), a.nbytes))(x)
    np.testing.assert_allclose(float(v), np.var(x), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(c), x)
    assert int(n) == x.nbytes
    np.testing.assert_array_equal(np.asarray(jnp.asarray(x).view(np.int32)), x.view(np.int32))


def test_pickling_a_tracer_raises():
    import pickle

    with pytest.raises(TypeError, match="cannot pickle a traced value"):
        fflow.jit(lambda a: pickle.dumps(a))(np.ones(2, np.float32))


def test_grad_through_while_loop_whose_carry_does_not_reach_the_output():
    def f(x):
        steps, prod = lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * x), (0, x))
        return x**2, prod  # the loop's carry depends on x but feeds only the aux output

    g, aux = fflow.grad(f, has_aux=True)(2.0)
    assert float(g) == 4.0 and float(aux) == 16.0  # d(x^2)/dx, x^4
    g, aux = fflow.jit(fflow.grad(f, has_aux=True))(2.0)
    assert float(g) == 4.0 and float(aux) == 16.0
    with pytest.raises(fflow.errors.FflowError, match="max_steps"):
        fflow.grad(lambda x: f(x)[1])(2.0)  # a cotangent reaches the loop: JAX fails too


@pytest.mark.parametrize("wrap", ["eager", "jit"])
def test_inv_of_singular_matrix_is_not_finite_instead_of_raising(wrap):
    out = np.asarray(_WRAPS[wrap](jnp.linalg.inv)(np.ones((2, 2), np.float32)))
    assert out.shape == (2, 2) and not np.isfinite(out).all()
    a = np.array([[2.0, 1.0], [1.0, 3.0]], np.float32)
    np.testing.assert_allclose(
        np.asarray(_WRAPS[wrap](jnp.linalg.inv)(a)), np.linalg.inv(a), rtol=1e-5
    )


@pytest.mark.parametrize("wrap", ["eager", "jit"])
def test_weak_python_int_out_of_range_wraps_like_jax(wrap):
    x = jnp.asarray(np.array([1, 2, 250], np.uint8))
    add, mul = _WRAPS[wrap](lambda v: v + -1), _WRAPS[wrap](lambda v: v * 300)
    # JAX converts the weak int to uint8 with wrap-around: -1 -> 255, 300 -> 44
    xn = np.asarray(x)
    np.testing.assert_array_equal(np.asarray(add(x)), (xn + np.uint8(255)).astype(np.uint8))
    np.testing.assert_array_equal(np.asarray(mul(x)), (xn * np.uint8(44)).astype(np.uint8))
    assert add(x).dtype == np.uint8
