"""jit basics: results equal the untransformed function, and Python runs once per
(pytree structure, shape/dtype of every leaf, static args): `Jitted.trace_count`."""

import functools

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp
from fflow.experimental import enable_x64


def _counted(fn):
    calls = [0]

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        calls[0] += 1
        return fn(*args, **kwargs)

    wrapper.calls = calls
    return wrapper


def test_second_call_with_same_shapes_does_not_rerun_python():
    f = _counted(lambda x, y: jnp.sin(x) * y + 1.0)
    jf = fflow.jit(f)
    x, y = np.linspace(0, 1, 5).astype(np.float32), np.float32(3.0)
    np.testing.assert_allclose(np.asarray(jf(x, y)), np.sin(x) * 3.0 + 1.0, rtol=1e-6)
    assert jf.trace_count == 1 and f.calls[0] == 1
    x2 = np.linspace(1, 2, 5).astype(np.float32)  # new values, same shape: cache hit
    np.testing.assert_allclose(np.asarray(jf(x2, y)), np.sin(x2) * 3.0 + 1.0, rtol=1e-6)
    assert jf.trace_count == 1 and f.calls[0] == 1


@pytest.mark.parametrize(
    "change",
    [
        lambda x: x[:3],  # shape
        lambda x: x.astype(np.float16),  # dtype
        lambda x: x.reshape(1, 5),  # rank
    ],
    ids=["shape", "dtype", "rank"],
)
def test_retrace_on_new_signature(change):
    f = _counted(lambda x: x * 2.0)
    jf = fflow.jit(f)
    x = np.ones(5, np.float32)
    jf(x)
    out = jf(change(x))
    assert jf.trace_count == 2 and f.calls[0] == 2
    assert out.dtype == change(x).dtype and out.shape == change(x).shape
    jf(change(x))
    jf(x)
    assert jf.trace_count == 2  # both signatures stay cached


def test_retrace_on_pytree_structure_and_static_value():
    f = _counted(lambda d, n: d["a"] * n)
    jf = fflow.jit(f, static_argnums=1)
    a = np.ones(2, np.float32)
    jf({"a": a}, 2)
    jf({"a": a}, 2)
    assert jf.trace_count == 1
    jf({"a": a}, 3)  # new static value
    assert jf.trace_count == 2
    jf({"a": a, "b": a}, 3)  # new structure
    assert jf.trace_count == 3
    np.testing.assert_array_equal(np.asarray(jf({"a": a}, 3)), 3 * a)
    assert jf.trace_count == 3


def test_static_argnames_and_kwargs():
    f = _counted(lambda x, mode="sin": jnp.sin(x) if mode == "sin" else jnp.cos(x))
    jf = fflow.jit(f, static_argnames="mode")
    x = np.float32(0.5)
    assert float(jf(x, mode="cos")) == pytest.approx(np.cos(0.5), rel=1e-6)
    assert float(jf(x, mode="sin")) == pytest.approx(np.sin(0.5), rel=1e-6)
    assert float(jf(x, mode="sin")) == pytest.approx(np.sin(0.5), rel=1e-6)
    assert jf.trace_count == 2


def test_dtypes_are_honoured_and_weak_scalars_do_not_promote():
    jf = fflow.jit(lambda x: x * 2 + 1.5)
    assert jf(np.ones(3, np.float64)).dtype == np.float32  # JAX with x64 off
    with enable_x64():
        assert jf(np.ones(3, np.float64)).dtype == np.float64
    assert jf(np.ones(3, np.float16)).dtype == np.float16
    assert jf(np.ones(3, np.float32)).dtype == np.float32
    assert jf(np.ones(3, np.int32) * 2).dtype == np.float32  # int * weak float -> default float


def test_closed_over_arrays_are_constants_of_the_trace():
    w = jnp.asarray(np.arange(3.0))
    jf = fflow.jit(lambda x: x @ w)
    assert float(jf(np.ones(3))) == 3.0
    program = fflow.make_jaxpr(lambda x: x @ w)(np.ones(3))
    assert len(program.constvars) == 1 and len(program.invars) == 1


def test_outputs_pytrees_constants_and_passthrough():
    jf = fflow.jit(lambda x: {"same": x, "two": 2.0, "pair": (x + 1, None)})
    out = jf(np.ones(2, np.float32))
    np.testing.assert_array_equal(np.asarray(out["same"]), np.ones(2))
    assert float(out["two"]) == 2.0 and out["pair"][1] is None
    np.testing.assert_array_equal(np.asarray(out["pair"][0]), np.full(2, 2.0))


def test_nested_jit_traces_inner_once_per_outer_trace():
    inner_fn = _counted(lambda x: jnp.exp(x))
    inner = fflow.jit(inner_fn)
    outer = fflow.jit(lambda x: inner(x) + inner(x * 2))
    x = np.zeros(3, np.float32)
    np.testing.assert_allclose(np.asarray(outer(x)), np.full(3, 2.0))
    outer(x)
    assert outer.trace_count == 1
    assert inner.trace_count == 1  # one signature, traced once and reused
    assert inner_fn.calls[0] == 1


def test_jit_of_method_and_no_arguments():
    class Model:
        def __init__(self, scale):
            self.scale = scale

        @functools.partial(fflow.jit, static_argnums=0)
        def apply(self, x):
            return x * self.scale

        def __hash__(self):
            return hash(self.scale)

        def __eq__(self, other):
            return isinstance(other, Model) and other.scale == self.scale

    assert float(Model(3.0).apply(np.float32(2.0))) == 6.0
    assert float(fflow.jit(lambda: jnp.ones(2).sum())()) == 2.0


def test_make_jaxpr_with_static_argnums():
    program = fflow.make_jaxpr(lambda x, n: x * n, static_argnums=1)(np.float32(1.0), 3)
    assert str(program) == "{ lambda ; a:f32[]. let b:f32[] = mul a 3.0:f32[] in (b,) }"


@pytest.mark.usefixtures("x64_case")  # float64 reference at 1e-12
def test_jit_under_transformations_does_not_retrace_needlessly():
    f = _counted(lambda x: jnp.sum(jnp.sin(x) ** 2))
    jf = fflow.jit(f)
    x = np.linspace(0, 1, 4)
    g = fflow.grad(jf)(x)
    np.testing.assert_allclose(np.asarray(g), 2 * np.sin(x) * np.cos(x), rtol=1e-12)
    jf(x)  # the eager call reuses the program traced under grad
    fflow.grad(jf)(x)
    assert f.calls[0] == 1
