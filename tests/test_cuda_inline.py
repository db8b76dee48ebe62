"""The recompute-vs-materialise rule of CUDA planning: values are inlined into their
consumers (rendered at the index asked for) unless that would evaluate them more
than RECOMPUTE_LIMIT times per output element; chained stencils, which multiply
the evaluations by 3 per level, are then stored every few levels."""

import re

import numpy as np
from cuda_harness import run_cases
from fflow.lowering import cuda_backend, cuda_plan

import fflow
import fflow.numpy as jnp


def _stencils(x, n=10):
    for _ in range(n):
        x = (x[:-2] + x[1:-1] + x[2:]) / 3
    return x


def test_chained_stencils_are_stored_every_few_levels():
    x = np.random.default_rng(0).standard_normal(300).astype(np.float32)
    plan = cuda_backend.Plan(cuda_backend._optimize(fflow.make_jaxpr(_stencils)(x)))
    assert len(plan.kernels) >= 3  # not one kernel evaluating 3^10 sums per output
    for k in plan.kernels:
        body = k.source.split("void fflow_")[1]
        loads = len(re.findall(r"\bin\d+\[", body))
        # at most 3 levels between stores (per vector lane)
        assert loads <= 3**3 * k.vector_width, (k.name, loads)
        assert len(body) < 20000, (k.name, len(body))
    # NumPy float64 reference of the same stencils
    ref = x.astype(np.float64)
    for _ in range(10):
        ref = (ref[:-2] + ref[1:-1] + ref[2:]) / 3
    run_cases([("10 stencils", _stencils, [x])])
    exe = cuda_backend.compile_program(fflow.make_jaxpr(_stencils)(x), backend="cuda_shim")
    np.testing.assert_allclose(np.asarray(exe(x)[0]), ref, rtol=1e-5, atol=1e-6)


def test_values_used_a_few_times_stay_inlined():
    x = np.ones((8, 16), np.float32)
    fn = lambda x: (x[:, :-2] + x[:, 1:-1] + x[:, 2:]) * 2  # noqa: E731
    plan = cuda_backend.Plan(cuda_backend._optimize(fflow.make_jaxpr(fn)(x)))
    assert len(plan.kernels) == 1 and cuda_plan.RECOMPUTE_LIMIT >= 3


def test_broadcast_operands_keep_vector_loads_for_the_others():
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((2, 8, 64)).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    sq = rng.standard_normal((64, 64)).astype(np.float32)

    def bias_gelu(x, b, y):  # a GEMM epilogue: bias broadcast over the rows
        return fflow.nn.gelu(x + b) * y

    def transposed(x, y):  # y is not read at the output's element: per-element loads
        return x * 2 + jnp.roll(y, 1, axis=1)

    (k,) = cuda_backend.Plan(cuda_backend._optimize(fflow.make_jaxpr(bias_gelu)(x, b, y))).kernels
    body = k.source.split("void fflow_")[1]
    assert k.vector_width == 4
    vectors = re.findall(r"(in\d+)_raw = \(\(const uint4\*\)", body)
    scalars = set(re.findall(r"\b(in\d+)\[", body))
    assert len(vectors) == 2 and len(scalars) == 1 and not scalars & set(vectors)  # bias
    (k,) = cuda_backend.Plan(cuda_backend._optimize(fflow.make_jaxpr(transposed)(sq, sq))).kernels
    assert k.vector_width == 4 and len(re.findall(r"in\d+_raw = ", k.source)) == 1
    bf = x.astype("bfloat16"), b.astype("bfloat16"), y.astype("bfloat16")
    run_cases([("bias gelu", bias_gelu, [x, b, y]), ("transposed", transposed, [sq, sq]),
               ("bias gelu bf16", bias_gelu, list(bf))])  # fmt: skip
