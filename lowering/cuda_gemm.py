"""16-bit GEMMs on the GPU: bf16 / fp16 `dot_general` as one cuBLAS call on the 16-bit
buffers (cublasGemmEx, or cublasGemmStridedBatchedEx for batch dimensions) with fp32
accumulation on tensor cores, through CuPy's cuBLAS bindings — no float32 copies.

Operands are read in place whenever their layout allows: an operand whose
contracting dims come before its free dims (x.T @ g of a weight gradient, the k of
q @ kᵀ) is passed transposed (CUBLAS_OP_T) instead of being copied; only other
layouts are made contiguous (a 16-bit copy). Row-major C = A @ B is computed as the
column-major Cᵀ = Bᵀ Aᵀ, so no output transpose is needed either.
"""

import numpy as np

# cudaDataType / cublas enums (cuda_runtime.h, cublas_api.h)
CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF = 0, 2, 14
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUBLAS_COMPUTE_32F = 68
CUBLAS_GEMM_DEFAULT = -1  # cuBLAS picks a tensor-core algorithm for 16-bit inputs

_TYPES = {"bfloat16": CUDA_R_16BF, "float16": CUDA_R_16F, "float32": CUDA_R_32F}


def is_16bit(eqn):
    """True when `eqn` (a dot_general) runs as a 16-bit GEMM with fp32 accumulation."""
    a, b = (np.dtype(v.aval.dtype).name for v in eqn.inputs)
    out = np.dtype(eqn.outputs[0].aval.dtype).name
    return a == b and a in ("bfloat16", "float16") and out in (a, "float32")


def dims(eqn):
    """(nb, m, n, k, lhs layout, rhs layout): layout "N", "T" or "copy" per operand."""
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    la, ra = eqn.inputs[0].aval, eqn.inputs[1].aval
    lf = [i for i in range(la.ndim) if i not in lc and i not in lb]
    rf = [i for i in range(ra.ndim) if i not in rc and i not in rb]

    def size(shape, idx):
        return int(np.prod([shape[i] for i in idx], dtype=np.int64))

    def layout(first, second, nbatch, ndim):  # the logical operand is [batch, first, second]
        ident = list(range(nbatch, ndim))
        if first + second == ident:
            return "N"
        if second + first == ident:
            return "T"
        return "copy"

    lb, rb, lc, rc = list(lb), list(rb), list(lc), list(rc)
    lhs = layout(lf, lc, len(lb), la.ndim) if lb == list(range(len(lb))) else "copy"
    rhs = layout(rc, rf, len(rb), ra.ndim) if rb == list(range(len(rb))) else "copy"
    perms = (lb + lf + lc, rb + rc + rf)
    return (size(la.shape, lb), size(la.shape, lf), size(ra.shape, rf), size(la.shape, lc),
            lhs, rhs, perms)  # fmt: skip


def describe(eqn):
    """One line for the launch plan: which cuBLAS call, types, operand layouts."""
    nb, m, n, k, lt, rt, _ = dims(eqn)
    a = np.dtype(eqn.inputs[0].aval.dtype).name
    out = np.dtype(eqn.outputs[0].aval.dtype).name
    call = "cublasGemmEx" if nb == 1 else f"cublasGemmStridedBatchedEx batch={nb}"
    return f"{call} {a} x {a} -> {out}, fp32 accumulate, m={m} n={n} k={k} lhs={lt} rhs={rt}"


def gemm16(cp, eqn, lhs, rhs, empty):
    """Run the 16-bit dot_general `eqn` on CuPy arrays of 16-bit storage; `empty(aval)`
    allocates the output. Returns the output array (storage dtype of its aval)."""
    nb, m, n, k, lt, rt, (lperm, rperm) = dims(eqn)
    out_aval = eqn.outputs[0].aval
    out = empty(out_aval)
    if out.size == 0:
        return out
    if k == 0:
        out[...] = 0
        return out
    lhs, rhs = cp.ascontiguousarray(lhs), cp.ascontiguousarray(rhs)  # (no-ops as a rule)
    if lt == "copy":  # a layout cuBLAS cannot stride over: one 16-bit copy, no f32
        lhs, lt = cp.ascontiguousarray(cp.transpose(lhs, lperm)), "N"
    if rt == "copy":
        rhs, rt = cp.ascontiguousarray(cp.transpose(rhs, rperm)), "N"
    in_t = _TYPES[np.dtype(eqn.inputs[0].aval.dtype).name]
    out_t = _TYPES[np.dtype(out_aval.dtype).name]
    # column-major Cᵀ[n, m] = op(X) op(Y) with X = B's memory, Y = A's memory
    op_x, ldx = (CUBLAS_OP_N, n) if rt == "N" else (CUBLAS_OP_T, k)
    op_y, ldy = (CUBLAS_OP_N, k) if lt == "N" else (CUBLAS_OP_T, m)
    alpha, beta = np.ones(1, np.float32), np.zeros(1, np.float32)
    blas = cp.cuda.cublas
    handle = cp.cuda.device.get_cublas_handle()
    mode = blas.getPointerMode(handle)
    blas.setPointerMode(handle, 0)  # CUBLAS_POINTER_MODE_HOST: alpha/beta are host floats
    if nb == 1:
        blas.gemmEx(handle, op_x, op_y, n, m, k, alpha.ctypes.data,
                    rhs.data.ptr, in_t, ldx, lhs.data.ptr, in_t, ldy, beta.ctypes.data,
                    out.data.ptr, out_t, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)  # fmt: skip
    else:
        blas.gemmStridedBatchedEx(handle, op_x, op_y, n, m, k, alpha.ctypes.data,
                                  rhs.data.ptr, in_t, ldx, k * n, lhs.data.ptr, in_t, ldy, m * k,
                                  beta.ctypes.data, out.data.ptr, out_t, n, m * n, nb,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)  # fmt: skip
    blas.setPointerMode(handle, mode)
    return out
