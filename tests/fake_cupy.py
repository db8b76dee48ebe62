"""A stand-in for CuPy on machines without a GPU, so the tests can drive the CUDA
backend's CuPy code paths (CupyRuntime, device arrays, eager dispatch) for real.

Arrays are NumPy arrays of a subclass with CuPy's extra attributes (`.get()`,
`.data.ptr`); `RawModule(path=...)` runs the kernel through the host shim, finding
its source by kernel name among the sources NVRTC compiled in this process.
Install with `fake_cupy.install()` before fflow touches a GPU.
"""

import os
import sys
import types

import numpy as np

SOURCES = {}  # kernel name or module file path -> CUDA source
CURRENT = [0]  # the stack of current devices (`with cuda.Device(i)`)
USED = []  # (what, device id) for every allocation, GEMM, module load and launch
CAPABILITY = "90"


def _use(what):
    USED.append((what, CURRENT[-1]))


class _Ptr:
    def __init__(self, ptr):
        self.ptr = ptr


class ndarray(np.ndarray):  # noqa: N801 - CuPy's name
    @property
    def data(self):
        return _Ptr(self.ctypes.data)

    def get(self):
        return np.array(self)


def _wrap(x):
    return np.asarray(x).view(ndarray)


def empty(shape, dtype=np.float32):
    _use("empty")
    raw = np.empty(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize + 256, np.uint8)
    off = (-raw.ctypes.data) % 256  # CuPy's allocations are 256-byte aligned
    n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return raw[off : off + n].view(dtype).reshape(shape).view(ndarray)


def asarray(x, dtype=None):
    if isinstance(x, ndarray) and dtype is None:
        return x
    _use("asarray")
    host = np.asarray(x, dtype)
    out = empty(host.shape, host.dtype)
    out[...] = host
    return out


def matmul(a, b):
    _use("matmul")
    return _wrap(np.matmul(np.asarray(a), np.asarray(b)))


def transpose(a, axes):
    return np.transpose(a, axes)


class RawModule:
    def __init__(self, code=None, path=None, options=()):
        from fflow.lowering import shim

        _use("module")
        if code is None:
            code = SOURCES[path] if path in SOURCES else SOURCES[os.path.basename(path)[:-6]]
        self.kernels = shim.build_many([code])  # built already by the patched load

    def get_function(self, name):
        kernel = self.kernels[name]

        def launch(grid, block, args, shared_mem=0):
            _use("launch")
            kernel(grid, block, tuple(np.asarray(a) for a in args), shared_mem)

        return launch


class _Device:
    def __init__(self, i=0):
        self.id = i
        self.compute_capability = CAPABILITY

    def __enter__(self):
        CURRENT.append(self.id)
        return self

    def __exit__(self, *a):
        CURRENT.pop()
        return False

    def use(self):
        pass

    def synchronize(self):
        pass


def install(device_count=1):
    """Put this module in sys.modules as `cupy` and record NVRTC sources by kernel name
    and module file."""
    from fflow.lowering import nvrtc, shim

    mod = sys.modules[__name__]
    cuda = types.SimpleNamespace(
        Device=_Device,
        runtime=types.SimpleNamespace(getDeviceCount=lambda: device_count),
    )
    mod.cuda = cuda
    for name in ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
                 "uint16", "uint32", "uint64", "bool_"):  # fmt: skip
        setattr(mod, name, getattr(np, name))
    mod.ascontiguousarray = lambda a: _wrap(np.ascontiguousarray(a))
    sys.modules["cupy"] = mod
    compile_cubin = nvrtc.compile_cubin

    def recording(source, *args, **kwargs):
        for name, _, _ in shim.parse_kernels(source):
            SOURCES[name] = source
        return compile_cubin(source, *args, **kwargs)

    nvrtc.compile_cubin = recording
    module_file = nvrtc.module_file

    def recording_file(source, *args, **kwargs):
        path = module_file(source, *args, **kwargs)
        SOURCES[path] = source
        return path

    nvrtc.module_file = recording_file
    # one g++ run per program (as the shim runtime does), not one per kernel
    from fflow.lowering import cuda_backend

    load = cuda_backend.CupyRuntime.load

    def batched_load(self, kernels):
        shim.preload([k.source for k in kernels])
        return load(self, kernels)

    cuda_backend.CupyRuntime.load = batched_load
