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


CAPTURING = []  # while a stream captures: the list its operations are recorded into


def _use(what):
    USED.append((what, CURRENT[-1]))


def _enqueue(op):
    """Run a device operation now, or record it when a stream is capturing (as CUDA
    does: nothing executes during capture, a graph launch replays what was recorded)."""
    if CAPTURING:
        CAPTURING[-1].append(op)
    else:
        op()


class _Ptr:
    def __init__(self, ptr):
        self.ptr = ptr

    def copy_from_device_async(self, src, size, stream=None):
        import ctypes

        _use("memcpy")
        _enqueue(lambda: ctypes.memmove(self.ptr, src.ptr, size))


class Graph:
    def __init__(self, ops):
        self.ops = ops

    def launch(self, stream=None):
        assert not CAPTURING, "a graph launched while capturing"
        _use("graph_launch")
        for op in self.ops:
            op()


class Stream:
    """CUDA streams: all work runs in order at once; capture records instead."""

    def __init__(self, null=False, non_blocking=False):
        self.null = null
        self.capturing = False
        self.ptr = 0 if null else id(self)  # the cudaStream_t handed to cuBLASLt

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

    def begin_capture(self, mode=None):
        assert not self.null, "the legacy default stream cannot capture"
        assert not self.capturing
        self.capturing = True
        CAPTURING.append([])

    def end_capture(self):
        assert self.capturing
        self.capturing = False
        return Graph(CAPTURING.pop())

    def is_capturing(self):
        return self.capturing

    def synchronize(self):
        assert not self.capturing, "a capturing stream cannot be synchronized"


_NULL_STREAM = Stream(null=True)


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
    if not CAPTURING:
        return _wrap(np.matmul(np.asarray(a), np.asarray(b)))
    with np.errstate(all="ignore"):  # only for the result's shape and dtype
        probe = np.matmul(np.asarray(a), np.asarray(b))
    out = empty(probe.shape, probe.dtype)
    _enqueue(lambda: np.matmul(np.asarray(a), np.asarray(b), out=np.asarray(out)))
    return out


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
            args = tuple(np.asarray(a) for a in args)
            _enqueue(lambda: kernel(grid, block, args, shared_mem))

        return launch


# -- cuBLAS's 16-bit GEMMs, column-major as the real ones, on raw device pointers --------------

_CUDA_TYPES = {0: np.float32, 2: np.float16, 14: "bfloat16"}


def _to_f32(bits_or_vals, t):
    if _CUDA_TYPES[t] == "bfloat16":
        return (bits_or_vals.astype(np.uint32) << 16).view(np.float32)
    return bits_or_vals.astype(np.float32)


def _matrix(ptr, t, rows, cols, ld, stride, batch):
    """The column-major [batch, rows, cols] matrices at `ptr` (leading dimension `ld`)."""
    import ctypes

    dt = np.dtype(np.uint16 if _CUDA_TYPES[t] == "bfloat16" else _CUDA_TYPES[t])
    count = (batch - 1) * stride + (cols - 1) * ld + rows
    buf = np.frombuffer((ctypes.c_char * (count * dt.itemsize)).from_address(ptr), dt)
    isz = dt.itemsize
    view = np.lib.stride_tricks.as_strided(
        buf, (batch, rows, cols), (stride * isz, isz, ld * isz), writeable=True
    )
    return view


def gemmStridedBatchedEx(handle, ta, tb, m, n, k, alpha, a, at, lda, sa, b, bt, ldb, sb,  # noqa: N802
                         beta, c, ct, ldc, sc, batch, compute, algo):  # fmt: skip
    _use("gemmEx")
    assert compute == 68, "fp32 accumulation expected"
    _enqueue(lambda: _gemm(ta, tb, m, n, k, a, at, lda, sa, b, bt, ldb, sb, c, ct, ldc, sc, batch))


def _gemm(ta, tb, m, n, k, a, at, lda, sa, b, bt, ldb, sb, c, ct, ldc, sc, batch):
    A = _to_f32(_matrix(a, at, *((m, k) if ta == 0 else (k, m)), lda, sa, batch), at)
    B = _to_f32(_matrix(b, bt, *((k, n) if tb == 0 else (n, k)), ldb, sb, batch), bt)
    A = A if ta == 0 else A.transpose(0, 2, 1)
    B = B if tb == 0 else B.transpose(0, 2, 1)
    C = np.matmul(A.astype(np.float64), B.astype(np.float64)).astype(np.float32)  # fp32 acc
    dst = _matrix(c, ct, m, n, ldc, sc, batch)
    if _CUDA_TYPES[ct] == "bfloat16":
        import ml_dtypes

        dst[...] = C.astype(ml_dtypes.bfloat16).view(np.uint16)
    else:
        dst[...] = C.astype(_CUDA_TYPES[ct])


def gemmEx(handle, ta, tb, m, n, k, alpha, a, at, lda, b, bt, ldb, beta, c, ct, ldc,  # noqa: N802
           compute, algo):  # fmt: skip
    gemmStridedBatchedEx(handle, ta, tb, m, n, k, alpha, a, at, lda, 0, b, bt, ldb, 0, beta, c,
                         ct, ldc, 0, 1, compute, algo)  # fmt: skip


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
        Stream=Stream,
        get_current_stream=lambda: _NULL_STREAM,
        cublas=types.SimpleNamespace(
            gemmEx=gemmEx,
            gemmStridedBatchedEx=gemmStridedBatchedEx,
            getPointerMode=lambda h: 0,
            setPointerMode=lambda h, m: None,
        ),
        device=types.SimpleNamespace(get_cublas_handle=lambda: 1),
        runtime=types.SimpleNamespace(getDeviceCount=lambda: device_count),
    )
    mod.cuda = cuda
    for name in ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
                 "uint16", "uint32", "uint64", "bool_"):  # fmt: skip
        setattr(mod, name, getattr(np, name))
    # CuPy keeps a 0-d array 0-d (NumPy makes it 1-d)
    mod.ascontiguousarray = lambda a: _wrap(np.ascontiguousarray(a).reshape(np.shape(a)))
    sys.modules["cupy"] = mod
    import fake_cublaslt  # cuBLASLt, loaded through cuda_cublaslt's ctypes calls

    fake_cublaslt.install()
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
