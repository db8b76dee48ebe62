"""The CPU threads fflow owns: how many cores are really ours, and how many threads
each matrix product gets.

Rules, each from a measurement on the shared 2-core machine (docs/benchmarks.md):

* **NumPy's BLAS runs on one thread** (set through threadpoolctl at the first GEMM).
  OpenBLAS's workers busy-wait ~0.1 s after every call and its caller spins until
  every worker has finished its share: on a machine whose cores are taken by other
  processes one descheduled worker made a 1 ms GEMM take 35-45 ms.
* **Large GEMMs are split over fflow's own pool**: chunks of the output, each one
  single-threaded BLAS call, on the C pool of `lowering/cpu_gemm.c` (pthreads, no
  GIL) or, without a C compiler, `GemmPool` here (Python threads). The calling
  thread takes every chunk no worker has started and backs up chunks a descheduled
  worker holds, and idle workers block (no busy-waiting between GEMMs).
* **Small GEMMs run on the caller alone**: below `SMALL_GEMM_FLOPS` a second thread
  costs more than it saves.
* **The pool follows the cores we may use**: `available_cores()` is the CPU affinity
  mask intersected with the cgroup CPU quota (containers), not `os.cpu_count()`,
  divided among the MPI ranks of this node (FFLOW_RANKS_PER_NODE, set by
  `fflow.launch`: 2 ranks on 2 cores run 1 GEMM thread each, not 2).
* **Each compiled step adapts** (`StepThreads`): on a quiet machine a jitted program
  with large GEMMs (or large native loops) runs the thread count whose recent wall
  times are best, probing the others now and then; while other processes share the
  cores (at most as many other runnable threads as cores) it keeps that choice, since
  the scheduler gives a step the share of as many threads as it runs; on a crowded
  machine (more) it runs one thread, and goes back up when the others leave.

Knobs: `fflow.config.update("blas_threads", n)`: 0 (default) adapts; n > 0 runs
large GEMMs on n threads; -1 leaves NumPy's BLAS alone (OpenBLAS's own threads).
`SMALL_GEMM_FLOPS`, `WINDOW`, `WARMUP`, `FIRST_SAMPLES`, `PROBE_EVERY`, `PROBE_MAX`,
`PROBE_CALLS` and `BUSY_WEIGHT` below;
`threads.picks` counts the calls per thread count (the benchmarks print it).

Example:
    >>> import numpy as np
    >>> from fflow import threads
    >>> threads.available_cores() >= 1
    True
    >>> threads.gemm_threads(2 * 8 * 8 * 8, 4)  # a tiny GEMM runs on one thread
    1
    >>> a, b = np.ones((64, 32), np.float32), np.ones((32, 48), np.float32)
    >>> out = np.empty((64, 48), np.float32)
    >>> float(threads.matmul(a, b, out, threads=2)[0, 0])
    32.0
"""

import collections
import itertools
import math
import os
import threading
import time

import numpy as np

# A (m,k)x(k,n) float32 GEMM of fewer FLOPs than this runs on one thread.
# Measured with benchmarks/bench_gemm_threads.py on the 2-core machine (quiet):
# two threads start to win at ~(128,256)x(256,256) (17 MFLOP); below that the
# second thread's wake-up and packing cost eat the gain.
SMALL_GEMM_FLOPS = 16e6
# StepThreads: samples kept per thread count, and how often another count is probed.
WINDOW = 5
# StepThreads: the first calls at each count are not samples (they pay one-time costs:
# the pool's first job, a worker's first scratch, new heap pages; measured 9.5 ms
# against 1.9-2.2 ms for the 4M-element elementwise chain on 2 threads), then
# FIRST_SAMPLES calls at each count are timed before the best one is kept.
WARMUP = 1
FIRST_SAMPLES = 3
PROBE_EVERY = 16
PROBE_MAX = 1024
# StepThreads: a probe runs another count this many calls in a row; its first call
# is not a sample (the other core wakes from idle: the MLP step's first 2-thread call
# after 1-thread calls took 1.85-2.3 ms, the next ones 1.7-1.8 ms)
PROBE_CALLS = 3
# StepThreads: weight of the newest free-core sample in the running average
BUSY_WEIGHT = 0.3
# StepThreads: one thread is not sampled (nor probed) while what a multi-threaded call
# says one thread would take (its wall time plus its workers' CPU time on chunks: the
# work the caller would have done too) is this many times the best count's median. The
# MLP step, quiet: 1.4 ms on 2 threads, estimated 1.95 ms on one, measured 2.4 ms.
CLEAR_MARGIN = 1.25


# -- cores we may use ------------------------------------------------------------------


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def cgroup_cpu_limit(proc_cgroup="/proc/self/cgroup", root="/sys/fs/cgroup"):
    """The CPU quota of this process's cgroup (v2 `cpu.max` or v1 CFS), in cores, or None.

    Every ancestor's quota applies; the smallest wins.
    """
    text = _read(proc_cgroup)
    if text is None:
        return None
    limits = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        path = path.strip().lstrip("/")
        if controllers == "":  # cgroup v2 unified hierarchy
            dirs = [os.path.join(root, path)]
            while path:
                path = os.path.dirname(path)
                dirs.append(os.path.join(root, path))
            for d in dirs:
                limit = _cpu_max(_read(os.path.join(d, "cpu.max")))
                if limit is not None:
                    limits.append(limit)
        elif "cpu" in controllers.split(","):  # cgroup v1
            for d in (os.path.join(root, controllers, path), os.path.join(root, "cpu", path)):
                quota = _read(os.path.join(d, "cpu.cfs_quota_us"))
                period = _read(os.path.join(d, "cpu.cfs_period_us"))
                if quota and period and int(quota) > 0 and int(period) > 0:
                    limits.append(int(quota) / int(period))
                    break
    return min(limits) if limits else None


def _cpu_max(text):
    if not text:
        return None
    fields = text.split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    return int(fields[0]) / int(fields[1])


def available_cores():
    """Cores this process may run on: affinity mask ∩ cgroup quota (at least 1)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = cgroup_cpu_limit()
    if quota is not None:
        # a fractional quota throttles the last thread: round down
        n = min(n, max(1, math.floor(quota)))
    # MPI ranks on one node share its cores (set by fflow.launch for each rank)
    n //= max(1, int(os.environ.get("FFLOW_RANKS_PER_NODE", "1") or 1))
    return max(1, n)


# -- NumPy's BLAS ----------------------------------------------------------------------


class _Blas:
    """Thread-count setters of the BLAS libraries loaded in this process."""

    def __init__(self):
        self.setters = []
        self.current = None
        self.info = []
        self.original = []  # each library's thread count before fflow took over

    def set(self, n):
        if n != self.current:
            for setter in self.setters:
                setter(n)
            self.current = n


_blas = None
_fixed = [0]  # fflow.config blas_threads: 0 adapts, n > 0 fixed, -1 leaves BLAS alone
_kernel = ["auto"]  # fflow.config blas_kernel: "auto" or "numpy" (lowering/cpu_gemm.py)


def blas_kernel():
    """Which OpenBLAS kernels fflow's GEMMs run: "auto" (the core OpenBLAS detects for
    this CPU, even when OPENBLAS_CORETYPE pins NumPy's) or "numpy" (NumPy's library)."""
    return _kernel[0]


def set_blas_kernel(value):
    """`fflow.config` hook of `blas_kernel`; read when the GEMM pool loads (first GEMM)."""
    if value not in ("auto", "numpy"):
        raise ValueError(f'blas_kernel must be "auto" or "numpy", got {value!r}')
    _kernel[0] = value


def _openblas_setter(ctl):
    import ctypes  # once, at the first GEMM (not at `import fflow`)

    for prefix in ("", "scipy_"):
        for suffix in ("", "64_", "_64"):
            fn = getattr(ctl.dynlib, f"{prefix}openblas_set_num_threads{suffix}", None)
            if fn is not None:
                fn.argtypes = [ctypes.c_int]
                fn.restype = None
                return fn
    return None


def blas():
    """fflow's handle on NumPy's BLAS, found on first use: it runs on one thread.

    fflow splits large GEMMs over its own pool (lowering/cpu_gemm.c), whose idle
    workers block instead of spinning; OpenBLAS's own workers would busy-wait ~0.1 s after
    every call and stall when a core is taken by another process.
    """
    global _blas
    if _blas is not None:
        return _blas
    b = _Blas()
    if _fixed[0] >= 0:
        # threadpoolctl scans the loaded shared libraries; needed once, at the first GEMM
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:  # a declared dependency; without it fflow leaves BLAS alone
            ThreadpoolController = None
        if ThreadpoolController is not None:
            for ctl in ThreadpoolController().select(user_api="blas").lib_controllers:
                setter = None
                if ctl.internal_api == "openblas" and getattr(ctl, "threading_layer", "") in (
                    "pthreads",
                    "disabled",
                ):
                    setter = _openblas_setter(ctl)  # direct: ~1 µs a call
                b.setters.append(setter or ctl.set_num_threads)
                b.info.append({"api": ctl.internal_api, "path": ctl.filepath})
                b.original.append((ctl, ctl.num_threads))
        b.set(1)
    _blas = b
    return b


def set_blas_threads(n):
    """Run NumPy's BLAS on `n` threads from now on (a no-op when it already does)."""
    b = _blas or blas()
    if n != b.current:
        b.set(n)


def set_fixed(n):
    """`fflow.config` hook: 0 adapts, n > 0 runs large GEMMs on n threads, -1 leaves BLAS alone."""
    global _blas
    _fixed[0] = int(n or 0)
    if _fixed[0] < 0 and _blas is not None:
        for ctl, count in _blas.original:  # hand NumPy's BLAS back as fflow found it
            ctl.set_num_threads(count)
        _blas = None
    elif _fixed[0] >= 0:
        if _blas is not None and not _blas.setters:
            _blas = None  # made while fflow left BLAS alone: take it over now
        b = blas()
        b.current = None  # someone else may have changed it (threadpool_limits): set again
        b.set(1)


def gemm_threads(flops, pool):
    """Threads for one GEMM of `flops` when large GEMMs get `pool` threads."""
    return 1 if flops < SMALL_GEMM_FLOPS else pool


# -- the C heap --------------------------------------------------------------------------

# glibc malloc settings applied at the first compiled program (`tune_malloc`):
# arrays up to MALLOC_MMAP_THRESHOLD come from the heap, and MALLOC_TOP_PAD of freed heap
# stays mapped instead of going back to the OS after every step.
MALLOC_MMAP_THRESHOLD = 32 << 20
MALLOC_TOP_PAD = 64 << 20
_malloc = {"tune": True, "done": False}


def set_malloc_tuning(on):
    """`fflow.config` hook of `malloc_tuning`; read at the first compiled program."""
    _malloc["tune"] = bool(on)


def tune_malloc():
    """Keep freed temporaries' pages mapped (glibc only; once per process).

    A compiled step allocates its temporaries with NumPy (malloc) and frees them when
    it returns. With glibc's defaults the pages of a freed heap top go back to the OS
    and every step faults them in again: a layernorm gradient at (8, 128, 256) took
    2272 page faults and 4.2 ms of CPU per call, 0 and 0.78 ms with these settings
    (transformer block step 31.0 -> 28.6 ms, MLP step 2.58 -> 2.31 ms on one thread).
    M_TOP_PAD alone turns glibc's adaptive mmap threshold off (4 MB arrays were then
    mmapped and faulted every step), so the threshold is set too.
    """
    if _malloc["done"]:
        return
    _malloc["done"] = True
    if not _malloc["tune"]:
        return
    import ctypes  # at the first compiled program, not at `import fflow`

    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc
        return
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt(-3, MALLOC_MMAP_THRESHOLD)  # M_MMAP_THRESHOLD
    mallopt(-2, MALLOC_TOP_PAD)  # M_TOP_PAD


# -- fflow's GEMM pool -----------------------------------------------------------------


class _Job:
    """The chunks of one GEMM: `views(k)` gives chunk k's (a, b, out) views."""

    __slots__ = ("views", "n", "claim", "lock", "finished", "left", "done", "error")

    def __init__(self, views, n):
        self.views = views
        self.n = n
        self.claim = itertools.count()  # next(...) is atomic under the GIL
        self.lock = threading.Lock()
        self.finished = [False] * n
        self.left = n
        self.done = threading.Event()
        self.error = None

    def _finish(self, k, result=None, error=None):
        with self.lock:
            if self.finished[k]:
                return  # the caller's backup (or the worker) was first: drop this copy
            if error is not None:
                self.error = error
            elif result is not None:
                self.views(k)[2][...] = result
            self.finished[k] = True
            self.left -= 1
            if self.left == 0:
                self.done.set()

    def work(self):
        """A worker: compute unclaimed chunks into its own buffers, publish each once."""
        while True:
            k = next(self.claim)
            if k >= self.n:
                return
            try:
                a, b, _ = self.views(k)
                self._finish(k, np.matmul(a, b))
            except BaseException as e:  # re-raised by the caller's thread
                self._finish(k, error=e)

    def lead(self):
        """The caller: its chunks straight into the output, then backups of late ones.

        A worker the OS descheduled in the middle of a chunk would stall the GEMM
        until it runs again; after waiting twice its own chunk time, the caller
        computes every unfinished chunk itself (the first result to arrive is kept;
        results are the same bits).
        """
        t0 = time.perf_counter()
        mine = 0
        while True:
            k = next(self.claim)
            if k >= self.n:
                break
            a, b, out = self.views(k)
            try:
                np.matmul(a, b, out=out)
            except BaseException as e:
                self._finish(k, error=e)
                continue
            mine += 1
            self._finish(k)
        per_chunk = (time.perf_counter() - t0) / mine if mine else 1e-3
        if not self.done.wait(timeout=max(2 * per_chunk, 1e-4)):
            for k in range(self.n):
                if not self.finished[k]:
                    a, b, _ = self.views(k)
                    self._finish(k, np.matmul(a, b))
        self.done.wait()
        if self.error is not None:
            raise self.error


class GemmPool:
    """Worker threads that share the chunks of large GEMMs with the calling thread.

    The caller works too: it takes every chunk no worker has started, and backs up
    chunks a descheduled worker holds (`_Job.lead`), so another process taking the
    cores costs little more than running alone. Idle workers block on a queue (no
    busy-waiting).
    """

    def __init__(self, workers):
        self.workers = workers
        self._queues = []
        self._pid = None

    def _start(self):
        import queue  # at the first parallel GEMM, not at `import fflow`

        self._queues = []
        for _ in range(self.workers):
            q = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(q,), daemon=True).start()
            self._queues.append(q)
        self._pid = os.getpid()

    @staticmethod
    def _serve(q):
        while True:
            q.get().work()

    def run(self, views, n, threads):
        """out_k[...] = a_k @ b_k for (a_k, b_k, out_k) = views(k), k < n, on up to
        `threads` threads (this one included)."""
        if self._pid != os.getpid():  # first use, or a forked child: threads are gone
            self._start()
        job = _Job(views, n)
        for q in self._queues[: threads - 1]:
            q.put(job)
        job.lead()


_pool = None


def gemm_pool():
    global _pool
    if _pool is None:
        _pool = GemmPool(max(0, available_cores() - 1))
    return _pool


def _chunks(size, parts, align=16):
    step = -(-size // parts)
    step = -(-step // align) * align
    return [(s, min(s + step, size)) for s in range(0, size, step)]


def matmul(a, b, out, threads):
    """out[...] = a @ b (NumPy matmul semantics, any strides NumPy's BLAS accepts).

    With threads > 1 the output is cut into chunks (twice as many as threads, so
    the caller can take a late worker's share), each one single-threaded BLAS call:
    the leading batch dimension when there is one, else the larger of the two
    matrix dimensions, whichever cut re-packs the smaller operand (cutting the
    columns re-packs only `a`, cutting the rows only `b`).
    """
    if threads <= 1 or gemm_pool().workers == 0:
        return np.matmul(a, b, out=out)
    if out.ndim > 2:
        if out.shape[0] < 2:
            return np.matmul(a, b, out=out)
        parts = _chunks(out.shape[0], 2 * threads, align=1)

        def views(k):
            s, e = parts[k]
            return a[s:e], b[s:e], out[s:e]

    elif out.shape[1] >= out.shape[0]:
        parts = _chunks(out.shape[1], 2 * threads)

        def views(k):
            s, e = parts[k]
            return a, b[:, s:e], out[:, s:e]

    else:
        parts = _chunks(out.shape[0], 2 * threads)

        def views(k):
            s, e = parts[k]
            return a[s:e], b, out[s:e]

    _pool.run(views, len(parts), threads)
    return out


# -- per-step adaptation ---------------------------------------------------------------


def _median(xs):
    xs = sorted(xs)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


_loadavg = [None, None]  # (pid, fd) of /proc/loadavg, kept open: pread is ~1 µs, open ~10


def _runnable():
    """Runnable threads on the machine right now (/proc/loadavg), or None."""
    pid = os.getpid()
    if _loadavg[0] != pid:  # first call, or a forked child
        try:
            _loadavg[:] = [pid, os.open("/proc/loadavg", os.O_RDONLY)]
        except OSError:
            _loadavg[:] = [pid, None]
    if _loadavg[1] is None:
        return None
    try:
        return int(os.pread(_loadavg[1], 128, 0).split()[3].split(b"/")[0])
    except (OSError, IndexError, ValueError):
        return None


def other_runnable():
    """Runnable threads on the machine besides the calling one (/proc/loadavg); 0 when
    unknown."""
    running = _runnable()
    return 0 if running is None else max(0, running - 1)  # `running` counts this thread


def free_cores(cores):
    """Cores not taken by other runnable threads right now (/proc/loadavg), at least 1."""
    return max(1, min(cores, cores - other_runnable()))


# calls per GEMM thread count over every compiled step (benchmarks print it)
picks = collections.Counter()


class StepThreads:
    """The GEMM thread count of one compiled program, chosen from its wall times.

    `begin()` returns (threads, start time); `end(threads, start)` records the call.
    Other runnable threads (`other_runnable`, averaged over recent calls: a thread of
    another library that spins for a moment after its own call, seen at one call's
    start, is not a busy core; a process that keeps a core busy is, from its first
    sample on) set one of three regimes:

    * **quiet** (no core taken): the count is chosen from wall times. Each count's
      first `WARMUP` calls are not timed samples (one-time costs), then every count
      is timed `FIRST_SAMPLES` times (a median of 3 outvotes one outlier), the
      counts taking turns: a process's first calls are slower at every count (the
      MLP step's first 1-thread calls 2.8-3.2 ms, later 2.4-2.6 ms), so sampling
      one count after the other compared a slow phase with a fast one. Then the
      count with the best median of its last `WINDOW` calls runs, and now and then
      another count is probed for `PROBE_CALLS` calls in a row (the first not a
      sample: it wakes the idle cores); it wins on its median. Right after a probe
      wins, the gap to the next probe is `PROBE_EVERY` calls; each losing probe
      doubles it (up to `PROBE_MAX`). Calls that say what one thread would have
      taken (`end(..., single=)`: the GEMM pool's workers' CPU time on the call's
      chunks, added to its wall time) spare one thread its samples and probes while
      that estimate stays `CLEAR_MARGIN` times the best median: a slow call the
      program would only run to learn it is slow.
    * **shared** (at most as many other threads as cores: with all of ours, at most
      twice as many threads as cores): the quiet choice stays (all cores before any
      quiet sample), and these calls are not samples. The scheduler shares the cores
      per thread, so a step split over 2 threads gets about the share of 2: beside
      two busy processes on 2 cores the MLP step took 3.5-4.0 ms on 2 threads and
      6.8-7.3 ms on one (JAX 2.3-3.9 ms). Wall times there are two clusters (calls
      that ran through, calls that waited for a time slice) and a median of 5 picks
      either.
    * **crowded** (more other threads than cores): one thread. Waiting for a
      descheduled worker's last chunk costs more than the share gained: at load 9
      the 4M-element elementwise chain took 10-19 ms on 2 threads, 3-8 ms on one.
    """

    def __init__(self, cores=None):
        self.cores = cores or available_cores()
        choices = {1, self.cores}
        if self.cores > 3:
            choices.add(self.cores // 2)
        self.choices = sorted(choices)
        self.samples = {c: collections.deque(maxlen=WINDOW) for c in self.choices}
        self.warm = dict.fromkeys(self.choices, 0)  # untimed first calls per count
        self.current = self.choices[-1]
        self.calls = 0
        self.gap = PROBE_EVERY
        self.next_probe = PROBE_EVERY
        self._turn = 0
        self.probe = None  # (count, calls left, its samples) while a probe runs
        self.busy = None  # other runnable threads at recent calls' starts (an average)
        self.timed = True  # whether the current call is a sample (quiet machine)
        self.single = collections.deque(maxlen=WINDOW)  # one thread's estimated times

    def pick(self):
        """The thread count of the next call."""
        self.timed = True
        if _fixed[0]:
            return max(_fixed[0], 1)
        if self.cores == 1:
            return 1
        self.calls += 1
        others = other_runnable()
        self.busy = (
            others if self.busy is None else (1 - BUSY_WEIGHT) * self.busy + BUSY_WEIGHT * others
        )
        taken = int(self.busy + 0.25)  # busy in 3 of 4 recent calls: taken
        self.timed = taken == 0
        if taken > self.cores:  # crowded
            return 1
        if taken:  # shared: the choice made on quiet samples
            return self.current
        # first calls: each count's warm-up, then its samples, taking turns (most
        # threads first), so a process that is still warming up (its first calls
        # slower at every count) slows every count's samples alike
        short = [
            c
            for c in self.choices
            if len(self.samples[c]) < FIRST_SAMPLES and not self._clearly_slower(c)
        ]
        if short:
            return min(short, key=lambda c: (self.warm[c] + len(self.samples[c]), -c))
        if self.probe is None and self.calls >= self.next_probe:
            others = [c for c in self.choices if c != self.current]
            self._turn = (self._turn + 1) % len(others)
            if self._clearly_slower(others[self._turn]):  # as if it lost
                self.gap = min(2 * self.gap, PROBE_MAX)
                self.next_probe = self.calls + self.gap
            else:
                self.probe = (others[self._turn], PROBE_CALLS, [])
        return self.current if self.probe is None else self.probe[0]

    def _clearly_slower(self, count):
        """Whether one thread (`count` 1) is estimated `CLEAR_MARGIN` times slower
        than the best count measured, from the last calls' estimates."""
        if count != 1 or len(self.single) < FIRST_SAMPLES:
            return False
        best = [_median(s) for c, s in self.samples.items() if c != 1 and len(s) >= FIRST_SAMPLES]
        return bool(best) and _median(self.single) > CLEAR_MARGIN * min(best)

    def record(self, threads, seconds, single=None):
        samples = self.samples.get(threads)
        if samples is None or not self.timed:  # not a sample: the machine is shared
            return
        if single is not None and threads > 1 and self.warm[threads] >= WARMUP:
            self.single.append(single)
        if self.warm[threads] < WARMUP:  # a first call at this count: not a sample
            self.warm[threads] += 1
            return
        if self.probe is not None and threads == self.probe[0]:
            count, left, probed = self.probe
            if left < PROBE_CALLS:  # its first call wakes idle cores: not a sample
                probed.append(seconds)
            self.probe = (count, left - 1, probed)
            if left > 1:
                return
            # the probe is over: it wins on its median, or the next one waits twice as long
            self.probe = None
            won = bool(self.samples[self.current]) and _median(probed) < _median(
                self.samples[self.current]
            )
            self.gap = PROBE_EVERY if won else min(2 * self.gap, PROBE_MAX)
            self.next_probe = self.calls + self.gap
            samples.extend(probed)
            if won:
                self.current = threads
            return
        samples.append(seconds)
        # one thread estimated clearly slower does not win on its few early samples
        # (never empty: a count is clearly slower only beside another one with samples)
        ok = [c for c in self.choices if self.samples[c] and not self._clearly_slower(c)]
        self.current = min(ok, key=lambda c: _median(self.samples[c]))

    def begin(self):
        n = self.pick()
        picks[n] += 1
        return n, time.perf_counter()

    def end(self, threads, start, single=None):
        """Record the call begun at `start` on `threads` threads; `single`: the
        seconds it would have taken on one thread, when the caller can tell."""
        self.record(threads, time.perf_counter() - start, single)


__all__ = [
    "available_cores",
    "free_cores",
    "other_runnable",
    "matmul",
    "GemmPool",
    "cgroup_cpu_limit",
    "blas",
    "set_blas_threads",
    "tune_malloc",
    "gemm_threads",
    "StepThreads",
    "SMALL_GEMM_FLOPS",
]
