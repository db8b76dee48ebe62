"""A stand-in for libcublasLt (installed by fake_cupy.install), so the tests drive
lowering/cuda_cublaslt.py's ctypes calls for real: every argument arrives as it would
at the C library (addresses of attribute buffers, handles, raw device pointers) and is
checked against cuBLASLt's documented rules (attribute sizes, layouts that fit the
transposes and D, bias / aux pointers the epilogue needs), and cublasLtMatmul computes
with NumPy what the documentation says the epilogue computes: column-major
D = act(alpha · op(A) op(B) + beta · C + bias[row]) with fp32 accumulation, the bias
broadcast over D's columns, GELU the tanh approximation, GELU_AUX_BIAS also writing
the pre-activation to the aux matrix (leading dimension AUX_LD).
"""

import ctypes
import math

import fake_cupy
import ml_dtypes
import numpy as np

CALLS = []  # one dict per cublasLtMatmul: epilogue, m, n, k, transa, transb, batch, types
REFUSE = set()  # epilogue values whose heuristic finds no algorithm (as for a bad layout)
INVALID = 7  # CUBLAS_STATUS_INVALID_VALUE
NAMES = {1: "DEFAULT", 2: "RELU", 4: "BIAS", 6: "RELU_BIAS", 32: "GELU", 36: "GELU_BIAS",
         160: "GELU_AUX", 164: "GELU_AUX_BIAS", 130: "RELU_AUX", 134: "RELU_AUX_BIAS",
         136: "DRELU", 152: "DRELU_BGRAD"}  # fmt: skip
# attribute id -> ctypes type (cublasLt.h): desc, layout, preference
DESC = {0: ctypes.c_int32, 1: ctypes.c_int32, 3: ctypes.c_int32, 4: ctypes.c_int32,
        7: ctypes.c_uint32, 8: ctypes.c_void_p, 10: ctypes.c_int64, 11: ctypes.c_void_p,
        12: ctypes.c_int64, 13: ctypes.c_int64, 26: ctypes.c_int32}  # fmt: skip
LAYOUT = {5: ctypes.c_int32, 6: ctypes.c_int64}
PREF = {1: ctypes.c_uint64, 5: ctypes.c_uint32, 6: ctypes.c_uint32, 7: ctypes.c_uint32,
        8: ctypes.c_uint32}  # fmt: skip
_objects = {}


def _new(out_ptr, obj):
    h = 0x1000 + len(_objects)
    _objects[h] = obj
    ctypes.c_void_p.from_address(out_ptr).value = h
    return 0


def _set(kind, table, obj, attr, buf, size):
    ctype = table.get(attr)
    if ctype is None or size != ctypes.sizeof(ctype):
        return INVALID  # an unknown attribute, or a buffer of the wrong size
    _objects[obj]["attrs"][attr] = ctype.from_address(buf).value
    return 0


class FakeLt:
    def cublasLtCreate(self, out):  # noqa: N802
        return _new(out, {"kind": "handle"})

    def cublasLtMatmulDescCreate(self, out, compute, scale):  # noqa: N802
        if compute != 68 or scale != 0:
            return INVALID  # fp32 compute (CUBLAS_COMPUTE_32F) and scale (CUDA_R_32F) only
        return _new(out, {"kind": "desc", "attrs": {}})

    def cublasLtMatmulDescSetAttribute(self, d, attr, buf, size):  # noqa: N802
        return _set("desc", DESC, d, attr, buf, size)

    def cublasLtMatrixLayoutCreate(self, out, dtype, rows, cols, ld):  # noqa: N802
        if dtype not in fake_cupy._CUDA_TYPES or ld < max(1, rows):
            return INVALID
        return _new(out, {"kind": "layout", "type": dtype, "rows": rows, "cols": cols,
                          "ld": ld, "attrs": {}})  # fmt: skip

    def cublasLtMatrixLayoutSetAttribute(self, lay, attr, buf, size):  # noqa: N802
        return _set("layout", LAYOUT, lay, attr, buf, size)

    def cublasLtMatmulPreferenceCreate(self, out):  # noqa: N802
        return _new(out, {"kind": "pref", "attrs": {}})

    def cublasLtMatmulPreferenceSetAttribute(self, p, attr, buf, size):  # noqa: N802
        return _set("pref", PREF, p, attr, buf, size)

    def cublasLtMatmulAlgoGetHeuristic(self, h, d, a, b, c, dd, p, n, results, count):  # noqa: N802
        fake_cupy._use("ltHeuristic")
        problem = _problem(d, a, b, c, dd)
        ok = problem is not None and _objects[d]["attrs"].get(7, 1) not in REFUSE
        ctypes.c_int.from_address(count).value = int(ok)
        if ok:  # state (after algo[64] and workspaceSize) = CUBLAS_STATUS_SUCCESS
            ctypes.c_size_t.from_address(results + 64).value = 0
            ctypes.c_int.from_address(results + 72).value = 0
        return 0 if problem is not None else INVALID

    def cublasLtMatmul(self, h, d, alpha, a, ad, b, bd, beta, c, cd, dptr, ddesc, algo, ws,  # noqa: N802
                       wsize, stream):  # fmt: skip
        fake_cupy._use("ltMatmul")
        problem = _problem(d, ad, bd, cd, ddesc)
        if problem is None or not algo or c != dptr:
            return INVALID
        al, be = (ctypes.c_float.from_address(x).value for x in (alpha, beta))
        attrs = dict(_objects[d]["attrs"])
        CALLS.append(dict(problem, epilogue=NAMES.get(attrs.get(7, 1)), alpha=al, beta=be))
        fake_cupy._enqueue(lambda: _run(problem, attrs, al, be, a, b, dptr))
        return 0


def _problem(d, a, b, c, dd):
    """The GEMM the descriptors describe, or None if they do not fit together."""
    desc, A, B, C, D = (_objects.get(x) for x in (d, a, b, c, dd))
    if (
        None in (desc, A, B, C, D)
        or C is not D
        and (C["rows"], C["cols"]) != (D["rows"], D["cols"])
    ):
        return None
    ta, tb = desc["attrs"].get(3, 0), desc["attrs"].get(4, 0)
    ar, ac = (A["rows"], A["cols"]) if ta == 0 else (A["cols"], A["rows"])
    br, bc = (B["rows"], B["cols"]) if tb == 0 else (B["cols"], B["rows"])
    m, n = D["rows"], D["cols"]
    if ar != m or bc != n or ac != br or A["type"] != B["type"]:
        return None
    batch = {x["attrs"].get(5, 1) for x in (A, B, D)}
    if len(batch) != 1:
        return None
    epi = desc["attrs"].get(7, 1)
    if epi not in NAMES:
        return None
    if epi & (4 | 16) and not desc["attrs"].get(8):
        return None  # a BIAS or BGRAD epilogue without a bias pointer
    if epi & 128:  # aux: pointer, ld >= rows, divisible by 8 (GELU) or 128 bits (ReLU mask)
        ld = desc["attrs"].get(12, 0)
        if not desc["attrs"].get(11) or ld < m or ld % (128 if epi & (2 | 8) else 8):
            return None
    return dict(m=m, n=n, k=ac, transa=ta, transb=tb, batch=batch.pop(), A=A, B=B, D=D,
                atype=A["type"], dtype=D["type"])  # fmt: skip


def _load(ptr, lay, rows, cols):
    batch = lay["attrs"].get(5, 1)
    stride = lay["attrs"].get(6, 0)
    mat = fake_cupy._matrix(ptr, lay["type"], rows, cols, lay["ld"], stride, batch)
    return fake_cupy._to_f32(mat, lay["type"]).astype(np.float64)


def _store(x, ptr, t, rows, cols, ld, stride, batch):
    dst = fake_cupy._matrix(ptr, t, rows, cols, ld, stride, batch)
    if fake_cupy._CUDA_TYPES[t] == "bfloat16":
        dst[...] = x.astype(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
    else:
        dst[...] = x.astype(np.float32).astype(fake_cupy._CUDA_TYPES[t])


def _run(pb, attrs, alpha, beta, a, b, d):
    A, B, D = pb["A"], pb["B"], pb["D"]
    m, n = pb["m"], pb["n"]
    opa = _load(a, A, A["rows"], A["cols"])
    opb = _load(b, B, B["rows"], B["cols"])
    opa = opa if pb["transa"] == 0 else opa.transpose(0, 2, 1)
    opb = opb if pb["transb"] == 0 else opb.transpose(0, 2, 1)
    x = (alpha * np.matmul(opa, opb)).astype(np.float32)  # fp32 accumulation
    if beta:
        x = x + beta * _load(d, D, m, n).astype(np.float32)
    epi = attrs.get(7, 1)
    if epi & 4:  # bias: one value per row of D, the same for every batch (stride 0)
        bt = attrs.get(26, D["type"])
        bias = _load(attrs[8], {"type": bt, "ld": m, "attrs": {}}, m, 1)[0, :, 0]
        x = (x + bias.astype(np.float32)[None, :, None]).astype(np.float32)
    if epi & 128 and epi & 32:  # GELU_AUX: the GELU's input, ld AUX_LD
        _store(x, attrs[11], D["type"], m, n, attrs[12], attrs.get(13, 0), pb["batch"])
    if epi & 128 and epi & (2 | 8):  # ReLU's bit mask: bit row + col * AUX_LD (bits)
        ld, nbytes = attrs[12], attrs[12] // 8 * n * pb["batch"]
        bits = np.frombuffer((ctypes.c_char * nbytes).from_address(attrs[11]), np.uint8)
        if epi & 2:  # RELU_AUX writes it: x > 0
            full = np.zeros((pb["batch"], n, ld), bool)
            full[:, :, :m] = (x > 0).transpose(0, 2, 1)
            bits[...] = np.packbits(full.reshape(-1), bitorder="little")
        else:  # DRELU reads it: the gradient passes where the forward's x > 0
            keep = np.unpackbits(bits, bitorder="little").reshape(pb["batch"], n, ld)
            x = np.where(keep[:, :, :m].transpose(0, 2, 1), x, np.float32(0))
    if epi & 16:  # BGRAD: the sum of D over its columns, at the bias pointer
        bt = attrs.get(26, D["type"])
        _store(x.sum(axis=(0, 2), dtype=np.float64)[None, :, None], attrs[8], bt, m, 1, m, 0, 1)
    if epi & 2:
        x = np.maximum(x, np.float32(0))
    if epi & 32:  # tanh approximation, in fp32
        c = np.float32(math.sqrt(2 / math.pi))
        x = np.float32(0.5) * x * (1 + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))
    _store(x, d, D["type"], m, n, D["ld"], D["attrs"].get(6, 0), pb["batch"])


def install(available=True):
    """Make cuda_cublaslt load this stand-in (or fail to load anything)."""
    from fflow.lowering import cuda_cublaslt

    def open_library():
        if not available:
            raise cuda_cublaslt.LtUnavailable("libcublasLt not found (the test removed it)")
        return FakeLt()

    cuda_cublaslt._open_library = open_library
    cuda_cublaslt._state.update(lib=None, error=None)
    cuda_cublaslt._plans.clear()
    cuda_cublaslt._handles.clear()
    cuda_cublaslt._workspaces.clear()
