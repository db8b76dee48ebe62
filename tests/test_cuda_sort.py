"""Device sort of lines longer than one block's shared memory (lowering/cuda_sort.py):
bitonic passes over a global index buffer, checked through NVRTC + the host shim
against NumPy's stable sort (NaN last, ties in input order)."""

import numpy as np
from cuda_harness import nvrtc_required
from fflow.lowering import cuda_backend, nvrtc

import fflow
import fflow.numpy as jnp

rng = np.random.default_rng(6)


def _check(fn, a, ref):
    program = fflow.make_jaxpr(fn)(a)
    plan = cuda_backend.Plan(cuda_backend._optimize(program))
    kinds = [k.kind for k in plan.kernels]
    assert "sortseg" in kinds and kinds[-1] == "sortgat", kinds
    assert not [s for s in plan.steps if type(s).__name__ == "HostStep"]
    if nvrtc_required():
        nvrtc.compile_cubin("\n".join(k.source for k in plan.kernels))
    out = cuda_backend.compile_program(program, backend="cuda_shim")(a)[0]
    np.testing.assert_array_equal(np.asarray(out), ref(a))
    return kinds


def test_long_sort_runs_on_the_device():
    x = rng.standard_normal(5000).astype(np.float32)
    x[7], x[100:130] = np.nan, 0.5
    kinds = _check(jnp.sort, x, np.sort)
    # 5000 -> 8192 = 4 segments of 2048: stage 4096 (1 pass), stage 8192 (2 passes)
    assert kinds == ["sortseg", "sortpass", "sortseg", "sortpass", "sortpass", "sortseg", "sortgat"]


def test_long_argsort_of_rows_and_columns_is_stable():
    i = rng.integers(0, 50, (3, 3000)).astype(np.int32)
    _check(lambda i: jnp.argsort(i, axis=1), i, lambda i: np.argsort(i, axis=1, kind="stable"))
    _check(lambda x: jnp.sort(x, axis=0), i.T.copy(), lambda x: np.sort(x, axis=0))
