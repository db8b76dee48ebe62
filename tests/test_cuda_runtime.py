"""The pieces under the CUDA backend: the host shim's CUDA semantics (barriers, shared
memory, warp shuffles, atomics), NVRTC compilation and the on-disk caches, and that
CuPy stays optional."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from cuda_harness import nvrtc_required
from fflow.lowering import nvrtc, shim

import fflow

SHUFFLES = r"""
extern "C" __global__ void shuffles(const int* __restrict__ x, int* __restrict__ out, int n) {
  __shared__ int buf[64];
  int t = threadIdx.x;
  int v = x[blockIdx.x * blockDim.x + t];
  buf[t] = v;
  __syncthreads();
  int o = blockIdx.x * blockDim.x * 6 + t * 6;
  out[o + 0] = buf[(t + 1) % blockDim.x];          // shared memory after a barrier
  out[o + 1] = __shfl_down_sync(0xffffffffu, v, 3);
  out[o + 2] = __shfl_up_sync(0xffffffffu, v, 2, 16);
  out[o + 3] = __shfl_xor_sync(0xffffffffu, v, 5);
  out[o + 4] = __shfl_sync(0xffffffffu, v, 7);
  int s = v;
  for (int k = 16; k > 0; k >>= 1) s += __shfl_xor_sync(0xffffffffu, s, k);
  out[o + 5] = s;
  __syncwarp();
  if (t == 0) atomicAdd(&out[n - 1], v);
}
"""


def _expected(x, block):
    nblocks = len(x) // block
    out = np.zeros(nblocks * block * 6 + 1, np.int64)
    for b in range(nblocks):
        xb = x[b * block : (b + 1) * block]
        for t in range(block):
            lane, base = t % 32, t - t % 32
            o = b * block * 6 + t * 6
            out[o + 0] = xb[(t + 1) % block]
            out[o + 1] = xb[base + lane + 3] if lane + 3 < 32 else xb[t]
            seg = lane // 16 * 16
            out[o + 2] = xb[base + lane - 2] if lane - 2 >= seg else xb[t]
            out[o + 3] = xb[base + (lane ^ 5)]
            out[o + 4] = xb[base + 7]
            out[o + 5] = xb[base : base + 32].sum()
        out[-1] += xb[0]
    return out


def test_shim_barriers_shared_memory_shuffles_and_atomics():
    block, nblocks = 64, 3
    x = np.random.default_rng(0).integers(-100, 100, block * nblocks).astype(np.int32)
    out = np.zeros(block * nblocks * 6 + 1, np.int32)
    kernel = shim.ShimModule(SHUFFLES).get_function("shuffles")
    assert kernel.uses_barriers
    kernel((nblocks,), (block,), (x, out, np.int32(out.size)))
    np.testing.assert_array_equal(out, _expected(x, block))
    if nvrtc_required():
        assert nvrtc.compile_cubin(SHUFFLES)[:4] == b"\x7fELF"


def test_shim_launch_errors_are_clear():
    kernel = shim.ShimModule(SHUFFLES).get_function("shuffles")
    with pytest.raises(TypeError, match="takes 3 arguments"):
        kernel((1,), (32,), (np.zeros(32, np.int32),))
    with pytest.raises(ValueError, match="1024"):
        kernel((1,), (2048,), (np.zeros(1, np.int32), np.zeros(1, np.int32), 1))
    with pytest.raises(shim.ShimCompileError, match="g\\+\\+"):
        shim.ShimModule('extern "C" __global__ void bad(float* x) { x[0] = undefined_name; }')


def test_nvrtc_reports_compile_errors_with_the_log():
    if not nvrtc_required():
        pytest.skip("libnvrtc cannot be loaded here")
    with pytest.raises(nvrtc.NVRTCError, match="undefined_name"):
        nvrtc.compile_cubin('extern "C" __global__ void k(float* x) { x[0] = undefined_name; }')
    assert nvrtc.version() >= (13, 0)


def test_caches_are_reused_by_a_second_process(tmp_path):
    if not nvrtc_required():
        pytest.skip("libnvrtc cannot be loaded here")
    src = 'extern "C" __global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }\n'
    script = textwrap.dedent(
        f"""
        import sys
        import numpy as np
        from fflow.lowering import nvrtc, shim
        src = {src!r}
        if sys.argv[1] == "second":
            # both compilers must not run again: their outputs come from the disk caches
            nvrtc._compile = lambda *a: (_ for _ in ()).throw(AssertionError("nvrtc ran"))
            shim.compiler = lambda: (_ for _ in ()).throw(AssertionError("g++ ran"))
        assert nvrtc.compile_cubin(src)[:4] == b"\\x7fELF"
        x = np.ones(4, np.float32)
        shim.ShimModule(src).get_function("twice")(1, 4, (x,))
        assert x.tolist() == [2.0] * 4
        """
    )
    env = dict(os.environ, FFLOW_CACHE_DIR=str(tmp_path))
    for which in ("first", "second"):
        proc = subprocess.run(
            [sys.executable, "-c", script, which], env=env, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr
    assert list((tmp_path / "nvrtc").glob("*.cubin")) and list((tmp_path / "shim").glob("*.so"))


def test_cupy_stays_optional():
    code = (
        "import sys, fflow, fflow.numpy as jnp\n"
        "import fflow.lowering.cuda_backend, fflow.lowering.cuda_nccl, fflow.device\n"
        "fflow.jit(lambda x: x + 1)(jnp.ones(3))\n"
        "assert 'cupy' not in sys.modules, 'cupy was imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_gpu_devices_without_cupy_say_how_to_fix():
    try:
        import cupy  # noqa: F401
    except ImportError:
        with pytest.raises(RuntimeError, match="cuda_shim"):
            fflow.devices("gpu")
    else:  # pragma: no cover - only on GPU machines
        assert fflow.devices("gpu")
    with pytest.raises(ValueError, match="unknown platform"):
        fflow.devices("tpu")


def test_cupy_code_paths_with_a_stand_in_cupy():
    """CupyRuntime, device arrays and eager dispatch, driven through tests/fake_cupy.py
    (NumPy arrays posing as CuPy ones, kernels run by the shim): the GPU mode of the
    CUDA tests (FFLOW_CUDA_TEST_BACKEND=cuda) on a subset."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = (
        f"import sys; sys.path.insert(0, {here!r})\n"
        "import fake_cupy; fake_cupy.install()\n"
        "import pytest\n"
        "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', "
        f"{os.path.join(here, 'test_cuda_fusion.py')!r}, "
        "'-k', 'mlp or transformer or device or control or epilogue']))\n"
    )
    env = dict(os.environ, FFLOW_CUDA_TEST_BACKEND="cuda")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "6 passed" in proc.stdout
