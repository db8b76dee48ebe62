"""Runtimes of the CUDA backend: where a launch plan's buffers live and how its
kernels run. `ShimRuntime`: NumPy buffers, kernels through the host shim, NumPy
matmul standing in for cuBLAS. `CupyRuntime`: CuPy buffers, RawModules loaded from
the NVRTC cubins, cuBLAS via cupy.matmul, cuSOLVER via cupy.linalg (CuPy is
imported only when this runtime is made)."""

import contextlib

import numpy as np

from fflow.array import Array
from fflow.core import Var
from fflow.device_buffer import DeviceBuffer, _aligned_copy, _cupy, storage_dtype, to_device


def _tuple(grid):
    return grid if isinstance(grid, tuple) else (grid,)


# -- runtimes -------------------------------------------------------------------------------


class ShimRuntime:
    """Runs plans on the CPU: kernels through the host shim, NumPy matmul for cuBLAS."""

    name = "cuda_shim"

    def __init__(self, device=None):
        self.device = device

    def scope(self):
        return contextlib.nullcontext()

    def empty(self, aval):
        return _aligned_copy(np.empty(aval.shape, aval.dtype))

    def load(self, kernels):
        from fflow.lowering import shim

        return shim.build_many([k.source for k in kernels]) if kernels else {}

    def launch(self, fn, kernel, args):
        fn(_tuple(kernel.grid), (kernel.block,), args)

    def to_runtime(self, value, aval):
        if type(value) is DeviceBuffer:
            value = value.data
        value = np.asarray(value)
        if value.dtype != aval.dtype:
            value = value.astype(aval.dtype)
        if not value.flags.c_contiguous or value.ctypes.data % 16:
            value = _aligned_copy(value)
        return value

    def to_host(self, value, aval):
        return value

    def from_host(self, host, aval):
        return self.to_runtime(np.asarray(host, aval.dtype), aval)

    def matmul(self, eqn, lhs, rhs):
        return self.to_runtime(eqn.primitive.impl(lhs, rhs, **eqn.params), eqn.outputs[0].aval)

    def lt_matmul(self, step, lhs, rhs, bias, mask=None):
        """No cuBLASLt on the host: the plan runs the GEMM and its epilogue kernel."""
        step.taken = "no cuBLASLt on the host shim"
        return None

    def solver(self, eqn, args):
        outs = eqn.primitive.impl(*args, **eqn.params)
        return list(outs) if eqn.primitive.multiple_results else [outs]

    def reshape(self, value, shape):
        return value.reshape(shape)

    def wrap(self, value, aval):
        if self.device is None:
            return Array(value, aval.weak_type)
        return Array(DeviceBuffer(value, aval.dtype, self.device), aval.weak_type)


_cupy_functions = {}  # (kernel name, device id) -> loaded RawModule function


class CupyRuntime:
    """Runs plans on a GPU: RawModule kernels from the NVRTC cubins, cuBLAS via cupy.matmul."""

    name = "cuda"

    def __init__(self, device):
        self.cp = _cupy()
        self.device = device
        self.capability = None

    def scope(self):
        """Make this runtime's GPU current: launches, allocations and GEMMs go there."""
        return self.cp.cuda.Device(self.device.id)

    def empty(self, aval):
        return self.cp.empty(aval.shape, storage_dtype(aval.dtype))

    def load(self, kernels):
        from fflow.lowering import nvrtc

        out = {}
        with self.scope():
            for k in kernels:
                fn = _cupy_functions.get((k.name, self.device.id))
                if fn is None:
                    try:
                        # a cubin for this GPU's architecture (or PTX the driver JITs),
                        # from the per-user cache, written atomically
                        path = nvrtc.module_file(k.source, self._capability(), k.name + ".cu")
                        mod = self.cp.RawModule(path=path)
                    except nvrtc.NVRTCUnavailable:
                        mod = self.cp.RawModule(code=k.source, options=("--std=c++17",))
                    fn = _cupy_functions[(k.name, self.device.id)] = mod.get_function(k.name)
                out[k.name] = fn
        return out

    def _capability(self):
        if self.capability is None:
            self.capability = int(self.cp.cuda.Device(self.device.id).compute_capability)
        return self.capability

    def launch(self, fn, kernel, args):
        fn(_tuple(kernel.grid), (kernel.block,), tuple(args))

    def to_runtime(self, value, aval):
        if type(value) is DeviceBuffer:
            value = value.data
        if isinstance(value, self.cp.ndarray):
            if not value.flags.c_contiguous or value.data.ptr % 16:
                value = value.copy(order="C")
            return value
        return to_device(np.asarray(value, aval.dtype), self.device).data

    def to_host(self, value, aval):
        host = value.get()
        return host.view(aval.dtype) if host.dtype != aval.dtype else host

    def from_host(self, host, aval):
        return self.to_runtime(np.asarray(host, aval.dtype), aval)

    def matmul(self, eqn, lhs, rhs):
        from fflow.lowering import cuda_gemm

        if cuda_gemm.is_16bit(eqn):  # bf16/fp16 on tensor cores, fp32 accumulate, no copies
            return cuda_gemm.gemm16(self.cp, eqn, lhs, rhs, self.empty)
        cp = self.cp
        (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
        la, ra = eqn.inputs[0].aval, eqn.inputs[1].aval
        out_aval = eqn.outputs[0].aval
        lhs, rhs = self._compute(lhs, la.dtype), self._compute(rhs, ra.dtype)
        if np.dtype(out_aval.dtype) == np.float32 and lhs.dtype != cp.float32:
            # a wider result (preferred_element_type): multiply in float32, as NumPy does
            lhs, rhs = lhs.astype(cp.float32), rhs.astype(cp.float32)
        lf = [i for i in range(la.ndim) if i not in lc and i not in lb]
        rf = [i for i in range(ra.ndim) if i not in rc and i not in rb]
        nb = int(np.prod([la.shape[i] for i in lb], dtype=np.int64))
        m = int(np.prod([la.shape[i] for i in lf], dtype=np.int64))
        n = int(np.prod([ra.shape[i] for i in rf], dtype=np.int64))
        kk = int(np.prod([la.shape[i] for i in lc], dtype=np.int64))
        # views where possible: cuBLAS takes transposed operands without a copy
        a = cp.transpose(lhs, list(lb) + lf + list(lc)).reshape(nb, m, kk)
        b = cp.transpose(rhs, list(rb) + list(rc) + rf).reshape(nb, kk, n)
        out = cp.matmul(a[0], b[0]) if nb == 1 else cp.matmul(a, b)  # (batched) GEMM
        out = out.reshape(out_aval.shape)
        return self._store(out, out_aval.dtype)

    def lt_matmul(self, step, lhs, rhs, bias, mask=None):
        """GEMM + bias / activation in one cublasLtMatmul ({Var: array}), or None (with
        `step.taken` saying why) when cuBLASLt is missing or refuses the layout."""
        from fflow.lowering import cuda_cublaslt

        if step.epi.act == "drelu" and mask is None:
            step.taken = "the forward GEMM wrote no relu mask"
            return None
        try:
            outs = cuda_cublaslt.matmul(self.cp, step.epi, lhs, rhs, bias, self.empty, mask)
        except cuda_cublaslt.LtUnavailable as e:
            step.taken = str(e)
            return None
        step.taken = "cuBLASLt"
        return outs

    def solver(self, eqn, args):
        """cuSOLVER through CuPy: NumPy's linalg functions dispatch on CuPy arrays."""
        if any(np.dtype(v.aval.dtype).itemsize < 4 for v in eqn.inputs if type(v) is Var):
            return None  # no half/bf16 solvers: the host does these
        try:
            outs = eqn.primitive.impl(*args, **eqn.params)
        except (TypeError, ValueError, AttributeError, NotImplementedError):
            return None
        outs = list(outs) if eqn.primitive.multiple_results else [outs]
        return outs if all(isinstance(o, self.cp.ndarray) for o in outs) else None

    def _compute(self, x, dtype):
        if np.dtype(dtype).name == "bfloat16":
            return (x.astype(self.cp.uint32) << 16).view(self.cp.float32)
        return x

    def _store(self, x, dtype):
        cp = self.cp
        if np.dtype(dtype).name == "bfloat16":
            bits = x.astype(cp.float32).view(cp.uint32)
            return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(cp.uint16)
        return x.astype(dtype, copy=False)

    def reshape(self, value, shape):
        return value.reshape(shape)

    def wrap(self, value, aval):
        return Array(DeviceBuffer(value, aval.dtype, self.device), aval.weak_type)
