"""Fusion and planning of the CUDA backend: one kernel for elementwise chains, row
softmax / log_softmax / layernorm, reductions with fused producers, vectorised and
64-bit indexed kernels, the launch plan text, golden kernel snapshots, and whole
training steps (MLP, transformer block) through the host shim."""

import importlib.util
import os

import numpy as np
import pytest
from cuda_harness import BACKEND, compare, run_cases, to_backend
from fflow.lowering import cuda_backend
from fflow.transforms.staging import trace_to_program

import fflow
import fflow.numpy as jnp
from fflow import lax, nn
from fflow.core import ShapedArray

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")
rng = np.random.default_rng(0)


def plan_of(fn, *args):
    return cuda_backend.Plan(cuda_backend._optimize(fflow.make_jaxpr(fn)(*args)))


def test_elementwise_chain_is_one_vectorised_kernel():
    x, y = rng.standard_normal((2, 64, 33)).astype(np.float32)
    z = rng.standard_normal(33).astype(np.float32)

    def f(x, y, z):
        return jnp.tanh(x * y + z) * 0.5 + jnp.exp(-jnp.abs(z)) - y * y

    plan = plan_of(f, x, y, z)
    assert len(plan.kernels) == 1
    run_cases([("chain with broadcast", f, [x, y, z])])
    # same-shape operands only: flat indexing and 16-byte vector loads
    g = lambda x, y: jnp.tanh(x * y) + y  # noqa: E731
    plan = plan_of(g, x, y)
    (k,) = plan.kernels
    assert "uint4" in k.source and k.vector_width == 4
    run_cases([("vectorised", g, [x, y])])
    # an odd size falls back to scalar loads
    odd = rng.standard_normal(1001).astype(np.float32)
    (k,) = plan_of(g, odd, odd).kernels
    assert "uint4" not in k.source


def test_64_bit_indexing_is_chosen_by_size():
    small = trace_to_program(lambda x: [lax.exp(x)], [ShapedArray((1000,), np.float32)])
    big = trace_to_program(lambda x: [lax.exp(x)], [ShapedArray((2**31 + 64,), np.float32)])
    (ks,) = cuda_backend.Plan(small).kernels
    (kb,) = cuda_backend.Plan(big).kernels
    assert "for (int v" in ks.source and "long long" not in ks.source.split("void fflow")[1]
    assert "for (long long v" in kb.source


@pytest.mark.parametrize("shape", [(5, 7), (3, 2000), (2, 3, 33), (1, 1)])
def test_softmax_layernorm_are_one_row_kernel(shape):
    x = rng.standard_normal(shape).astype(np.float32) * 3
    g = rng.standard_normal(shape[-1]).astype(np.float32)
    fns = {
        "softmax": lambda x: nn.softmax(x, axis=-1),
        "log_softmax": lambda x: nn.log_softmax(x, axis=-1),
        "layernorm": lambda x, g: nn.standardize(x, axis=-1) * g + g,
        "logsumexp": lambda x: nn.logsumexp(x, axis=-1),
    }
    cases = []
    for name, fn in fns.items():
        args = [x, g] if name == "layernorm" else [x]
        plan = plan_of(fn, *args)
        if shape[-1] > 1:
            assert len(plan.kernels) == 1, (name, [k.name for k in plan.kernels])
            assert plan.kernels[0].kind == "row"
        cases.append((f"{name} {shape}", fn, args))
    run_cases(cases)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_division_is_a_reciprocal_multiply(dtype):
    x = (rng.standard_normal((6, 300)) * 3).astype(dtype)
    y = rng.uniform(1, 2, (6, 300)).astype(dtype)
    fns = {
        "softmax": lambda x: nn.softmax(x, axis=-1),
        "l1 normalise": lambda x: x / jnp.sum(jnp.abs(x), axis=-1, keepdims=True),
    }
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    refs = {
        "softmax": e / e.sum(-1, keepdims=True),
        "l1 normalise": x64 / np.abs(x64).sum(-1, keepdims=True),
    }
    for name, fn in fns.items():
        (k,) = plan_of(fn, x).kernels
        body = k.source.split("void fflow")[1]
        # one reciprocal per row, no divide in the per-element loop
        assert "red1_inv = " in body or "red0_inv = " in body, name
        loop = body.split("_inv = ")[1].split(";", 1)[1]
        assert " / " not in loop, name
        exe = cuda_backend.compile_program(fflow.make_jaxpr(fn)(x), backend=BACKEND)
        (out,) = exe(x)
        np.testing.assert_allclose(
            np.asarray(out),
            refs[name],
            rtol=3e-6 if np.asarray(out).dtype == np.float32 else 1e-13,
            atol=0,
            err_msg=name,
        )
    # a divisor that is not a row value keeps the division
    (k,) = plan_of(lambda x, y: x / y, x, y).kernels
    body = k.source.split("void fflow")[1]
    assert "_inv" not in body and " / " in body


def test_reduction_fuses_its_producers():
    x = rng.standard_normal((6, 10)).astype(np.float32)
    plan = plan_of(lambda x: jnp.sum(jnp.exp(x) * 2, axis=0), x)
    assert len(plan.kernels) == 1 and plan.kernels[0].kind == "cred"
    plan = plan_of(lambda x: jnp.sum(jnp.exp(x) * 2, axis=1), x)
    assert len(plan.kernels) == 1 and plan.kernels[0].kind == "row"


def test_matmul_epilogue_is_one_kernel_after_gemm():
    x = rng.standard_normal((8, 16)).astype(np.float32)
    w = rng.standard_normal((16, 4)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    fn = lambda x, w, b: nn.gelu(x @ w + b)  # noqa: E731
    prog = cuda_backend._optimize(fflow.make_jaxpr(fn)(x, w, b))
    kinds = [type(s).__name__ for s in cuda_backend.Plan(prog, epilogues=False).steps]
    assert kinds == ["BlasStep", "KernelStep"], kinds
    # with cuBLASLt epilogues: one step, its fallback the same kernel (test_cuda_cublaslt.py)
    assert [type(s).__name__ for s in plan_of(fn, x, w, b).steps] == ["LtStep"]
    run_cases([("gemm + bias + gelu", fn, [x, w, b])])


def test_plan_text_lists_kernels_grid_block_and_bytes():
    x = rng.standard_normal((4, 5)).astype(np.float32)
    exe = cuda_backend.compile_program(
        fflow.make_jaxpr(lambda x: nn.softmax(x) @ x.T)(x), backend=BACKEND
    )
    text = exe.source
    assert "grid=(" in text and "block=(" in text and "read=80B" in text
    assert "cublas gemm" in text and "__global__ void fflow_row_" in text


GOLDEN_CASES = {
    "cuda_fused_broadcast.cu": (
        lambda x, y: jnp.sin(x) * y + 1.0,
        [np.zeros((3, 5), np.float32), np.zeros(5, np.float32)],
    ),
    "cuda_softmax.cu": (lambda x: nn.softmax(x, axis=-1), [np.zeros((4, 100), np.float32)]),
    "cuda_strided_sum_bf16.cu": (
        lambda x: jnp.sum(x, axis=0),
        [np.zeros((7, 3), "bfloat16")],
    ),
    "cuda_scatter_add.cu": (
        lambda x, i, u: lax.scatter_add(x, i, u, (0,)),
        [np.zeros((5, 2), np.float16), np.zeros((3, 1), np.int32), np.zeros((3, 2), np.float16)],
    ),
}


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_golden_kernels(name):
    fn, args = GOLDEN_CASES[name]
    plan = plan_of(fn, *args)
    text = "\n".join(k.source[len(cuda_backend.PREAMBLE) :] for k in plan.kernels)
    path = os.path.join(GOLDEN, name)
    if os.environ.get("FFLOW_UPDATE_GOLDEN") or not os.path.exists(path):
        os.makedirs(GOLDEN, exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    with open(path) as f:
        assert text == f.read(), f"{name} changed; rerun with FFLOW_UPDATE_GOLDEN=1 if intended"


def _load_gpu_check():
    path = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "gpu_check.py")
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _compare_program(fn, *args):
    program = fflow.make_jaxpr(fn)(*args)
    exe = cuda_backend.compile_program(program, backend=BACKEND)
    flat = fflow.tree_util.tree_leaves(args)
    outs = exe(*[to_backend(a) for a in flat])
    refs = fflow.tree_util.tree_leaves(fn(*args))
    for o, r in zip(outs, refs):
        np.testing.assert_allclose(np.asarray(o), np.asarray(r), rtol=2e-4, atol=2e-5)
    return exe


def test_mlp_training_step_through_the_shim():
    gc = _load_gpu_check()
    r = np.random.default_rng(1)
    params = gc.mlp_init(r, [12, 16, 16, 5])
    x = r.standard_normal((9, 12)).astype(np.float32)
    y = r.integers(0, 5, 9).astype(np.int32)
    exe = _compare_program(gc.sgd_step(gc.mlp_loss), params, x, y)
    assert any(type(s).__name__ == "BlasStep" for s in exe.plan.steps)


def test_transformer_block_training_step_through_the_shim():
    gc = _load_gpu_check()
    r = np.random.default_rng(2)
    params = gc.block_init(r, 8, 16)
    x = r.standard_normal((2, 3, 8)).astype(np.float32)
    exe = _compare_program(gc.sgd_step(lambda p, x: gc.block_loss(p, x, heads=2)), params, x)
    assert any(s.note.startswith("row-fused") for s in exe.plan.steps if hasattr(s, "note"))


def test_device_put_eager_ops_on_the_simulated_gpu():
    dev = fflow.devices("gpu" if BACKEND == "cuda" else "cuda_shim")[0]
    a = rng.standard_normal((3, 4)).astype(np.float32)
    x = fflow.device_put(a, dev)
    assert x.device == dev
    y = jnp.sum(jnp.exp(x) * 2, axis=1)
    assert type(y._value).__name__ == "DeviceBuffer"
    compare(y, np.sum(np.exp(a) * 2, axis=1).astype(np.float32), "eager on device")
    g = fflow.grad(lambda w: jnp.sum(jnp.tanh(w * x)))(fflow.device_put(np.float32(0.5), dev))
    ref = np.sum(a * (1 - np.tanh(0.5 * a) ** 2))
    np.testing.assert_allclose(float(g), ref, rtol=1e-5)


def test_control_flow_runs_compiled_bodies():
    x = rng.standard_normal((4, 3)).astype(np.float32)

    def f(x):
        def body(c, row):
            c = jnp.tanh(c + row)
            return c, jnp.sum(c * 2)

        c, ys = lax.scan(body, jnp.zeros(3), x)
        n = lax.while_loop(lambda s: s[0] < 5, lambda s: (s[0] + 1, s[1] * 1.5), (0, c))
        return ys, lax.cond(n[0] > 3, lambda v: v + 1, lambda v: v - 1, n[1])

    plan = plan_of(f, x)
    names = [type(s).__name__ for s in plan.steps]
    assert names.count("ControlStep") == 3, names
    run_cases([("scan + while + cond", f, [x])])


def test_jit_on_device_arrays_compiles_for_the_device():
    dev = fflow.devices("gpu" if BACKEND == "cuda" else "cuda_shim")[0]
    a = rng.standard_normal((6, 5)).astype(np.float32)
    f = fflow.jit(lambda x: nn.softmax(x * 2.0) + 1.0)
    before = cuda_backend.compile_count
    on_dev = f(fflow.device_put(a, dev))
    assert on_dev.device == dev and cuda_backend.compile_count == before + 1
    on_cpu = f(a)  # the same function on host arrays: another cache entry, NumPy backend
    assert type(on_cpu._value) is np.ndarray and cuda_backend.compile_count == before + 1
    compare(on_dev, np.asarray(on_cpu), "jit on device vs host")
    f(fflow.device_put(a, dev))
    assert f.compile_count == 2
    assert "fflow_row_" in f.lower(fflow.device_put(a, dev)).as_text()
