"""A thin ctypes wrapper over NVRTC: CUDA C source -> cubin for one GPU architecture.

The library comes from the `nvidia-cuda-nvrtc==13.0.*` wheel (no GPU or driver is
needed to compile). Results are cached by source hash in memory and on disk
(`$FFLOW_CACHE_DIR/nvrtc`, default `~/.cache/fflow/nvrtc`), so a second process
reuses them.

Example:
    >>> from fflow.lowering import nvrtc
    >>> src = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] += 1.0f; }'
    >>> nvrtc.compile_cubin(src)[:4]  # an ELF file
    b'\\x7fELF'
"""

import ctypes
import glob
import hashlib
import os
import re
import site
import sys
import tempfile
import threading

DEFAULT_ARCH = "sm_90"
_lib = None
_lib_error = None
_lock = threading.Lock()
_memory_cache = {}


class NVRTCError(RuntimeError):
    """The CUDA C source did not compile; the message carries NVRTC's log."""


class NVRTCUnavailable(RuntimeError):
    """libnvrtc could not be found or loaded."""


def cache_dir(kind):
    """A per-user cache folder (`$FFLOW_CACHE_DIR/<kind>`, default `~/.cache/fflow/<kind>`).

    Without a usable home folder it is `<tmp>/fflow-<uid>/<kind>`, private to the user,
    never a shared name under /tmp that another user could plant files in.
    """
    root = os.environ.get("FFLOW_CACHE_DIR")
    if not root:
        home = os.path.expanduser("~")
        if home not in ("", "/", "~") and os.access(home, os.W_OK):
            root = os.path.join(home, ".cache", "fflow")
        else:
            uid = os.getuid() if hasattr(os, "getuid") else os.getlogin()
            root = os.path.join(tempfile.gettempdir(), f"fflow-{uid}")
    path = os.path.join(root, kind)
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def write_atomic(path, data):
    """Write bytes so a concurrent reader sees the whole file or none of it."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def site_roots():
    """sys.path and the site-packages folders, once each: where pip puts the nvidia-*
    wheels whose libraries (NVRTC, cuBLAS/cuBLASLt) fflow loads."""
    roots = list(sys.path)
    try:
        roots += site.getsitepackages() + [site.getusersitepackages()]
    except AttributeError:  # pragma: no cover - virtualenv without site helpers
        pass
    return list(dict.fromkeys(roots))


def _candidate_paths():
    env = os.environ.get("FFLOW_NVRTC_LIB")
    if env:
        yield env
    for root in site_roots():
        if not root or not os.path.isdir(os.path.join(root, "nvidia")):
            continue
        for pattern in ("nvidia/cu13/lib/libnvrtc.so*", "nvidia/cuda_nvrtc/lib/libnvrtc.so*"):
            for path in sorted(glob.glob(os.path.join(root, pattern))):
                if "alt" not in os.path.basename(path) and "builtins" not in path:
                    yield path
    yield "libnvrtc.so.13"
    yield "libnvrtc.so"


def load_library():
    """Load libnvrtc once; raise NVRTCUnavailable with where it looked if it is missing."""
    global _lib, _lib_error
    if _lib is not None:
        return _lib
    if _lib_error is not None:
        raise NVRTCUnavailable(_lib_error)
    tried = []
    for path in _candidate_paths():
        try:
            _preload_builtins(path)
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path}: {e}")
            continue
        _declare(lib)
        _lib = lib
        return lib
    _lib_error = (
        "libnvrtc was not found. Fix: pip install 'nvidia-cuda-nvrtc==13.0.*' "
        "(or set FFLOW_NVRTC_LIB to the library's path). Tried:\n  " + "\n  ".join(tried)
    )
    raise NVRTCUnavailable(_lib_error)


def _preload_builtins(path):
    # libnvrtc dlopens libnvrtc-builtins by soname at compile time; the wheel's lib
    # folder is not on the loader path, so load it by absolute path first.
    folder = os.path.dirname(path)
    if not folder:
        return
    for builtins in sorted(glob.glob(os.path.join(folder, "libnvrtc-builtins.so*"))):
        if "alt" not in os.path.basename(builtins):
            ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
            return


def _declare(lib):
    c_char_pp = ctypes.POINTER(ctypes.c_char_p)
    lib.nvrtcCreateProgram.argtypes = [
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_int,
        c_char_pp,
        c_char_pp,
    ]
    lib.nvrtcCompileProgram.argtypes = [ctypes.c_void_p, ctypes.c_int, c_char_pp]
    lib.nvrtcGetProgramLogSize.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
    lib.nvrtcGetProgramLog.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.nvrtcGetCUBINSize.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
    lib.nvrtcGetCUBIN.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.nvrtcGetPTXSize.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
    lib.nvrtcGetPTX.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.nvrtcGetNumSupportedArchs.argtypes = [ctypes.POINTER(ctypes.c_int)]
    lib.nvrtcGetSupportedArchs.argtypes = [ctypes.POINTER(ctypes.c_int)]
    lib.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    lib.nvrtcVersion.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]


def version():
    """(major, minor) of the loaded NVRTC."""
    lib = load_library()
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(lib, lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return major.value, minor.value


def supported_archs():
    """Compute capabilities this NVRTC can build cubins for, e.g. [75, 80, ..., 90, 100]."""
    lib = load_library()
    n = ctypes.c_int()
    _check(lib, lib.nvrtcGetNumSupportedArchs(ctypes.byref(n)), "nvrtcGetNumSupportedArchs")
    arr = (ctypes.c_int * n.value)()
    _check(lib, lib.nvrtcGetSupportedArchs(arr), "nvrtcGetSupportedArchs")
    return list(arr)


def targets_for(capability):
    """(cubin arch or None, PTX arch) for a device of compute capability `capability` (e.g. 89).

    A cubin when this NVRTC knows the device's architecture; PTX always, for the
    newest architecture not above the device's, which the driver JIT-compiles on a
    GPU newer than NVRTC (PTX is forward compatible, a cubin is not).
    """
    capability = int(capability)
    archs = supported_archs()
    cubin = f"sm_{capability}" if capability in archs else None
    older = [a for a in archs if a <= capability]
    if not older:
        raise NVRTCError(
            f"this NVRTC (supports {archs}) cannot build for compute capability {capability}. "
            "Fix: install an nvidia-cuda-nvrtc wheel that supports the GPU"
        )
    return cubin, f"compute_{max(older)}"


def module_file(source, capability, name="fflow_kernel.cu"):
    """Path of a cached module file for a GPU of compute capability `capability`:
    the cubin for its architecture, else PTX (JIT-compiled by the driver)."""
    cubin_arch, ptx_arch = targets_for(capability)
    arch = cubin_arch or ptx_arch
    suffix = ".cubin" if cubin_arch else ".ptx"
    path = os.path.join(cache_dir("nvrtc"), source_key(source, arch) + suffix)
    if not os.path.exists(path):
        data = compile_cubin(source, name, arch) if cubin_arch else compile_ptx(source, name, arch)
        if not os.path.exists(path):  # compile_cubin writes its own cache file
            write_atomic(path, data)
    return path


def compile_ptx(source, name="fflow_kernel.cu", arch="compute_90", options=()):
    """Compile CUDA C to PTX text (bytes) for a virtual `arch` such as compute_80."""
    key = ("ptx", source_key(source, arch, options))
    ptx = _memory_cache.get(key)
    if ptx is None:
        ptx = _compile(source, name, arch, options, ptx=True).rstrip(b"\0")
        _memory_cache[key] = ptx
    return ptx


def available():
    try:
        load_library()
        return True
    except NVRTCUnavailable:
        return False


def _check(lib, status, what):
    if status != 0:
        raise NVRTCError(f"{what} failed: {lib.nvrtcGetErrorString(status).decode()}")


def _options(arch, extra):
    return [f"--gpu-architecture={arch}", "--std=c++17", "-default-device", *extra]


def source_key(source, arch=DEFAULT_ARCH, options=()):
    h = hashlib.sha256()
    for part in (source, arch, *options, repr(_version_or_none())):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def _version_or_none():
    try:
        return version()
    except NVRTCUnavailable:
        return None


def compile_cubin(source, name="fflow_kernel.cu", arch=DEFAULT_ARCH, options=()):
    """Compile CUDA C to a cubin (bytes) for `arch`; cached in memory and on disk.

    Raises NVRTCError with the compiler log (and numbered source) on a compile error.
    """
    key = source_key(source, arch, options)
    cubin = _memory_cache.get(key)
    if cubin is not None:
        return cubin
    path = os.path.join(cache_dir("nvrtc"), key + ".cubin")
    if os.path.exists(path):
        with open(path, "rb") as f:
            cubin = f.read()
        _memory_cache[key] = cubin
        return cubin
    cubin = _compile(source, name, arch, options)
    write_atomic(path, cubin)  # a concurrent process sees all of it or nothing
    _memory_cache[key] = cubin
    return cubin


def _compile(source, name, arch, options, ptx=False, log_out=None):
    lib = load_library()
    prog = ctypes.c_void_p()
    with _lock:
        _check(
            lib,
            lib.nvrtcCreateProgram(
                ctypes.byref(prog), source.encode(), name.encode(), 0, None, None
            ),
            "nvrtcCreateProgram",
        )
        try:
            opts = [o.encode() for o in _options(arch, options)]
            arr = (ctypes.c_char_p * len(opts))(*opts)
            status = lib.nvrtcCompileProgram(prog, len(opts), arr)
            log = _log(lib, prog)
            if log_out is not None:
                log_out.append(log)
            if status != 0:
                numbered = "\n".join(
                    f"{i + 1:4d}  {line}" for i, line in enumerate(source.splitlines())
                )
                raise NVRTCError(
                    f"NVRTC could not compile {name} for {arch}:\n{log}\n--- source ---\n{numbered}"
                )
            size = ctypes.c_size_t()
            get_size, get = (
                (lib.nvrtcGetPTXSize, lib.nvrtcGetPTX)
                if ptx
                else (lib.nvrtcGetCUBINSize, lib.nvrtcGetCUBIN)
            )
            _check(lib, get_size(prog, ctypes.byref(size)), "nvrtc get size")
            buf = ctypes.create_string_buffer(size.value)
            _check(lib, get(prog, buf), "nvrtc get result")
            return buf.raw
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _log(lib, prog):
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    buf = ctypes.create_string_buffer(max(size.value, 1))
    lib.nvrtcGetProgramLog(prog, buf)
    return buf.value.decode(errors="replace")


_PTXAS_STACK = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)
_PTXAS_USED = re.compile(r"Used (\d+) registers.*?(\d+) bytes smem")


def resource_usage(source, arch=DEFAULT_ARCH):
    """ptxas's report for each kernel of `source` (compiled with `--ptxas-options=-v`).

    Returns {kernel name: {"registers", "stack", "spill_stores", "spill_loads", "smem"}}
    (bytes except registers). Not cached: for tests and the device check.

    Example (needs libnvrtc):
        >>> src = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] += 1.0f; }'
        >>> resource_usage(src)["k"]["spill_stores"]  # doctest: +SKIP
        0
    """
    logs = []
    _compile(source, "fflow_kernel.cu", arch, ("--ptxas-options=-v",), log_out=logs)
    out, name = {}, None
    for line in logs[-1].splitlines():
        if "Function properties for " in line:
            name = line.split("Function properties for ", 1)[1].strip()
            out[name] = {}
        elif name is not None and (m := _PTXAS_STACK.search(line)):
            out[name].update(zip(("stack", "spill_stores", "spill_loads"), map(int, m.groups())))
        elif name is not None and (m := _PTXAS_USED.search(line)):
            out[name].update(registers=int(m.group(1)), smem=int(m.group(2)))
    return out
