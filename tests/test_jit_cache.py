"""jit's cache: trace counting, retrace warnings, static args, donation."""

import warnings

import numpy as np
import pytest
from fflow.transforms.jit import RetraceWarning

import fflow
import fflow.numpy as jnp


def test_cache_hit_runs_neither_python_nor_codegen(monkeypatch):
    from fflow.lowering import numpy_backend

    calls = {"python": 0, "codegen": 0}
    original = numpy_backend.compile_program

    def counting(*a, **k):
        calls["codegen"] += 1
        return original(*a, **k)

    monkeypatch.setattr(numpy_backend, "compile_program", counting)

    @fflow.jit
    def f(x, y):
        calls["python"] += 1
        return x * 2 + y

    x = jnp.ones(4)
    for _ in range(5):
        out = f(x, x)
    np.testing.assert_array_equal(out, np.full(4, 3.0, np.float32))
    assert calls == {"python": 1, "codegen": 1}
    assert f.trace_count == 1 and f.compile_count == 1
    f(jnp.ones(5), jnp.ones(5))  # new shape: retrace
    f(x, 1.0)  # a Python scalar is a different (weak) signature
    assert f.trace_count == 3


def test_pytree_and_kwargs_arguments():
    @fflow.jit
    def f(params, x, *, scale):
        return {"y": params["w"] * x * scale, "n": params["b"]}

    params = {"w": jnp.ones(3), "b": jnp.zeros(2)}
    out = f(params, jnp.arange(3.0), scale=2.0)
    np.testing.assert_array_equal(out["y"], [0.0, 2.0, 4.0])
    out = f(params, jnp.arange(3.0), scale=2.0)
    assert f.trace_count == 1


def test_static_argnums_and_unhashable_error():
    f = fflow.jit(lambda x, n: x * n, static_argnums=1)
    assert f(jnp.ones(2), 3).tolist() == [3.0, 3.0]
    assert f(jnp.ones(2), 4).tolist() == [4.0, 4.0]
    assert f.trace_count == 2
    with pytest.raises(TypeError, match="unhashable"):
        f(jnp.ones(2), [1, 2])


def test_retrace_warning_names_the_argument():
    def step(params, batch):
        return params * jnp.sum(batch)

    f = fflow.jit(step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(1, 10):
            f(jnp.ones(2), jnp.ones(n))
    msgs = [str(w.message) for w in caught if issubclass(w.category, RetraceWarning)]
    assert msgs, "no retrace warning"
    assert "'batch'" in msgs[0] and "argument 1" in msgs[0]
    assert "float32[7]" in msgs[0] and "float32[8]" in msgs[0]


def test_donated_buffers_are_deleted_and_reused():
    f = fflow.jit(lambda w, g: w - g, donate_argnums=0)
    w = jnp.asarray(np.arange(4, dtype=np.float32))  # a fresh, writeable buffer
    ptr = np.asarray(w).__array_interface__["data"][0]  # holds no reference
    out = f(w, jnp.ones(4))
    np.testing.assert_array_equal(out, np.arange(4, dtype=np.float32) - 1)
    assert w.is_deleted()
    assert np.asarray(out).__array_interface__["data"][0] == ptr, "buffer not reused"
    with pytest.raises(RuntimeError, match="donated"):
        np.asarray(w)
    with pytest.raises(RuntimeError, match="donated"):
        f(w, jnp.ones(4))


def test_donated_scatter_updates_in_place():
    f = fflow.jit(lambda x, v: x.at[1].set(v).at[2].add(v), donate_argnums=0)
    x = jnp.asarray(np.arange(5, dtype=np.float32))
    ptr = np.asarray(x).__array_interface__["data"][0]
    out = f(x, jnp.float32(7.0))
    np.testing.assert_array_equal(out, [0.0, 7.0, 9.0, 3.0, 4.0])
    assert np.asarray(out).__array_interface__["data"][0] == ptr
    # without donation the input stays untouched, and the copy is made once
    g = fflow.jit(lambda x, v: x.at[1].set(v).at[2].add(v))
    x = jnp.asarray(np.arange(5, dtype=np.float32))
    out = g(x, jnp.float32(7.0))
    np.testing.assert_array_equal(x, np.arange(5))
    np.testing.assert_array_equal(out, [0.0, 7.0, 9.0, 3.0, 4.0])
    assert "scatter_into" in g.lower(x, jnp.float32(7.0)).as_text()


def test_donation_never_writes_shared_or_readonly_buffers():
    f = fflow.jit(lambda w: w * 2 + 1, donate_argnums=0)
    base = np.arange(4, dtype=np.float32)
    view_holder = jnp.asarray(base)  # Array over a buffer NumPy code still holds
    out = f(view_holder)
    np.testing.assert_array_equal(base, np.arange(4, dtype=np.float32))
    np.testing.assert_array_equal(out, np.arange(4) * 2 + 1)
    z = jnp.zeros(4)  # may be a read-only zero-stride view
    np.testing.assert_array_equal(f(z), np.ones(4))
    x = jnp.arange(4.0)
    y = x[1:]  # eager view sharing x's memory
    f2 = fflow.jit(lambda a: a * 3, donate_argnums=0)
    f2(x)
    np.testing.assert_array_equal(y, [1.0, 2.0, 3.0])


def test_jit_under_grad_and_vmap_uses_the_program():
    f = fflow.jit(lambda x: jnp.sin(x) * x)
    g = fflow.grad(lambda x: jnp.sum(f(x)))(jnp.arange(3.0))
    x = np.arange(3.0, dtype=np.float32)
    np.testing.assert_allclose(g, np.cos(x) * x + np.sin(x), rtol=1e-6)
    v = fflow.vmap(f)(jnp.ones((2, 3)))
    np.testing.assert_allclose(v, np.sin(1.0) * np.ones((2, 3)), rtol=1e-6)


def test_lower_shows_program_and_code_and_compiles():
    f = fflow.jit(lambda x: jnp.tanh(x) * 2)
    lowered = f.lower(jnp.ones(3))
    text = lowered.as_text()
    assert "tanh" in text and "def fflow_kernel" in text and "np.tanh" in text
    compiled = lowered.compile()
    np.testing.assert_array_equal(compiled(jnp.ones(3)), np.tanh(np.ones(3, np.float32)) * 2)


def test_interpret_mode_gives_identical_numbers():
    def f(x):
        return jnp.sum(jnp.tanh(x @ x.T) * 3 + jnp.exp(-x[:, :1]))

    x = jnp.asarray(np.random.default_rng(0).normal(size=(5, 5)).astype(np.float32))
    compiled = fflow.jit(f)(x)
    fflow.config.update("jit_interpret", True)
    try:
        interpreted = fflow.jit(f)(x)
    finally:
        fflow.config.update("jit_interpret", False)
    np.testing.assert_allclose(compiled, interpreted, rtol=1e-6)
    g = fflow.jit(lambda x: jnp.tanh(x) * 3 + 1)
    a = g(x)
    fflow.config.update("jit_interpret", True)
    try:
        b = g(x)
    finally:
        fflow.config.update("jit_interpret", False)
    np.testing.assert_array_equal(a, b)


def test_config_api():
    assert fflow.config.jit_interpret is False
    with pytest.raises(AttributeError, match="known options"):
        fflow.config.update("no_such_option", 1)
    assert isinstance(fflow.config.cpu_devices, int)


def test_explain_reports_passes_groups_and_bytes():
    def f(x):
        return jnp.tanh(x * 2 + 1) * 3, jnp.sin(x) + jnp.sin(x)

    report = fflow.explain(f)(jnp.ones((64, 64)))
    assert report.eqns_after < report.eqns_before  # CSE merged the two sins
    assert report.groups and all(len(g.eqns) >= 2 for g in report.groups)
    assert 0 < report.bytes_moved < report.bytes_unfused
    assert set(report.pass_times) >= {"dce", "fold", "cse"}
    text = str(report)
    assert "fused" in text and "trace" in text


def test_blas_threads_option():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    before = {i["internal_api"]: i["num_threads"] for i in threadpoolctl.threadpool_info()}
    try:
        fflow.config.update("blas_threads", 1)
        infos = [i for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]
        assert infos and all(i["num_threads"] == 1 for i in infos)
    finally:
        threadpoolctl.threadpool_limits(limits=before.get("openblas", None), user_api="blas")
        fflow.config.update("blas_threads", 0)


def test_explain_is_callable_after_lowered_explain():
    f = fflow.jit(lambda x: jnp.sin(x) * 2)
    assert f.lower(jnp.ones(3)).explain().eqns_after >= 1  # imports fflow.explain
    assert fflow.explain(lambda x: x + 1)(jnp.ones(3)).eqns_after == 1
