"""Bugs the shim alone could not show: rows past the capped grid of the row kernel,
binaries for more than one GPU architecture, the device id of a program, and the
per-user, atomically written kernel cache."""

import os
import struct
import subprocess
import sys

import numpy as np
import pytest
from cuda_harness import nvrtc_required
from fflow.lowering import cuda_backend, cuda_kernels, nvrtc
from fflow.transforms.staging import trace_to_program

from fflow import lax, nn
from fflow.core import ShapedArray

needs_nvrtc = pytest.mark.skipif(not nvrtc_required(), reason="libnvrtc cannot be loaded here")


def _row_kernel(plan):
    (k,) = [k for k in plan.kernels if "fflow_row_" in k.name]
    return k


def test_row_kernel_of_5m_rows_loops_over_rows_past_its_grid():
    # [5,000,000, 8]: 8 lanes a row, 4 rows a warp, 16 rows a block: 312,500 blocks; the
    # grid-stride loop over rows is what covers rows past any capped grid (shim test below)
    prog = trace_to_program(
        lambda x: [lax.reduce_sum(x, (1,))], [ShapedArray((5_000_000, 8), np.float32)]
    )
    k = _row_kernel(cuda_backend.Plan(prog))
    grid = k.grid if isinstance(k.grid, int) else k.grid[0]
    warps = k.block // 32
    assert grid <= cuda_kernels.MAX_GRID and grid * warps * 4 <= 5_000_000
    # every warp strides over the rows by the whole grid's warps, so all rows are covered
    assert "row0 < 5000000" in k.source and "const int row = row0 + sub;" in k.source
    assert "row0 += (int)gridDim.x * (blockDim.x >> 5) * 4" in k.source


@pytest.mark.parametrize(
    "name, shape",
    [("sum", (50, 8)), ("softmax", (37, 40)), ("layernorm", (9, 1500))],
)
def test_rows_past_a_small_grid_cap_are_computed_in_the_shim(monkeypatch, name, shape):
    # the shim cannot hold 5M rows quickly, so shrink the cap until the loop is needed
    monkeypatch.setattr(cuda_kernels, "MAX_GRID", 2)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    xd = x.astype(np.float64)
    if name == "sum":
        fn, ref = (lambda x: [lax.reduce_sum(x, (1,))]), xd.sum(1)
    elif name == "softmax":
        e = np.exp(xd - xd.max(1, keepdims=True))
        fn, ref = (lambda x: [nn.softmax(x, axis=-1)]), e / e.sum(1, keepdims=True)
    else:
        mu, var = xd.mean(1, keepdims=True), xd.var(1, keepdims=True)
        fn = lambda x: [nn.standardize(x, axis=-1, epsilon=1e-5)]  # noqa: E731
        ref = (xd - mu) / np.sqrt(var + 1e-5)
    prog = trace_to_program(fn, [ShapedArray(shape, np.float32)])
    exe = cuda_backend.compile_program(prog, backend="cuda_shim", verify_nvrtc=False)
    grid = _row_kernel(exe.plan).grid
    assert (grid if isinstance(grid, int) else grid[0]) <= 2
    (out,) = exe(x)
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-4, atol=1e-5)


SRC = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] += 1.0f; }\n'


@needs_nvrtc
@pytest.mark.parametrize("capability", [80, 86, 89, 90])
def test_module_files_are_cubins_for_the_devices_architecture(capability):
    with open(nvrtc.module_file(SRC, capability), "rb") as f:
        data = f.read()
    assert data[:4] == b"\x7fELF"
    flags = struct.unpack_from("<I", data, 48)[0]  # e_flags: the SM number in bits 8..15
    assert (flags >> 8) & 0xFF == capability


@needs_nvrtc
def test_a_gpu_newer_than_nvrtc_gets_ptx():
    newest = max(nvrtc.supported_archs())
    path = nvrtc.module_file(SRC, newest + 50)
    assert path.endswith(".ptx")
    with open(path, "rb") as f:
        text = f.read().decode()
    assert f".target sm_{newest}" in text and ".entry k" in text
    assert nvrtc.targets_for(90) == ("sm_90", "compute_90")
    with pytest.raises(nvrtc.NVRTCError, match="Fix"):
        nvrtc.targets_for(min(nvrtc.supported_archs()) - 10)


def test_cache_dir_is_per_user_without_a_home(monkeypatch, tmp_path):
    monkeypatch.delenv("FFLOW_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", "")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    path = nvrtc.cache_dir("nvrtc")
    assert path == os.path.join(str(tmp_path), f"fflow-{os.getuid()}", "nvrtc")
    assert os.stat(path).st_mode & 0o077 == 0
    nvrtc.write_atomic(os.path.join(path, "a.bin"), b"xyz")
    assert sorted(os.listdir(path)) == ["a.bin"]  # no temporary file left behind


DEVICE_SCRIPT = """
import sys, os
sys.path.insert(0, {here!r})
import fake_cupy
fake_cupy.install(device_count=2)
import numpy as np
import fflow, fflow.numpy as jnp
from fflow import nn
gpu1 = fflow.devices("gpu")[1]
x = fflow.device_put(np.arange(12, dtype=np.float32).reshape(3, 4) / 10, gpu1)
w = fflow.device_put(np.ones((4, 5), np.float32), gpu1)
fake_cupy.USED.clear()
out = fflow.jit(lambda x, w: nn.softmax(jnp.tanh(x @ w) * 2.0))(x, w)
assert out.device == gpu1, out.device
kinds = {{k for k, _ in fake_cupy.USED}}
assert {{"launch", "matmul", "empty", "module"}} <= kinds, kinds
wrong = [u for u in fake_cupy.USED if u[1] != 1]
assert not wrong, wrong
paths = [p for p in fake_cupy.SOURCES if os.sep in p]
assert paths and all(p.startswith(os.environ["FFLOW_CACHE_DIR"]) for p in paths), paths
print("ok")
"""


@needs_nvrtc
def test_programs_on_gpu_1_launch_allocate_and_multiply_on_gpu_1(tmp_path):
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, FFLOW_CACHE_DIR=str(tmp_path))
    env.pop("FFLOW_JIT_BACKEND", None)
    proc = subprocess.run(
        [sys.executable, "-c", DEVICE_SCRIPT.format(here=here)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout + proc.stderr[-3000:]
