"""Large GEMMs on fflow's C thread pool (lowering/cpu_gemm.c, built by gcc once and
cached like the native loops): pthreads that block between jobs and never hold the
Python GIL, calling OpenBLAS (single-threaded) through its cblas entry.

`matmul(a, b, out, threads)` is what the generated code of a jitted program calls for
every product above `fflow.threads.SMALL_GEMM_FLOPS`. Without a C compiler, or for
layouts BLAS cannot take, it falls back to fflow's Python pool (`fflow.threads.matmul`).

Which kernels: NumPy's OpenBLAS, as loaded. When the environment pins it to a CPU
core type (`OPENBLAS_CORETYPE`, e.g. Haswell's AVX2 kernels on an AVX-512 machine:
~125 vs ~230 GFLOP/s per core measured here), fflow's GEMMs call a private copy of
the same library loaded with the core OpenBLAS detects for this CPU, as XLA and
PyTorch ship kernels for the CPU they run on; NumPy itself keeps its pinned core.
`fflow.config.update("blas_kernel", "numpy")` (env `FFLOW_BLAS_KERNEL=numpy`) keeps
fflow on NumPy's library.
"""

import ctypes
import os
import shutil
import time
import zlib

import numpy as np

from fflow import threads

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu_gemm.c")
_lib = None  # the loaded library, or False when unavailable
_pid = None  # the process that started the pool's threads (a forked child has none)
_pending = []  # (job, a, b): operands a late worker may still read
_NO_TRANS, _TRANS = 111, 112
_address = None  # native.address, set by _load
_own = [False]  # fflow's GEMMs run other kernels than np.matmul (a private library)
# With a private library, one-thread products of at least this many FLOPs call it too:
# the C entry costs ~7 µs more than np.matmul; 128x64x256 (4 MFLOP) 34 -> 27 µs here.
OWN_KERNEL_MIN_FLOPS = 2e6


def _symbol(lib, name):
    """(function, whether it takes 64-bit ints) of OpenBLAS's `name`, or (None, 0)."""
    for prefix in ("scipy_", ""):
        for suffix, ilp64 in (("64_", 1), ("", 0)):
            fn = getattr(lib, f"{prefix}{name}{suffix}", None)
            if fn is not None:
                return fn, ilp64
    return None, 0


def _corename(lib):
    fn, _ = _symbol(lib, "openblas_get_corename")
    if fn is None:
        return None
    fn.restype = ctypes.c_char_p
    fn.argtypes = []
    return fn()


def _detected_copy(path):
    """NumPy's OpenBLAS loaded again (a private copy: a second dlopen of the same file
    returns the same library) without OPENBLAS_CORETYPE, one thread; or None."""
    from fflow.lowering import native  # its cache directory

    try:
        st = os.stat(path)
        key = f"{os.path.basename(path)}:{st.st_size}:{st.st_mtime_ns}".encode()
        # not named like OpenBLAS: threadpoolctl (and so users) see NumPy's library only
        dst = os.path.join(native.cache_dir(), f"fflow_kernels_{zlib.crc32(key):08x}.so")
        if not os.path.exists(dst):
            tmp = f"{dst}.{os.getpid()}.tmp"
            shutil.copyfile(path, tmp)
            os.replace(tmp, dst)
    except OSError:
        return None
    saved = {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS")}
    os.environ.pop("OPENBLAS_CORETYPE", None)
    os.environ["OPENBLAS_NUM_THREADS"] = "1"  # OpenBLAS reads both when it loads
    try:
        return ctypes.CDLL(dst)
    except OSError:
        return None
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def kernel_library(path):
    """The OpenBLAS fflow's GEMMs call, given NumPy's at `path`: NumPy's own, unless
    OPENBLAS_CORETYPE pins it to another core than OpenBLAS detects for this CPU."""
    numpy_lib = ctypes.CDLL(path)
    if "OPENBLAS_CORETYPE" not in os.environ or threads.blas_kernel() == "numpy":
        return numpy_lib
    private = _detected_copy(path)
    if private is None or _corename(private) in (None, _corename(numpy_lib)):
        return numpy_lib
    setter, _ = _symbol(private, "openblas_set_num_threads")
    if setter is not None:
        setter.argtypes = [ctypes.c_int]
        setter(1)  # fflow's pool does the threading
    _own[0] = True
    return private


def _cblas(libs, name):
    """Address of cblas_<name> and whether it takes 64-bit ints, or (None, 0)."""
    for lib in libs:
        fn, ilp64 = _symbol(lib, f"cblas_{name}")
        if fn is not None:
            return ctypes.cast(fn, ctypes.c_void_p).value, ilp64
    return None, 0


def _load():
    global _lib, _pid
    if _lib is not None:
        return _lib
    _lib = False
    _pid = os.getpid()
    from fflow.lowering import native  # the C compiler path

    global _address
    _address = native.address  # an array's data pointer, cheaper than .ctypes.data
    if not native.enabled():
        return _lib
    libs = [kernel_library(i["path"]) for i in threads.blas().info if i["api"] == "openblas"]
    sgemm, ilp64 = _cblas(libs, "sgemm")
    dgemm, ilp64_d = _cblas(libs, "dgemm")
    if sgemm is None or dgemm is None or ilp64 != ilp64_d:
        return _lib
    with open(_SOURCE) as f:
        lib = native.load_library(f.read())
    if lib is None:
        return _lib
    lib.fflow_gemm_init.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    lib.fflow_gemm.restype = ctypes.c_long
    lib.fflow_gemm.argtypes = (
        [ctypes.c_int] * 3
        + [ctypes.c_long] * 3
        + [ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p, ctypes.c_long]
        + [ctypes.c_void_p, ctypes.c_long]
        + [ctypes.c_long] * 8
        + [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
        + [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p]
    )
    lib.fflow_parallel.restype = ctypes.c_long
    lib.fflow_parallel.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p]
    lib.fflow_parallel.argtypes += [ctypes.c_void_p] + [ctypes.c_long] * 4
    lib.fflow_parallel.argtypes += [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    lib.fflow_gemm_list.restype = ctypes.c_long
    lib.fflow_gemm_list.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    lib.fflow_gemm_list.argtypes += [ctypes.POINTER(ctypes.c_int)]
    lib.fflow_pool_stats.argtypes = [ctypes.c_void_p]
    lib.fflow_pool_step.argtypes = [ctypes.c_double]
    lib.fflow_pool_spread.argtypes = []
    lib.fflow_pool_worker_tid.restype = ctypes.c_long
    lib.fflow_pool_worker_tid.argtypes = [ctypes.c_int]
    lib.fflow_pool_worker_ns.restype = ctypes.c_long
    lib.fflow_pool_worker_ns.argtypes = []
    lib.fflow_gemm_busy.argtypes = [ctypes.c_long]
    lib.fflow_gemm_release.argtypes = [ctypes.c_long]
    workers = max(0, threads.available_cores() - 1)
    if lib.fflow_gemm_init(workers, sgemm, dgemm, ilp64) < workers:
        return _lib
    _lib = lib
    return _lib


def own_kernels():
    """Whether fflow's GEMMs run other (this CPU's) kernels than NumPy's matmul."""
    if _lib is None:
        _load()
    return bool(_lib) and _own[0]


STATS = (
    "shared jobs",
    "caller chunks",
    "worker chunks",
    "backups",
    "backups kept",
    "wait seconds",
    "backups of descheduled workers",
    "backups after the deadline",
    "worker chunk seconds",
)


def pool_stats():
    """Counters of the C pool since the process started: jobs shared with workers,
    chunks the caller and the workers computed, the caller's backups of late chunks
    (all, and those whose copy was the one kept), seconds the caller waited for the
    workers, and why each backup started (its worker seen descheduled, or the wait
    outlasted twice a chunk). Empty without the C pool.

    >>> import numpy as np
    >>> from fflow.lowering import cpu_gemm
    >>> a = np.ones((256, 256), np.float32)
    >>> _ = cpu_gemm.matmul(a, a, np.empty_like(a), 2)
    >>> stats = cpu_gemm.pool_stats()
    >>> not stats or stats["caller chunks"] >= 1
    True
    """
    lib = _lib if _lib is not None else _load()
    if not lib:
        return {}
    out = (ctypes.c_long * len(STATS))()
    lib.fflow_pool_stats(out)
    values = dict(zip(STATS, out))
    values["wait seconds"] *= 1e-9
    values["worker chunk seconds"] *= 1e-9
    return values


def _layout(x, rows, cols):
    """(transpose flag, leading dimension) of the matrix view x[..., rows, cols], or None."""
    i = x.itemsize
    s0, s1 = x.strides[-2:]
    if rows == 1:
        s0 = max(cols, 1) * i
    if cols == 1:
        s1 = i
    if s1 == i and s0 > 0 and s0 % i == 0 and s0 // i >= max(cols, 1):
        return _NO_TRANS, s0 // i
    if s0 == i and s1 > 0 and s1 % i == 0 and s1 // i >= max(rows, 1):
        return _TRANS, s1 // i
    return None


def _collect():
    keep = []
    for job, a, b in _pending:
        if _lib.fflow_gemm_busy(job):
            keep.append((job, a, b))
        else:
            _lib.fflow_gemm_release(job)
    _pending[:] = keep


def matmul(a, b, out, n_threads, epi=None, ptrs=()):
    """out[...] = a @ b, on `n_threads` threads of the C pool (NumPy matmul semantics
    for equal batch dims; out C-contiguous). `epi` (a 2-D product's
    `cpu_epilogue.Epilogue`, its pointers `ptrs`) then runs on each chunk of `out` on
    the thread that computed it, or over all of `out` after the product."""
    lib = _lib if _lib is not None else _load()
    if n_threads <= 1 and not _own[0]:
        np.matmul(a, b, out=out)
        return out if epi is None else _epilogue(epi, ptrs, out)
    batch = out.shape[:-2]
    ok = (
        lib
        and _pid == os.getpid()
        and len(batch) <= 2
        and a.dtype == b.dtype == out.dtype
        and out.dtype in (np.float32, np.float64)
        and out.flags.c_contiguous
        and a.shape[:-2] == b.shape[:-2] == batch
        and all(s >= 0 for s in a.strides[:-2] + b.strides[:-2])
    )
    if ok:
        m, n = out.shape[-2:]
        k = a.shape[-1]
        la, lb = _layout(a, m, k), _layout(b, k, n)
        ok = la is not None and lb is not None and m * n * k > 0
    if not ok:
        if n_threads <= 1:
            np.matmul(a, b, out=out)
        else:
            threads.matmul(a, b, out, n_threads)
        return out if epi is None else _epilogue(epi, ptrs, out)
    nb = (1, 1) if not batch else ((1,) + batch if len(batch) == 1 else batch)
    sa = (0, 0) if not batch else ((0,) + a.strides[:1] if len(batch) == 1 else a.strides[:2])
    sb = (0, 0) if not batch else ((0,) + b.strides[:1] if len(batch) == 1 else b.strides[:2])
    sc = (0, 0) if not batch else ((0,) + out.strides[:1] if len(batch) == 1 else out.strides[:2])
    error = ctypes.c_int(0)
    if _pending:
        _collect()
    job = lib.fflow_gemm(
        out.itemsize,
        la[0],
        lb[0],
        m,
        n,
        k,
        _address(a.T if la[0] == _TRANS and a.ndim == 2 else a),  # same address
        la[1],
        _address(b.T if lb[0] == _TRANS and b.ndim == 2 else b),
        lb[1],
        _address(out),
        n,
        nb[0],
        nb[1],
        sa[0],
        sa[1],
        sb[0],
        sb[1],
        sc[0],
        sc[1],
        n_threads,
        ctypes.byref(error),
        *_epi_args(epi, ptrs),
    )
    if job == 0:
        raise MemoryError("fflow GEMM pool: out of memory")
    if job != 1:  # a late worker still reads a and b (1: done and released)
        _pending.append((job, a, b))
    if error.value:
        raise MemoryError("fflow GEMM pool: out of memory for a chunk")
    return out


def _epilogue(epi, ptrs, out):
    epi.run(ptrs)
    return out


def _epi_args(epi, ptrs):
    """fflow_gemm's epilogue arguments: function, sums' function, column sums, pointer
    count, pointers."""
    if epi is None:
        return None, None, 0, 0, None
    return epi.addr, epi.fin_addr, epi.nsum, len(ptrs), (ctypes.c_long * len(ptrs))(*ptrs)


def _epi_desc(e):
    """The 5 numbers of an epilogue in a fflow_gemm_list description."""
    p = ctypes.cast(e[4], ctypes.c_void_p).value if e[4] is not None else 0
    return (e[0] or 0, e[1] or 0, e[2], e[3], p)


def _desc(a, b, out):
    """The 12 numbers of a 2-D GEMM for fflow_gemm_list, or None (not BLAS-able)."""
    if not (
        a.ndim == b.ndim == out.ndim == 2
        and a.dtype == b.dtype == out.dtype
        and out.dtype in (np.float32, np.float64)
        and out.flags.c_contiguous
    ):
        return None
    (m, n), k = out.shape, a.shape[1]
    la, lb = _layout(a, m, k), _layout(b, k, n)
    if la is None or lb is None or m * n * k == 0:
        return None
    return (out.itemsize, la[0], lb[0], m, n, k, _address(a.T if la[0] == _TRANS else a), la[1]) + (
        _address(b.T if lb[0] == _TRANS else b),
        lb[1],
        _address(out),
        n,
    )


def matmul2(a1, b1, out1, a2, b2, out2, n_threads, epi1=None, ptrs1=(), epi2=None, ptrs2=()):
    """out1[...] = a1 @ b1 and out2[...] = a2 @ b2, two independent products: on two or
    more threads each runs whole on its own thread (one job of the C pool: no cut
    operands to re-pack, one wake-up), then its epilogue (as in `matmul`); else, or
    for layouts the pool cannot take, one after the other through `matmul`."""
    lib = _lib if _lib is not None else _load()
    d1 = d2 = None
    if n_threads > 1 and lib and _pid == os.getpid():
        d1, d2 = _desc(a1, b1, out1), _desc(a2, b2, out2)
    if d1 is None or d2 is None:
        matmul(a1, b1, out1, n_threads, epi1, ptrs1)
        return matmul(a2, b2, out2, n_threads, epi2, ptrs2)
    e1, e2 = _epi_args(epi1, ptrs1), _epi_args(epi2, ptrs2)
    d1, d2 = d1 + _epi_desc(e1), d2 + _epi_desc(e2)  # e1, e2 keep the pointer arrays
    desc = (ctypes.c_long * 34)(*d1, *d2)
    error = ctypes.c_int(0)
    if _pending:
        _collect()
    job = lib.fflow_gemm_list(2, desc, n_threads, ctypes.byref(error))
    if job == 0:
        raise MemoryError("fflow GEMM pool: out of memory")
    if job != 1:
        _pending.append((job, (a1, b1, out1), (a2, b2, out2)))
    if error.value:
        raise MemoryError("fflow GEMM pool: out of memory for a chunk")
    return out2


def parallel(fn, ptrs, out, n, unit, grain, n_threads, keep, align=1):
    """Run the native chunk loop at address `fn` over indices 0..n on `n_threads`
    threads of the pool: `fn(ptrs, out + s*unit, s, e)` per chunk of at least `grain`
    indices, each starting at a multiple of `align` (lowering/native.py renders these).
    `keep`: the arrays behind `ptrs`, alive until no late worker reads them. False
    when the pool is unavailable."""
    lib = _lib if _lib is not None else _load()
    if not lib or _pid != os.getpid():
        return False
    args = (ctypes.c_long * len(ptrs))(*ptrs)
    error = ctypes.c_int(0)
    if _pending:
        _collect()
    err = ctypes.byref(error)
    job = lib.fflow_parallel(fn, len(ptrs), args, out, n, unit, grain, align, n_threads, err)
    if job == 0:
        raise MemoryError("fflow thread pool: out of memory")
    if job != 1:
        _pending.append((job, keep, None))
    if error.value:
        raise MemoryError("fflow thread pool: out of memory for a chunk")
    return True


def worker_tids():
    """The kernel thread ids of the pool's workers (empty without the C pool)."""
    lib = _lib if _lib is not None else _load()
    if not lib:
        return []
    tids = []
    while (tid := lib.fflow_pool_worker_tid(len(tids))) != -1:
        tids.append(tid)
    return [t for t in tids if t > 0]


# Seconds a worker polls for the next job of a running step before it blocks. The MLP
# step's GEMMs are 20-150 µs of Python and small NumPy ops apart, and a blocked worker
# takes tens of µs to run again; the step's end stops the polls (no spinning between
# steps).
STEP_SPIN = 5e-4


class PooledStep(threads.StepThreads):
    """`threads.StepThreads` for a compiled program whose products run on this pool: a
    call given several threads on a quiet machine wakes the workers as it begins (they
    get ready while the step's first Python runs) and lets them poll for each next job
    of the step (`STEP_SPIN`) instead of blocking between its GEMMs, kept off the
    caller's CPU (in a VM a woken worker otherwise often lands on its waker's CPU and
    polls there with the caller preempted); its end sends them back to sleep. On a
    shared or crowded machine nothing polls and the workers may run on any core: a
    polling worker would take the core share of other processes' threads.

    >>> step = PooledStep()
    >>> n, t0 = step.begin()
    >>> n >= 1
    True
    >>> step.end(n, t0)
    """

    worker_ns = None  # while this call polls: the workers' chunk CPU time at its start

    def begin(self):
        n, t0 = super().begin()
        if n > 1:
            lib = _lib if _lib is not None else _load()
            if lib and _pid == os.getpid():
                if self.timed:  # quiet: poll, the workers kept off the caller's CPU
                    lib.fflow_pool_step(STEP_SPIN)
                    self.worker_ns = lib.fflow_pool_worker_ns()
                else:  # other processes may hold any core: the workers go anywhere
                    lib.fflow_pool_spread()
        return n, t0

    def end(self, threads, start, single=None):
        """Record the call; on several threads, what one thread would have taken: its
        wall time plus the CPU time the workers spent on its chunks."""
        wall = time.perf_counter() - start
        if self.worker_ns is not None:
            _lib.fflow_pool_step(0.0)
            single = wall + (_lib.fflow_pool_worker_ns() - self.worker_ns) * 1e-9
            self.worker_ns = None
        self.record(threads, wall, single)


__all__ = ["matmul", "matmul2", "parallel", "pool_stats", "PooledStep"]
