"""Native loops for large fused elementwise groups: a C renderer table, gcc, ctypes.

NumPy runs a fused group as one pass over memory per operation and calls scalar
transcendental loops; one C loop per group reads each input once, writes the
output once and vectorizes `tanhf`/`expf`/... through glibc's libmvec. Chosen by
measurement (the elementwise benchmark in docs/benchmarks.md).

NaN/inf semantics are kept: no `-ffast-math` (only `-fno-math-errno`), and max/min
propagate NaN as NumPy does. Results may differ from NumPy's by an ulp in the
transcendental functions; everything else is the same IEEE operation.

Libraries are cached on disk by source hash (`FFLOW_CACHE_DIR`, default
`~/.cache/fflow/native`). Without a C compiler (or with
`fflow.config.update("jit_native", False)`) groups run as chunked NumPy.
"""

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile

import numpy as np
from fflow.primitives import binary as _b
from fflow.primitives import compare as _c
from fflow.primitives import unary as _u
from fflow.primitives.convert import convert_element_type_p
from fflow.primitives.shape import broadcast_in_dim_p
from fflow.primitives.unary import integer_pow_by_squaring

from fflow.config import config
from fflow.core import Literal

NATIVE_MIN_SIZE = 1 << 18  # groups with transcendental ops (below: NumPy's own numbers)
# Pure-arithmetic groups of at least this many elements: one C pass instead of 2-5
# NumPy passes. Measured on the MLP step (128x512 float32): bias + ReLU 50 -> 12 µs,
# the ReLU derivative times the cotangent 160 -> 15 µs.
ARITH_MIN_SIZE = 1 << 14
# Groups with a transcendental op from this size run in chunks (at least
# PARALLEL_GRAIN elements, so a chunk's scratch copy stays in cache) on fflow's thread
# pool (lowering/cpu_gemm.c).
PARALLEL_MIN_SIZE = 1 << 18
# Pure arithmetic from this size too: one core does not fill the memory bandwidth. A
# 5-op group over two float32 inputs, 1 vs 2 threads (quiet-equivalent): 512K elements
# 0.085 vs 0.09 ms, 1M 0.16 vs 0.12, 2M 0.51 vs 0.33, 4M 1.48 vs 0.85.
ARITH_PARALLEL_MIN_SIZE = 1 << 20
PARALLEL_GRAIN = 1 << 14
# chunk starts of flat loops: a multiple of every vector loop's step (16 floats per
# AVX-512 vector, unrolled up to 4 times), so a chunk's tail is the whole loop's tail
VECTOR_ALIGN = 64
CFLAGS = [
    "-O3",
    "-march=native",
    "-fno-math-errno",
    "-ffp-contract=off",  # no FMA contraction: each + and * rounds as in NumPy
    "-fopenmp-simd",
    "-shared",
    "-fPIC",
]
LIBS = ["-lmvec", "-lm"]

_CTYPES = {
    np.dtype(np.float32): "float",
    np.dtype(np.float64): "double",
    np.dtype(bool): "unsigned char",
}
# the C operator of each arithmetic and comparison primitive
_BINARY = {_b.add_p: "+", _b.sub_p: "-", _b.mul_p: "*", _b.div_p: "/"}
_COMPARE = {_c.eq_p: "==", _c.ne_p: "!=", _c.lt_p: "<", _c.le_p: "<=", _c.gt_p: ">", _c.ge_p: ">="}

_compiler = None
_lib_cache = {}


def compiler():
    """The C compiler's path, or None."""
    global _compiler
    if _compiler is None:
        _compiler = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc") or ""
    return _compiler or None


def enabled():
    return bool(config.jit_native) and compiler() is not None


def _fn(name, ctype):
    return name + ("f" if ctype == "float" else "")


def _literal(value, ctype):
    value = float(value)
    if value != value:
        return f"(({ctype})NAN)"
    if value in (float("inf"), float("-inf")):
        return f"(({ctype}){'-' if value < 0 else ''}INFINITY)"
    return value.hex() + ("f" if ctype == "float" else "")


def _render_eqn(e, args, used_math):
    """The C expression of one elementwise equation, or None (not in the table)."""
    prim = e.primitive
    in_t = _CTYPES.get(e.inputs[0].aval.dtype) if e.inputs else None
    out_t = _CTYPES.get(e.outputs[0].aval.dtype)
    if in_t is None or out_t is None:
        return None
    a = args[0]
    if prim in _BINARY and in_t != "unsigned char":
        return f"({a} {_BINARY[prim]} {args[1]})"
    if prim in _COMPARE:
        return f"({a} {_COMPARE[prim]} {args[1]})"
    if in_t == "unsigned char" and prim not in (_c.select_n_p, convert_element_type_p):
        return None
    c_math = prim.c_math  # declared on the primitive (primitives/unary.py)
    if c_math is not None:
        used_math.add((c_math, in_t, 1))
        return f"{_fn(c_math, in_t)}({a})"
    if prim is _u.neg_p:
        return f"(-{a})"
    if prim is _u.square_p:
        return f"({a} * {a})"
    if prim is _u.rsqrt_p:
        used_math.add(("sqrt", in_t, 1))
        return f"(({in_t})1 / {_fn('sqrt', in_t)}({a}))"
    if prim is _u.logistic_p:
        used_math.add(("exp", in_t, 1))
        return f"(({in_t})1 / (({in_t})1 + {_fn('exp', in_t)}(-{a})))"
    if prim is _b.max_p:
        return f"(({a} > {args[1]} || {a} != {a}) ? {a} : {args[1]})"
    if prim is _b.min_p:
        return f"(({a} < {args[1]} || {a} != {a}) ? {a} : {args[1]})"
    if prim in (_b.pow_p, _b.atan2_p):  # libm's pow and atan2
        used_math.add((prim.name, in_t, 2))
        return f"{_fn(prim.name, in_t)}({a}, {args[1]})"
    if prim is _u.sign_p:
        return f"({a} != {a} ? {a} : ({in_t})(({a} > 0) - ({a} < 0)))"
    if prim is _u.integer_pow_p:
        y = e.params["y"]
        if y == 0:
            return f"(({in_t})1)"
        expr = integer_pow_by_squaring(a, abs(y), lambda p, q: f"({p} * {q})")
        return expr if y > 0 else f"(({in_t})1 / {expr})"
    if prim is _c.select_n_p:
        if len(e.inputs) != 3 or e.inputs[0].aval.dtype != np.dtype(bool):
            return None
        return f"({a} ? {args[2]} : {args[1]})"
    if prim is convert_element_type_p:
        if out_t == "unsigned char":
            return f"({a} != 0)"
        return f"(({out_t}){a})"
    return None


def worth_native(group):
    """Whether a fused group runs faster as one C loop than as NumPy calls (measured).

    Groups with a transcendental op pay from `NATIVE_MIN_SIZE` elements (their
    results may differ from NumPy's by an ulp, so small groups keep NumPy's numbers);
    pure IEEE arithmetic (bit-identical to NumPy) pays from `ARITH_MIN_SIZE`, where
    one pass replaces several (bias + ReLU, the ReLU derivative, SGD updates).
    """
    if group.outputs[0].aval.dtype not in _CTYPES or len(group.eqns) < 2:
        return False
    if any("transcendental" in e.primitive.traits for e in group.eqns):
        return group.size >= NATIVE_MIN_SIZE and len(group.eqns) >= 3
    return group.size >= ARITH_MIN_SIZE


def broadcast_source(eqn, shape):
    """For a broadcast_in_dim `eqn` feeding a group of `shape`: ("row", u, C) when u
    fills the trailing dims (index c of a rows x C loop), ("col", u, R) when u fills
    the leading ones (index r), else None."""
    if eqn is None or eqn.primitive is not broadcast_in_dim_p:
        return None
    (u,) = eqn.inputs
    if type(u) is Literal or tuple(eqn.params["shape"]) != tuple(shape):
        return None
    dims = tuple(eqn.params["broadcast_dimensions"])
    n, k = len(shape), u.aval.ndim
    if k and dims == tuple(range(n - k, n)) and tuple(u.aval.shape) == tuple(shape[n - k :]):
        return "row", u, int(np.prod(shape[n - k :], dtype=np.int64))
    if k and dims == tuple(range(k)):
        p = k
        while p and u.aval.shape[p - 1] == 1:
            p -= 1
        if p < n and tuple(u.aval.shape[:p]) == tuple(shape[:p]):
            return "col", u, int(np.prod(shape[:p], dtype=np.int64))
    return None


def scalar_source(eqn):
    """The 0-d value a broadcast_in_dim `eqn` fills an array with (a traced learning
    rate, Adam's `1 - b**t`), or None. Native groups and GEMM epilogues read it once."""
    if eqn is None or eqn.primitive is not broadcast_in_dim_p:
        return None
    return eqn.inputs[0] if eqn.inputs[0].aval.shape == () else None


def render_group(group, scalars, bcast=None, fname="fflow_group", splats=None):
    """C source for a group.

    `scalars` are splat constants (passed at run time, so a new learning rate is the
    same library); `bcast` maps inputs that are broadcasts to `broadcast_source`'s
    answer; `splats` maps inputs that are broadcasts of a 0-d value computed in the
    program (Adam's `1 - b**t`, a learning-rate schedule's value) to that value, read
    once before the loop like a 0-d input. Returns (source, array_inputs,
    runtime_scalars, units) where array_inputs hold the broadcasts' sources and
    `units` is the extent of the chunk loop `fname_range` (rows with broadcasts, else
    elements), or None when a member has no row.
    """
    bcast = bcast or {}
    splats = splats or {}
    out = group.outputs[0]
    if out.aval.dtype not in _CTYPES:
        return None
    rows, cols = None, None
    for kind, _, extent in bcast.values():
        if kind == "row":
            if cols not in (None, extent):
                return None
            cols = extent
        else:
            if rows not in (None, extent):
                return None
            rows = extent
    if bcast:
        rows = rows or group.size // cols
        cols = cols or group.size // rows
        if rows * cols != group.size:
            return None
    names = {}
    arrays, runtime = [], []
    body = []
    for v in group.inputs:
        ct = _CTYPES.get(v.aval.dtype)
        if ct is None:
            return None
        if v in scalars or v.aval.shape == () or v in splats:
            names[v] = f"c{len(runtime)}"  # loaded once, before the loop
            runtime.append(splats.get(v, v))
        elif v in bcast:
            kind, u, _ = bcast[v]
            if _CTYPES.get(u.aval.dtype) != ct:
                return None
            names[v] = f"x{len(arrays)}[{'c' if kind == 'row' else 'r'}]"
            arrays.append(u)
        elif v.aval.shape == group.shape:
            names[v] = f"x{len(arrays)}[i]"
            arrays.append(v)
        else:
            return None
    used_math = set()
    for k, e in enumerate(group.eqns):
        args = []
        for v in e.inputs:
            if type(v) is Literal:
                ct = _CTYPES.get(v.aval.dtype)
                if ct is None:
                    return None
                args.append(_literal(np.asarray(v.value, v.aval.dtype), ct))
            else:
                args.append(names[v])
        expr = _render_eqn(e, args, used_math)
        if expr is None:
            return None
        t = _CTYPES[e.outputs[0].aval.dtype]
        body.append(f"{t} t{k} = {expr};")
        names[e.outputs[0]] = f"t{k}"
    last = f"t{len(group.eqns) - 1}"
    decls = [
        f"#pragma omp declare simd notinbranch\n{t} {_fn(n, t)}({', '.join([t] * arity)});"
        for n, t, arity in sorted(used_math)
    ]
    # no `restrict`: the output may be an input's buffer (same index read, then written)
    types = [_CTYPES[v.aval.dtype] for v in arrays] + [_CTYPES[v.aval.dtype] for v in runtime]
    names_c = [f"x{k}" for k in range(len(arrays))] + [f"s{k}" for k in range(len(runtime))]
    params = [f"const {t}* {n}" for t, n in zip(types, names_c)]
    out_t = _CTYPES[out.aval.dtype]
    hoist = "".join(
        f"  const {_CTYPES[v.aval.dtype]} c{k} = s{k}[0];\n" for k, v in enumerate(runtime)
    )
    # the loop over indices s..e (rows when inputs broadcast), writing out[0..]: the
    # thread pool runs it per chunk (`fname_range`), the plain call over everything
    if bcast:
        loop = (
            f"  for (long r = s; r < e; r++) {{\n    #pragma omp simd\n"
            f"    for (long c = 0; c < {cols}L; c++) {{\n      long i = r * {cols}L + c;\n"
            + "\n".join("      " + line for line in body)
            + f"\n      out[(r - s) * {cols}L + c] = {last};\n    }}\n  }}\n"
        )
        units = rows
    else:
        loop = (
            "  #pragma omp simd\n  for (long i = s; i < e; i++) {\n"
            + "\n".join("    " + line for line in body)
            + f"\n    out[i - s] = {last};\n  }}\n"
        )
        units = None
    casts = ", ".join(f"(const {t}*)a[{k}]" for k, t in enumerate(types))
    run_params = ", ".join(params + [f"{out_t}* out", "long s", "long e"])
    run_all = ", ".join(names_c + ["out", "0", f"{units}L" if units else "n"])
    src = (
        "#include <math.h>\n"
        + "".join(d + "\n" for d in decls)
        + f"static void {fname}_run({run_params}) {{\n"
        + hoist
        + loop
        + "}\n"
        + f"void {fname}({', '.join(params + [f'{out_t}* out', 'long n'])}) {{\n"
        + f"  {fname}_run({run_all});\n}}\n"
        + f"void {fname}_range(long *a, char *o, long s, long e) {{\n"
        + f"  {fname}_run({casts + ', ' if casts else ''}({out_t}*)o, s, e);\n}}\n"
    )
    return src, arrays, runtime, units or group.size


def cache_dir():
    d = os.environ.get("FFLOW_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "fflow", "native"
    )
    os.makedirs(d, exist_ok=True)
    return d


def load_library(source):
    """Compile (or find on disk) the shared library of C `source`; a CDLL, or None."""
    key = hashlib.sha256((source + " ".join(CFLAGS + LIBS)).encode()).hexdigest()[:24]
    lib = _lib_cache.get(key)
    if lib is not None:
        return lib
    path = os.path.join(cache_dir(), f"fflow_{key}.so")
    if not os.path.exists(path):
        with tempfile.TemporaryDirectory() as tmp:
            c_file = os.path.join(tmp, "group.c")
            with open(c_file, "w") as f:
                f.write(source)
            so = os.path.join(tmp, "group.so")
            proc = subprocess.run(
                [compiler(), *CFLAGS, c_file, "-o", so, *LIBS], capture_output=True, text=True
            )
            if proc.returncode != 0:
                return None
            os.replace(so, path) if _same_fs(tmp, path) else shutil.move(so, path)
    lib = ctypes.CDLL(path)
    _lib_cache[key] = lib
    return lib


def load(source, name="fflow_group"):
    """The function `name` of the library compiled from `source`, or None."""
    lib = load_library(source)
    if lib is None:
        return None
    fn = getattr(lib, name)
    fn.restype = None
    return fn


def _same_fs(a, b):
    try:
        return os.stat(a).st_dev == os.stat(os.path.dirname(b)).st_dev
    except OSError:
        return False


_from_buffer, _addressof = ctypes.c_char.from_buffer, ctypes.addressof


def address(x):
    """The address of `x`'s first element, as `x.ctypes.data`, which builds a ctypes
    helper object (~0.95 us of thread time here; ~30 pointers per MLP step). For a
    C-contiguous writable array ctypes' view of its buffer gives it in ~0.26 us;
    anything else takes `x.ctypes.data`."""
    try:
        return _addressof(_from_buffer(x))
    except (TypeError, ValueError, BufferError):
        return x.ctypes.data


def _contiguous(x, dtype):
    if type(x) is not np.ndarray or not x.flags.c_contiguous or x.dtype != dtype:
        return np.ascontiguousarray(x, dtype=dtype)
    return x


def _producers(ctx):
    prod = getattr(ctx, "_producers", None)
    if prod is None:
        prod = {}
        for step in ctx.steps:
            for e in getattr(step, "eqns", None) or [step]:
                for o in e.outputs:
                    prod[o] = e
        ctx._producers = prod
    return prod


def emit_native_group(ctx, group, i):
    """Emit a call of the group's native loop into the kernel being generated.

    The loop is one function of the program's library, compiled by `build_library`
    once every group of the program is rendered (one gcc run per program).
    """
    scalars = {v for v in group.inputs if v in ctx.splat}
    prod = _producers(ctx)
    bcast, splats = {}, {}
    for v in group.inputs:
        if v not in scalars and v.aval.shape != () and v.aval.shape == group.shape:
            u = scalar_source(prod.get(v))
            if u is not None and type(u) is not Literal:  # read once, not a full copy
                splats[v] = u
                continue
            src = broadcast_source(prod.get(v), group.shape)
            if src is not None:
                bcast[v] = src
    fname = f"fflow_group_{len(ctx.native_pending)}"
    rendered = render_group(group, scalars, bcast, fname, splats)
    if rendered is None:
        return False
    source, arrays, runtime, units = rendered
    root = group.outputs[0]
    out = ctx.name(root)
    sources = {b[1] for b in bcast.values()}  # read at other indices: never overwritten
    full = [v for v in arrays if v.aval.shape == group.shape and v not in sources]
    target = ctx.inplace_target(i, root, full)
    dt = ctx.const(root.aval.dtype, "dt")
    if target is not None and target[1] is None:
        ctx.emit(f"{out} = _contig({target[0]}, {dt})")
    else:
        alloc = f"np.empty({group.shape}, {dt})"
        if target is not None:
            alloc = f"{target[0]} if {target[1]} else {alloc}"
        ctx.emit(f"{out} = {alloc}")
    ctx.globals["_contig"] = _contiguous
    kernel = f"native_{fname}"
    ptrs, keep = [], []
    for v in arrays:
        n = f"{ctx.name(v)}_c"
        ctx.emit(f"{n} = _contig({ctx.name(v)}, {ctx.const(v.aval.dtype, 'dt')})")
        ptrs.append(f"_ad({n})")
        keep.append(n)
    for v in runtime:
        if v in scalars:
            # a constant: one buffer for the kernel's life, its address a literal
            buf = np.array([ctx.globals[ctx.splat[v]]], dtype=v.aval.dtype)
            ctx.const(buf, "sbuf")
            ptrs.append(str(buf.ctypes.data))
        else:
            n = f"{ctx.name(v)}_c"
            ctx.emit(f"{n} = _contig({ctx.name(v)}, {ctx.const(v.aval.dtype, 'dt')})")
            ptrs.append(f"_ad({n})")
            keep.append(n)
    ctx.globals["_ad"] = address
    call = f"{kernel}({', '.join(ptrs + [f'_ad({out})', str(group.size)])})"
    transcendental = any("transcendental" in e.primitive.traits for e in group.eqns)
    if group.size >= (PARALLEL_MIN_SIZE if transcendental else ARITH_PARALLEL_MIN_SIZE):
        # chunks on fflow's thread pool (the step's thread count `_nt`; `_par` is
        # lowering/cpu_gemm.parallel, installed by the NumPy backend)
        ctx.gemm_pool = True
        unit = group.size // units * root.aval.dtype.itemsize
        grain = max(1, PARALLEL_GRAIN // (group.size // units))
        # chunks of a flat loop start at multiples of VECTOR_ALIGN elements: each
        # element meets the same vector code (libmvec's or the scalar tail's) on any
        # thread count; rows of a broadcast loop do already
        align = VECTOR_ALIGN if units == group.size else 1
        ctx.emit(
            f"if _nt < 2 or not _par({kernel}_range, {_tuple(ptrs)}, _ad({out}), "
            f"{units}, {unit}, {grain}, _nt, {_tuple(keep)}, {align}):"
        )
        ctx.emit(call, indent=2)
        ctx.native_pending.append((fname + "_range", kernel + "_range", None, None))
    else:
        ctx.emit(call)
    ctx.fresh.add(root)
    ctx.native_pending.append((fname, kernel, source, len(ptrs) + 1))
    ctx.native_sources.append(source)
    return True


def program_source(pending):
    """One C source for the native loops `pending` ((name, global, source, args) each):
    the declarations of every source once, then every function."""
    head, bodies = ["#include <math.h>"], []
    for _, _, source, _ in pending:
        if source is None:  # the chunk entry of a group rendered with it
            continue
        lines = source.split("\n")
        start = next(k for k, line in enumerate(lines) if line.startswith(("void ", "static ")))
        # a `#pragma omp declare simd` belongs to the declaration after it: dropping a
        # repeated pragma line would leave that function scalar (10x slower tanhf)
        decls = "\n".join(lines[:start]).replace("notinbranch\n", "notinbranch\0").split("\n")
        for line in decls:
            if line and line not in head:
                head.append(line)
        bodies.append("\n".join(lines[start:]))
    return "\n".join(head).replace("\0", "\n") + "\n" + "\n".join(bodies)


def _tuple(items):
    return f"({', '.join(items)},)" if items else "()"


def build_library(ctx):
    """Compile every native loop of the program into one library; False on failure."""
    lib = load_library(program_source(ctx.native_pending))
    if lib is None:
        return False
    for epi in ctx.epilogues:  # GEMM epilogues (lowering/cpu_epilogue.py)
        epi.bind(lib)
    for fname, kernel, source, nptr in ctx.native_pending:
        if kernel is None:  # an epilogue, bound above
            continue
        fn = getattr(lib, fname)
        if source is None:  # called from C by the thread pool: its address
            ctx.globals[kernel] = ctypes.cast(fn, ctypes.c_void_p).value
            continue
        fn.restype = None
        # pointers then the element count, or the kernel's own argument types
        fn.argtypes = [ctypes.c_void_p] * nptr + [ctypes.c_long] if type(nptr) is int else nptr
        ctx.globals[kernel] = fn
    return True


__all__ = [
    "enabled",
    "worth_native",
    "emit_native_group",
    "build_library",
    "render_group",
    "NATIVE_MIN_SIZE",
    "ARITH_MIN_SIZE",
]
