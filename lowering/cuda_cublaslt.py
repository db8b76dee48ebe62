"""GEMMs with fused epilogues through cuBLASLt (`cublasLtMatmul`), by ctypes.

CuPy 14 binds cuBLAS but not cuBLASLt (cupy_backends.cuda.libs has no cublasLt), so
this module loads libcublasLt itself, lazily, the first time a plan with an epilogue
runs on a GPU: `FFLOW_CUBLASLT_LIB` if set, then the soname (already loaded as a
dependency of the libcublas CuPy uses), then the folder of any libcublas mapped into
the process, the `nvidia/cu13/lib` / `nvidia/cublas/lib` wheel folders and
`$CUDA_PATH/lib64`. `FFLOW_CUBLASLT=0` turns it off.

One call computes D = act(op(A) op(B) + bias) with bf16 / fp16 / f32 operands, fp32
compute and scale (CUBLAS_COMPUTE_32F), the bias broadcast along the output's last
axis (cuBLASLt's rows of the column-major D), epilogue BIAS, RELU_BIAS, GELU_BIAS,
GELU_AUX[_BIAS] (also writes the pre-activation for a backward) or RELU / GELU without a
bias; for a ReLU training step RELU_AUX[_BIAS] (also writes relu's bit mask) and, in the
backward GEMM, DRELU[_BGRAD] (applies the mask, and writes the bias gradient, the sum of
the result over the rows). Operand packing is cuda_gemm's: the row-major C = A @ B is
the column-major Cᵀ = Bᵀ Aᵀ, so cuBLASLt's A is fflow's right operand and the bias has
cuBLASLt's m rows.

When the library is missing or its heuristic has no algorithm for a layout,
`matmul` raises `LtUnavailable` and the plan runs the plain GEMM and the fused
epilogue kernel instead (cuda_backend; the plan text says which path was taken).

Example (on a GPU; the launch plan shows `GEMM+bias+gelu (cuBLASLt epilogue ...)`):
    >>> import fflow, fflow.numpy as jnp                                 # doctest: +SKIP
    >>> f = fflow.jit(lambda x, w, b: fflow.nn.gelu(x @ w + b))          # doctest: +SKIP
"""

import ctypes
import glob
import os

import numpy as np
from fflow.lowering import cuda_gemm, cuda_layout, nvrtc

# cublasLtMatmulDescAttributes_t, cublasLtMatrixLayoutAttribute_t, preferences (cublasLt.h)
DESC_TRANSA, DESC_TRANSB, DESC_EPILOGUE, DESC_BIAS_POINTER = 3, 4, 7, 8
DESC_BIAS_BATCH_STRIDE, DESC_AUX_POINTER, DESC_AUX_LD, DESC_AUX_BATCH_STRIDE = 10, 11, 12, 13
DESC_BIAS_DATA_TYPE = 26
LAYOUT_BATCH_COUNT, LAYOUT_STRIDED_BATCH_OFFSET = 5, 6
PREF_MAX_WORKSPACE_BYTES = 1
PREF_MIN_ALIGNMENT = {"A": 5, "B": 6, "C": 7, "D": 8}
EPILOGUES = {"": 1, "RELU": 2, "BIAS": 4, "RELU_BIAS": 6, "GELU": 32, "GELU_BIAS": 36,
             "GELU_AUX": 160, "GELU_AUX_BIAS": 164, "RELU_AUX": 130, "RELU_AUX_BIAS": 134,
             "DRELU": 136, "DRELU_BGRAD": 152}  # fmt: skip
CUBLAS_COMPUTE_32F, CUDA_R_32F = 68, 0
WORKSPACE = 32 << 20  # bytes; NVIDIA's recommendation for Hopper

_state = {"lib": None, "error": None}
_handles, _workspaces, _plans = {}, {}, {}


class LtUnavailable(RuntimeError):
    """cuBLASLt is not loaded here, or it has no algorithm for this GEMM and epilogue."""


class _Heuristic(ctypes.Structure):
    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspaceSize", ctypes.c_size_t),
                ("state", ctypes.c_int), ("wavesCount", ctypes.c_float),
                ("reserved", ctypes.c_int * 4)]  # fmt: skip


def _candidate_paths():
    env = os.environ.get("FFLOW_CUBLASLT_LIB")
    if env:
        yield env
    yield "libcublasLt.so.13"  # loaded by libcublas already: dlopen returns it
    folders = []
    try:
        with open("/proc/self/maps") as f:
            folders += [os.path.dirname(ln.split()[-1]) for ln in f if "libcublas" in ln]
    except OSError:
        pass
    for root in nvrtc.site_roots():
        folders += [os.path.join(root, "nvidia", sub, "lib") for sub in ("cu13", "cublas")]
    cuda = os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    folders += [os.path.join(cuda, "lib64"), os.path.join(cuda, "lib")]
    for folder in dict.fromkeys(folders):
        yield from sorted(glob.glob(os.path.join(folder, "libcublasLt.so*")), reverse=True)
    yield "libcublasLt.so.12"
    yield "libcublasLt.so"


def _open_library():
    tried = []
    for path in _candidate_paths():
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path}: {e}")
            continue
        _declare(lib)
        return lib
    raise LtUnavailable("libcublasLt not found (tried " + "; ".join(tried[:4]) + ")")


def _declare(lib):
    p, i32, u64, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_int64
    sz = ctypes.c_size_t
    sigs = {
        "cublasLtCreate": [p],
        "cublasLtMatmulDescCreate": [p, i32, i32],
        "cublasLtMatmulDescSetAttribute": [p, i32, p, sz],
        "cublasLtMatrixLayoutCreate": [p, i32, u64, u64, i64],
        "cublasLtMatrixLayoutSetAttribute": [p, i32, p, sz],
        "cublasLtMatmulPreferenceCreate": [p],
        "cublasLtMatmulPreferenceSetAttribute": [p, i32, p, sz],
        "cublasLtMatmulAlgoGetHeuristic": [p, p, p, p, p, p, p, i32, p, p],
        "cublasLtMatmul": [p, p, p, p, p, p, p, p, p, p, p, p, p, p, sz, p],
    }
    for name, args in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, ctypes.c_int


def enabled():
    """False when `FFLOW_CUBLASLT=0`: plans keep the epilogue as the GEMM's next kernel."""
    return os.environ.get("FFLOW_CUBLASLT", "1") not in ("0", "false", "False")


def library():
    """The loaded cuBLASLt (ctypes), loaded on first use; raises LtUnavailable."""
    if _state["lib"] is None and _state["error"] is None:
        if not enabled():
            _state["error"] = "FFLOW_CUBLASLT=0"
        else:
            try:
                _state["lib"] = _open_library()
            except LtUnavailable as e:
                _state["error"] = str(e)
    if _state["lib"] is None:
        raise LtUnavailable(_state["error"])
    return _state["lib"]


def _check(status, what):
    if status != 0:
        raise LtUnavailable(f"{what} returned cuBLAS status {status}")


def _set(fn, obj, attr, value, ctype):
    buf = ctype(value)
    _check(fn(obj, attr, ctypes.addressof(buf), ctypes.sizeof(buf)), fn.__name__)


def _new(fn, *args):
    out = ctypes.c_void_p()
    _check(fn(ctypes.addressof(out), *args), fn.__name__)
    return out.value


def _layout(lib, dtype, rows, cols, ld, nb, stride):
    lay = _new(lib.cublasLtMatrixLayoutCreate, dtype, rows, cols, ld)
    if nb > 1:
        _set(lib.cublasLtMatrixLayoutSetAttribute, lay, LAYOUT_BATCH_COUNT, nb, ctypes.c_int32)
        _set(lib.cublasLtMatrixLayoutSetAttribute, lay, LAYOUT_STRIDED_BATCH_OFFSET, stride,
             ctypes.c_int64)  # fmt: skip
    return lay


def _align(ptr):
    return 256 if ptr % 256 == 0 else ptr & -ptr


def matmul(cp, epi, lhs, rhs, bias, empty, mask=None):
    """Run the Epilogue `epi` (cuda_layout.Epilogue) on CuPy arrays: returns {Var: array}
    with its output (and the pre-activation aux, relu's bit mask for the backward, the
    bias gradient); `mask` is the bit mask a DRELU step reads. Raises LtUnavailable."""
    lib = library()
    eqn = epi.dot
    nb, m, n, k, lt, rt, (lperm, rperm) = cuda_gemm.dims(eqn)
    out = empty(epi.out.aval)
    aux = empty(epi.aux.aval) if epi.aux is not None else None
    if epi.mask is not None:  # relu's bit mask: written by RELU_AUX, read by DRELU
        aux = empty(epi.mask.aval) if epi.act == "relu" else mask
    if epi.bgrad is not None:  # DRELU_BGRAD writes the bias gradient at the bias pointer
        bias = empty(epi.bgrad.aval)
    if out.size == 0 or k == 0:
        raise LtUnavailable("an empty GEMM")
    lhs, rhs = cp.ascontiguousarray(lhs), cp.ascontiguousarray(rhs)
    if lt == "copy":  # a layout cuBLASLt cannot stride over: one copy in the operand's type
        lhs, lt = cp.ascontiguousarray(cp.transpose(lhs, lperm)), "N"
    if rt == "copy":
        rhs, rt = cp.ascontiguousarray(cp.transpose(rhs, rperm)), "N"
    in_t = cuda_gemm._TYPES[np.dtype(eqn.inputs[0].aval.dtype).name]
    out_t = cuda_gemm._TYPES[np.dtype(epi.out.aval.dtype).name]
    ptrs = {"A": rhs.data.ptr, "B": lhs.data.ptr, "C": out.data.ptr, "D": out.data.ptr}
    align = tuple(_align(p) for p in ptrs.values())
    if bias is not None:
        bias = cp.ascontiguousarray(bias)
        align += (_align(bias.data.ptr),)
    if aux is not None:
        align += (_align(aux.data.ptr),)
    dev = cp.cuda.Device().id
    aux_ld = (cuda_layout.mask_ld(epi.out.aval), True) if epi.mask is not None else (n, False)
    bias_t = out_t  # a bias (gradient) has its own type (fp32 beside a bf16 D: amp)
    for v in (epi.bias, epi.bgrad):
        if v is not None:
            bias_t = cuda_gemm._TYPES[np.dtype(v.aval.dtype).name]
    key = (dev, nb, m, n, k, lt, rt, in_t, out_t, epi.name, align, aux_ld, bias_t)
    plan = _plans.get(key)
    if plan is None:
        plan = _plans[key] = _make_plan(cp, lib, key, bias, aux)
    if isinstance(plan, LtUnavailable):
        raise plan
    desc, la, lb, ld, heur = plan
    if bias is not None:
        _set(lib.cublasLtMatmulDescSetAttribute, desc, DESC_BIAS_POINTER, bias.data.ptr,
             ctypes.c_void_p)  # fmt: skip
    if aux is not None:
        _set(lib.cublasLtMatmulDescSetAttribute, desc, DESC_AUX_POINTER, aux.data.ptr,
             ctypes.c_void_p)  # fmt: skip
    alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
    ws = _workspaces[dev]
    stream = cp.cuda.get_current_stream().ptr
    _check(lib.cublasLtMatmul(_handles[dev], desc, ctypes.addressof(alpha), ptrs["A"], la,
                              ptrs["B"], lb, ctypes.addressof(beta), ptrs["C"], ld, ptrs["D"], ld,
                              ctypes.addressof(heur.algo), ws.data.ptr, WORKSPACE, stream),
           "cublasLtMatmul")  # fmt: skip
    outs = {epi.out: out}
    if epi.aux is not None:
        outs[epi.aux] = aux
    if epi.mask is not None and epi.act == "relu":
        outs[epi.mask] = aux
    if epi.bgrad is not None:
        outs[epi.bgrad] = bias
    return outs


def _make_plan(cp, lib, key, bias, aux):
    """Descriptors and the heuristic's algorithm for one GEMM shape (cached): or the
    LtUnavailable that says why cuBLASLt refused it (also cached)."""
    dev, nb, m, n, k, lt, rt, in_t, out_t, name, align, (aux_ld, bits), bias_t = key
    if dev not in _handles:
        _handles[dev] = _new(lib.cublasLtCreate)
        _workspaces[dev] = cp.empty(WORKSPACE, cp.uint8)
    sd = lib.cublasLtMatmulDescSetAttribute
    desc = _new(lib.cublasLtMatmulDescCreate, CUBLAS_COMPUTE_32F, CUDA_R_32F)
    op_a, op_b = int(rt == "T"), int(lt == "T")  # CUBLAS_OP_N = 0, CUBLAS_OP_T = 1
    _set(sd, desc, DESC_TRANSA, op_a, ctypes.c_int32)
    _set(sd, desc, DESC_TRANSB, op_b, ctypes.c_int32)
    _set(sd, desc, DESC_EPILOGUE, EPILOGUES[name], ctypes.c_uint32)
    if bias is not None:
        _set(sd, desc, DESC_BIAS_POINTER, bias.data.ptr, ctypes.c_void_p)
        _set(sd, desc, DESC_BIAS_DATA_TYPE, bias_t, ctypes.c_int32)
        _set(sd, desc, DESC_BIAS_BATCH_STRIDE, 0, ctypes.c_int64)  # one bias for all batches
    if aux is not None:  # the pre-activation, [m, n] row-major = column-major [n, m], ld n;
        # or relu's bit mask, ld in bits (n rounded up to 128)
        _set(sd, desc, DESC_AUX_POINTER, aux.data.ptr, ctypes.c_void_p)
        _set(sd, desc, DESC_AUX_LD, aux_ld, ctypes.c_int64)
        _set(sd, desc, DESC_AUX_BATCH_STRIDE, aux_ld * m, ctypes.c_int64)
    # column-major D[n, m] = op(A) op(B): A is fflow's rhs ([k, n] row-major), B its lhs
    la = _layout(lib, in_t, *((n, k, n) if op_a == 0 else (k, n, k)), nb, n * k)
    lb = _layout(lib, in_t, *((k, m, k) if op_b == 0 else (m, k, m)), nb, k * m)
    ld = _layout(lib, out_t, n, m, n, nb, n * m)
    pref = _new(lib.cublasLtMatmulPreferenceCreate)
    sp = lib.cublasLtMatmulPreferenceSetAttribute
    _set(sp, pref, PREF_MAX_WORKSPACE_BYTES, WORKSPACE, ctypes.c_uint64)
    for which, a in zip("ABCD", align):
        _set(sp, pref, PREF_MIN_ALIGNMENT[which], a, ctypes.c_uint32)
    heur, count = _Heuristic(), ctypes.c_int(0)
    status = lib.cublasLtMatmulAlgoGetHeuristic(
        _handles[dev], desc, la, lb, ld, ld, pref, 1, ctypes.addressof(heur),
        ctypes.addressof(count))  # fmt: skip
    if status != 0 or count.value < 1:
        return LtUnavailable(f"cuBLASLt has no {name} algorithm for this layout (status "
                             f"{status}, m={m} n={n} k={k} batch={nb})")  # fmt: skip
    return desc, la, lb, ld, heur


def status():
    """One line: is cuBLASLt loaded, and if not, why (for the plan text and gpu_check)."""
    try:
        library()
    except LtUnavailable as e:
        return f"cuBLASLt unavailable: {e}"
    return f"cuBLASLt loaded ({len(_plans)} GEMM shapes planned)"
