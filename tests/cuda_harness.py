"""Shared helpers of the CUDA tests: draw cases with hypothesis, build every generated
kernel of a batch with one NVRTC call (sm_90 cubin) and one g++ call (host shim),
run each case through the shim and compare with eager NumPy evaluation."""

import os

import numpy as np
from fflow.lowering import cuda_backend, nvrtc, shim
from hypothesis import given, settings
from hypothesis import strategies as st

import fflow
from fflow.core import primitives

BF16 = None  # ml_dtypes is a test dependency; without it bf16 cases are left out
try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover
    pass

FLOATS = [np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16)] + (
    [BF16] if BF16 is not None else []
)

# "cuda_shim" (default): kernels run on the CPU; "cuda": on a real GPU through CuPy
# (benchmarks/gpu_check.py sets this on a GPU machine)
BACKEND = os.environ.get("FFLOW_CUDA_TEST_BACKEND", "cuda_shim")

TOL = {"float32": 2e-5, "float64": 1e-12, "float16": 2e-3, "bfloat16": 1.6e-2}


def nvrtc_required():
    """NVRTC must load wherever the test extra is installed; skip only if it truly can't."""
    try:
        nvrtc.load_library()
        return True
    except nvrtc.NVRTCUnavailable:
        return False


def shapes(min_dims=0, max_dims=3, max_side=7):
    return st.lists(st.integers(1, max_side), min_size=min_dims, max_size=max_dims).map(tuple)


def array(rng, shape, dtype, lo=-2.0, hi=2.0):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        lo_i = max(int(lo), np.iinfo(dtype).min)
        hi_i = min(int(hi), np.iinfo(dtype).max)
        return rng.integers(lo_i, hi_i + 1, shape).astype(dtype)
    return np.asarray(rng.uniform(lo, hi, shape)).astype(dtype)


def collect(make_case, n, seed=0):
    """Draw `n` cases with hypothesis: make_case(data) -> (label, fn, args)."""
    cases = []

    @settings(max_examples=n, deadline=None, derandomize=True, database=None)
    @given(st.data())
    def draw(data):
        case = make_case(data)
        if case is not None:
            cases.append(case)

    draw()
    return cases


def run_cases(cases, exact_kinds="biu"):
    """Compile all cases (one NVRTC + one g++ run for the batch) and compare each."""
    built = []
    for label, fn, args in cases:
        try:
            with np.errstate(all="ignore"):
                ref = fn(*[fflow.numpy.asarray(a) for a in args])
        except (TypeError, NotImplementedError) as e:  # e.g. a ufunc without a bf16 loop
            if "bfloat16" in str(e) or "float16" in str(e) or "ufunc" in str(e):
                continue
            raise
        program = fflow.make_jaxpr(fn)(*args)
        exe = cuda_backend.compile_program(program, backend=BACKEND, verify_nvrtc=False)
        built.append((label, exe, args, ref))
    kernels = {k.name: k for _, exe, _, _ in built for k in exe.plan.kernels}
    sources = [k.source for k in kernels.values()]
    if sources and nvrtc_required():
        cubin = nvrtc.compile_cubin("\n".join(sources))
        assert cubin[:4] == b"\x7fELF"
    if BACKEND == "cuda_shim":
        shim.preload(sources)
    for label, exe, args, ref in built:
        with np.errstate(all="ignore"):
            outs = exe(*[to_backend(a) for a in args])
        refs = fflow.tree_util.tree_leaves(ref)
        assert len(outs) == len(refs), label
        for o, r in zip(outs, refs):
            compare(o, r, label, exact_kinds)
    return built


def to_backend(a):
    if BACKEND == "cuda":
        return fflow.device_put(np.asarray(a), fflow.devices("gpu")[0])
    return fflow.numpy.asarray(a)


def compare(out, ref, label, exact_kinds="biu"):
    o, r = np.asarray(out), np.asarray(ref)
    assert o.shape == r.shape, f"{label}: shape {o.shape} != {r.shape}"
    assert o.dtype == r.dtype, f"{label}: dtype {o.dtype} != {r.dtype}"
    if r.dtype.kind in exact_kinds:
        np.testing.assert_array_equal(o, r, err_msg=label)
        return
    tol = TOL.get(r.dtype.name, 1e-5)
    np.testing.assert_allclose(
        o.astype(np.float64),
        r.astype(np.float64),
        rtol=tol,
        atol=tol,
        equal_nan=True,
        err_msg=label,
    )


def bind(name, *args, **params):
    return primitives[name].bind(*args, **params)
