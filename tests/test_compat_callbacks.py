"""fflow.pure_callback / fflow.experimental.io_callback (JAX's callbacks) against the
untransformed NumPy callback: eager, jit, vmap (each vmap_method), pytrees, ordering
and the errors JAX gives (wrong result type, differentiation)."""

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp
from fflow.experimental import io_callback


def _sinc(x):
    return fflow.pure_callback(np.sinc, fflow.ShapeDtypeStruct(x.shape, x.dtype), x)


def test_pure_callback_eager_jit_and_vmap_equal_numpy():
    x = np.linspace(-1.0, 1.0, 6).astype(np.float32)
    want = np.sinc(x)
    np.testing.assert_allclose(_sinc(x), want, rtol=1e-6)
    np.testing.assert_allclose(fflow.jit(_sinc)(x), want, rtol=1e-6)
    np.testing.assert_allclose(fflow.vmap(_sinc)(x.reshape(3, 2)), want.reshape(3, 2), rtol=1e-6)
    np.testing.assert_allclose(fflow.jit(fflow.vmap(_sinc, 1))(x.reshape(3, 2)), np.sinc(x.reshape(3, 2).T), rtol=1e-6)  # fmt: skip


@pytest.mark.parametrize("method", ["sequential", "expand_dims", "broadcast_all"])
def test_vmap_methods_call_as_jax_documents(method):
    shapes = []

    def cb(a, b):
        shapes.append((a.shape, b.shape))
        return (a * b).astype(np.float32)

    def f(a, b):
        return fflow.pure_callback(
            cb, fflow.ShapeDtypeStruct(a.shape, a.dtype), a, b, vmap_method=method
        )

    a, b = np.arange(6.0, dtype=np.float32).reshape(3, 2), np.float32([10.0, 20.0])
    out = fflow.vmap(f, in_axes=(0, None))(a, b)
    np.testing.assert_allclose(out, a * b)
    want = {"sequential": [((2,), (2,))] * 3, "expand_dims": [((3, 2), (1, 2))],
            "broadcast_all": [((3, 2), (3, 2))]}[method]  # fmt: skip
    assert shapes == want


def test_pytree_results_and_kwargs():
    def cb(x, *, scale):
        return {"s": np.sum(x) * scale, "m": np.max(x, keepdims=True)}

    spec = {
        "s": fflow.ShapeDtypeStruct((), np.float32),
        "m": fflow.ShapeDtypeStruct((1,), np.float32),
    }
    x = np.float32([1.0, 5.0, 2.0])
    out = fflow.jit(lambda x: fflow.pure_callback(cb, spec, x, scale=np.float32(2)))(x)
    assert float(out["s"]) == 16.0 and out["m"].tolist() == [5.0]


def test_io_callback_runs_in_order_even_unused():
    log = []

    def record(tag, v):
        log.append((int(tag), float(v)))
        return np.int32(len(log))

    @fflow.jit
    def f(x):
        io_callback(record, fflow.ShapeDtypeStruct((), np.int32), 1, x.sum())  # result unused
        n = io_callback(record, fflow.ShapeDtypeStruct((), np.int32), 2, x.max())
        return x * 2, n

    y, n = f(jnp.array([1.0, 3.0]))
    assert log == [(1, 4.0), (2, 3.0)] and int(n) == 2 and y.tolist() == [2.0, 6.0]
    f(jnp.array([1.0, 3.0]))
    assert [t for t, _ in log] == [1, 2, 1, 2]  # the compiled program calls again


def test_wrong_result_and_grad_raise_with_the_fix():
    bad = lambda x: fflow.pure_callback(
        lambda a: a.astype(np.float64), fflow.ShapeDtypeStruct((2,), np.float32), x
    )  # noqa: E731
    with pytest.raises(TypeError, match="float64.*result_shape_dtypes"):
        bad(np.ones(2, np.float32))
    with pytest.raises(ValueError, match="custom_jvp"):
        fflow.grad(lambda x: _sinc(x).sum())(np.ones(2, np.float32))
