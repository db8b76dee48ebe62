"""Run generated CUDA C on the CPU: g++ with `cuda_shim.h`, launched through ctypes.

`ShimModule(source)` mirrors `cupy.RawModule` and `ShimKernel` mirrors
`cupy.RawKernel`: `kernel((grid,), (block,), args, shared_mem=0)` with NumPy arrays
standing in for device arrays. For every `__global__` function the module appends
a small C wrapper that unpacks the arguments and hands the kernel to the shim's
grid scheduler. Shared libraries are cached by source hash in memory and on disk
(`~/.cache/fflow/shim`), and several sources can be built into one library
(`build_many`) so a test module pays for one g++ run.

Example:
    >>> import numpy as np
    >>> from fflow.lowering.shim import ShimModule
    >>> src = '''extern "C" __global__ void twice(float* x, int n) {
    ...   int i = blockIdx.x * blockDim.x + threadIdx.x;
    ...   if (i < n) x[i] *= 2.0f;
    ... }'''
    >>> x = np.arange(5, dtype=np.float32)
    >>> ShimModule(src).get_function("twice")((1,), (32,), (x, np.int32(5)))
    >>> x.tolist()
    [0.0, 2.0, 4.0, 6.0, 8.0]
"""

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading

import numpy as np
from fflow.lowering.nvrtc import cache_dir

from fflow.core import primitives

HEADER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_shim.h")
# -O0: the suite builds many small kernel libraries and g++'s time dominates; set
# FFLOW_SHIM_OPT=-O2 for faster simulated kernels.
# -U_FORTIFY_SOURCE: fiber switches longjmp between stacks, which glibc's checked
# longjmp would reject.
CXX_FLAGS = ["-std=c++17", os.environ.get("FFLOW_SHIM_OPT", "-O0"), "-fPIC", "-shared", "-w",
             "-U_FORTIFY_SOURCE", "-fno-strict-aliasing"]  # fmt: skip

_KERNEL_RE = re.compile(
    r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(\w+)\s*\(([^)]*)\)\s*\{"
)
_SYNC_RE = re.compile(r"__syncthreads|__syncwarp|__shfl|\w*sync\w*\s*\(")
_launch_lock = threading.Lock()
_libraries = {}  # key -> ctypes.CDLL

_CTYPES = {
    "bool": ctypes.c_bool,
    "char": ctypes.c_int8,
    "signed char": ctypes.c_int8,
    "unsigned char": ctypes.c_uint8,
    "short": ctypes.c_int16,
    "unsigned short": ctypes.c_uint16,
    "int": ctypes.c_int32,
    "unsigned": ctypes.c_uint32,
    "unsigned int": ctypes.c_uint32,
    "long long": ctypes.c_int64,
    "long long int": ctypes.c_int64,
    "unsigned long long": ctypes.c_uint64,
    "size_t": ctypes.c_uint64,
    "float": ctypes.c_float,
    "double": ctypes.c_double,
}


class ShimCompileError(RuntimeError):
    """g++ rejected the shim build of a kernel source."""


class Param:
    __slots__ = ("ctype", "name", "is_pointer", "scalar")

    def __init__(self, text):
        text = " ".join(text.replace("__restrict__", " ").split())
        m = re.match(r"(.*?)(\w+)$", text)
        if not m:
            raise ValueError(f"cannot parse kernel parameter {text!r}")
        self.ctype = m.group(1).strip()
        self.name = m.group(2)
        self.is_pointer = "*" in self.ctype
        self.scalar = None
        if not self.is_pointer:
            base = self.ctype.replace("const ", "").strip()
            if base not in _CTYPES:
                raise ValueError(f"unsupported kernel parameter type {self.ctype!r}")
            self.scalar = _CTYPES[base]


def parse_kernels(source):
    """[(name, [Param], uses_barriers)] for each `__global__` function in `source`."""
    out = []
    for m in _KERNEL_RE.finditer(source):
        params_text = m.group(2).strip()
        params = [Param(p) for p in params_text.split(",")] if params_text else []
        body = _body(source, m.end() - 1)
        out.append((m.group(1), params, bool(_SYNC_RE.search(body))))
    return out


def _body(source, open_brace):
    depth = 0
    for i in range(open_brace, len(source)):
        c = source[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return source[open_brace : i + 1]
    raise ValueError("unbalanced braces in kernel source")


def _wrapper(name, params):
    unpack = ", ".join(f"*({p.ctype}*)a[{i}]" for i, p in enumerate(params))
    return (
        f"\nstatic void fflow_body_{name}(void* p) {{\n"
        f"  void** a = (void**)p;\n  (void)a;\n  {name}({unpack});\n}}\n"
        f'extern "C" void fflow_launch_{name}(void** a, unsigned gx, unsigned gy, unsigned gz,\n'
        f"    unsigned bx, unsigned by, unsigned bz, size_t smem, int fibers) {{\n"
        f"  fflow_shim::run_grid(gx, gy, gz, bx, by, bz, smem, fibers, fflow_body_{name}, a);\n"
        f"}}\n"
    )


def shim_source(sources):
    """The C++ translation unit g++ builds for these kernel sources."""
    parts = ['#include "cuda_shim.h"\n', _libm_declarations()]
    for src in sources:
        parts.append(src)
        parts.append("\n")
        for name, params, _ in parse_kernels(src):
            parts.append(_wrapper(name, params))
    return "".join(parts)


def _libm_declarations():
    """The libm functions the primitives declare (Primitive.c_math) in float and double:
    a new one needs no line in cuda_shim.h (declaring one twice is allowed)."""
    names = sorted({p.c_math for p in primitives.values() if p.c_math is not None})
    lines = [f"float {n}f(float);\ndouble {n}(double);\n" for n in names]
    return 'extern "C" {\n' + "".join(lines) + "}\n"


def _header_text():
    with open(HEADER) as f:
        return f.read()


def compiler():
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        raise ShimCompileError("the CUDA host shim needs a C++ compiler (g++); none was found")
    return cxx


def build_library(sources):
    """Compile `sources` (a list of CUDA C strings) into one shared library (cached)."""
    unit = shim_source(sources)
    h = hashlib.sha256()
    for part in (unit, _header_text(), " ".join(CXX_FLAGS)):
        h.update(part.encode())
    key = h.hexdigest()[:32]
    lib = _libraries.get(key)
    if lib is not None:
        return lib
    path = os.path.join(cache_dir("shim"), key + ".so")
    if not os.path.exists(path):
        with tempfile.TemporaryDirectory() as tmp:
            src_path = os.path.join(tmp, "kernels.cpp")
            with open(src_path, "w") as f:
                f.write(unit)
            out_tmp = f"{path}.{os.getpid()}.tmp"
            cmd = [compiler(), *CXX_FLAGS, "-I", os.path.dirname(HEADER), src_path, "-o", out_tmp]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                numbered = "\n".join(
                    f"{i + 1:4d}  {line}" for i, line in enumerate(unit.splitlines())
                )
                raise ShimCompileError(
                    f"g++ could not build the host shim:\n{proc.stderr}\n--- source ---\n{numbered}"
                )
            os.replace(out_tmp, path)
    lib = ctypes.CDLL(path)
    _libraries[key] = lib
    return lib


class ShimModule:
    """Like `cupy.RawModule(code=...)`, running on the CPU through the host shim."""

    def __init__(self, code=None, sources=None):
        self.sources = list(sources) if sources is not None else [code]
        self.lib = build_library(self.sources)
        self.kernels = {}
        for src in self.sources:
            for name, params, syncs in parse_kernels(src):
                self.kernels[name] = ShimKernel(self.lib, name, params, syncs)

    def get_function(self, name):
        try:
            return self.kernels[name]
        except KeyError:
            raise KeyError(f"no __global__ function {name!r} in this module") from None


_loaded = {}  # kernel name -> ShimKernel, for every library built in this process


def build_many(sources):
    """One shared library for many kernel sources: {kernel name: ShimKernel}.

    Kernels already built in this process (`preload`) are reused: generated kernel
    names contain their source hash, so a name identifies its code.
    """
    sources = list(dict.fromkeys(sources))
    names = [name for src in sources for name, _, _ in parse_kernels(src)]
    if names and all(n in _loaded for n in names):
        return {n: _loaded[n] for n in names}
    kernels = ShimModule(sources=sources).kernels
    _loaded.update(kernels)
    return kernels


def preload(sources):
    """Build many kernel sources in one g++ run so later `build_many` calls find them."""
    return build_many(sources)


def _dims(d):
    d = (d,) if isinstance(d, (int, np.integer)) else tuple(int(v) for v in d)
    if not 1 <= len(d) <= 3 or any(v < 1 for v in d):
        raise ValueError(f"grid and block sizes must be 1 to 3 positive ints, got {d}")
    return d + (1,) * (3 - len(d))


class ShimKernel:
    """Like `cupy.RawKernel`: call with (grid, block, args, shared_mem=0)."""

    def __init__(self, lib, name, params, uses_barriers):
        self.name = name
        self.params = params
        self.uses_barriers = uses_barriers
        self._fn = getattr(lib, "fflow_launch_" + name)
        self._fn.restype = None
        self._fn.argtypes = (
            [ctypes.c_void_p] + [ctypes.c_uint] * 6 + [ctypes.c_size_t, ctypes.c_int]
        )

    def __call__(self, grid, block, args, shared_mem=0):
        if len(args) != len(self.params):
            raise TypeError(
                f"kernel {self.name} takes {len(self.params)} arguments, got {len(args)}"
            )
        keep = []
        ptrs = (ctypes.c_void_p * max(len(args), 1))()
        for i, (p, a) in enumerate(zip(self.params, args)):
            if p.is_pointer:
                if not isinstance(a, np.ndarray):
                    raise TypeError(f"argument {p.name} of {self.name} must be an array")
                cell = ctypes.c_void_p(a.ctypes.data)
            else:
                if isinstance(a, np.ndarray) and a.ndim > 0:
                    raise TypeError(f"argument {p.name} of {self.name} must be a scalar")
                value = a.item() if isinstance(a, (np.generic, np.ndarray)) else a
                cell = p.scalar(value)
            keep.append(cell)
            ptrs[i] = ctypes.cast(ctypes.pointer(cell), ctypes.c_void_p)
        g, b = _dims(grid), _dims(block)
        if b[0] * b[1] * b[2] > 1024:
            raise ValueError(f"block {b} has more than 1024 threads")
        with _launch_lock:
            self._fn(ptrs, *g, *b, int(shared_mem), int(self.uses_barriers))
