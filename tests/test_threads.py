"""fflow.threads: cores from affinity and cgroup quotas, the GEMM pool (numbers vs
NumPy), the per-step thread choice (driven by given wall times, never measured),
and BLAS ownership through threadpoolctl."""

import os
import subprocess
import sys

import numpy as np
import pytest

import fflow
from fflow import threads


def _cgroup_tree(tmp_path, proc_line, files):
    proc = tmp_path / "cgroup"
    proc.write_text(proc_line + "\n")
    root = tmp_path / "fs"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(proc), str(root)


def test_cgroup_v2_quota_smallest_ancestor_wins(tmp_path):
    proc, root = _cgroup_tree(
        tmp_path,
        "0::/a/b",
        {"a/cpu.max": "150000 100000\n", "a/b/cpu.max": "max 100000\n", "cpu.max": "max\n"},
    )
    assert threads.cgroup_cpu_limit(proc, root) == pytest.approx(1.5)


def test_cgroup_v2_without_quota(tmp_path):
    proc, root = _cgroup_tree(tmp_path, "0::/x", {"x/cpu.max": "max 100000\n"})
    assert threads.cgroup_cpu_limit(proc, root) is None


def test_cgroup_v1_cfs_quota(tmp_path):
    proc, root = _cgroup_tree(
        tmp_path,
        "4:cpu,cpuacct:/job",
        {
            "cpu,cpuacct/job/cpu.cfs_quota_us": "300000\n",
            "cpu,cpuacct/job/cpu.cfs_period_us": "100000\n",
        },
    )
    assert threads.cgroup_cpu_limit(proc, root) == pytest.approx(3.0)


def test_cgroup_missing_files(tmp_path):
    assert threads.cgroup_cpu_limit(str(tmp_path / "none"), str(tmp_path)) is None


def test_available_cores_within_affinity(monkeypatch):
    n = threads.available_cores()
    assert 1 <= n <= len(os.sched_getaffinity(0))
    monkeypatch.setattr(threads, "cgroup_cpu_limit", lambda: 0.5)
    assert threads.available_cores() == 1  # a fractional quota rounds down, at least 1


@pytest.mark.parametrize("n_threads", [1, 2, 3])
@pytest.mark.parametrize(
    "shape_a, shape_b, ta, tb",
    [
        ((64, 40), (40, 200), False, False),  # columns cut
        ((300, 40), (40, 24), False, False),  # rows cut
        ((40, 96), (40, 33), True, False),  # transposed views
        ((96, 40), (33, 40), False, True),
        ((7, 20, 12), (7, 12, 18), False, False),  # batch cut
        ((1, 20, 12), (1, 12, 18), False, False),
    ],
)
def test_pool_matmul_matches_numpy(n_threads, shape_a, shape_b, ta, tb):
    rng = np.random.default_rng(0)
    a = rng.normal(size=shape_a).astype(np.float32)
    b = rng.normal(size=shape_b).astype(np.float32)
    a = a.T if ta else a
    b = b.T if tb else b
    out = np.empty(np.matmul(a, b).shape, np.float32)
    got = threads.matmul(a, b, out, n_threads)
    assert got is out
    np.testing.assert_allclose(
        got, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-4
    )


def test_pool_raises_a_chunks_error_and_keeps_working():
    pool = threads.GemmPool(2)
    a = np.ones((4, 3), np.float32)
    outs = [np.empty((4, 2), np.float32) for _ in range(6)]

    def views(k):
        return a, np.ones((3 if k != 3 else 5, 2), np.float32), outs[k]

    with pytest.raises(ValueError):
        pool.run(views, 6, 3)
    pool.run(lambda k: (a, np.full((3, 2), k, np.float32), outs[k]), 6, 3)
    for k, out in enumerate(outs):
        np.testing.assert_array_equal(out, np.full((4, 2), 3.0 * k))


def test_pool_backs_up_a_descheduled_worker():
    # a worker that never runs: the caller computes its chunks itself
    pool = threads.GemmPool(1)
    pool._pid = os.getpid()
    stalled = []
    pool._queues = [type("Stalled", (), {"put": lambda self, job: stalled.append(job)})()]
    a = np.random.default_rng(0).normal(size=(64, 32)).astype(np.float32)
    b = np.random.default_rng(1).normal(size=(32, 96)).astype(np.float32)
    out = np.empty((64, 96), np.float32)
    parts = threads._chunks(96, 4)
    job_views = lambda k: (a, b[:, parts[k][0] : parts[k][1]], out[:, parts[k][0] : parts[k][1]])
    stalled_claim = []

    original = threads._Job.lead

    def lead(job):
        stalled_claim.append(next(job.claim))  # the worker claimed a chunk, then stalled
        original(job)

    threads._Job.lead = lead
    try:
        pool.run(job_views, len(parts), 2)
    finally:
        threads._Job.lead = original
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)
    stalled[0].work()  # the worker wakes up late: nothing left; its result is dropped
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)


class _Clockless(threads.StepThreads):
    """StepThreads seeing a given number of other runnable threads (no /proc reads)."""

    def __init__(self, cores, free=None, others=None):
        super().__init__(cores)
        self.others = others if others is not None else cores - (cores if free is None else free)

    def pick(self):
        old = threads.other_runnable
        threads.other_runnable = lambda: self.others
        try:
            return super().pick()
        finally:
            threads.other_runnable = old


def _drive(policy, cost, calls):
    picks = []
    for _ in range(calls):
        n = policy.pick()
        picks.append(n)
        policy.record(n, cost(n))
    return picks


def test_step_threads_prefers_the_faster_count():
    fast_multi = _Clockless(2, free=2)
    picks = _drive(fast_multi, lambda n: 1.0 / n, 40)
    assert picks[-10:].count(2) >= 9
    slow_multi = _Clockless(2, free=2)
    picks = _drive(slow_multi, lambda n: float(n), 200)
    assert picks[-100:].count(1) >= 95  # probes of 2 threads back off


def test_step_threads_first_call_at_a_count_is_not_a_sample():
    # the first call on 2 threads pays one-time costs (the pool's first job, new heap
    # pages: 9.5 ms against 2 ms measured); it must not make 1 thread look faster
    first = {}

    def cost(n):
        first[n] = first.get(n, 0) + 1
        return 10.0 if first[n] == 1 else 1.0 / n

    policy = _Clockless(2, free=2)
    picks = _drive(policy, cost, 15)  # before the first probe (call 16)
    assert picks[-6:] == [2] * 6
    # one slow sample among the first ones (a preemption) is outvoted too
    slow = {1: [1.0] * 9, 2: [0.5, 9.0] + [0.5] * 9}
    policy = _Clockless(2, free=2)
    assert _drive(policy, lambda n: slow[n].pop(0), 15)[-6:] == [2] * 6


def test_step_threads_backs_off_exponentially():
    policy = _Clockless(2, free=2)
    picks = _drive(policy, lambda n: 5.0 if n == 2 else 1.0, 2000)
    twos = [k for k, n in enumerate(picks) if n == 2][1 + threads.FIRST_SAMPLES :]
    starts = [k for k in twos if k - 1 not in twos]  # each probe: PROBE_CALLS in a row
    assert len(twos) == threads.PROBE_CALLS * len(starts)
    gaps = np.diff(starts)
    assert len(starts) <= 12 and all(g2 >= g1 for g1, g2 in zip(gaps, gaps[1:]))


def test_step_threads_samples_the_counts_in_turns():
    # a process's first calls are slower at every count (caches, heap, idle cores);
    # sampled one count after the other, the later count looked faster or slower by
    # where the slowdown ended. In turns, both see it alike
    warming = iter([3.0, 2.6, 2.2, 1.8, 1.4, 1.2, 1.1] + [1.0] * 100)
    policy = _Clockless(2, free=2)
    picks = _drive(policy, lambda n: next(warming) * (0.7 if n == 2 else 1.0), 15)
    assert picks[:8] == [2, 1, 2, 1, 2, 1, 2, 1]  # warm-ups, then samples, in turns
    assert picks[-6:] == [2] * 6


def test_step_threads_probe_counts_after_its_first_call():
    # the first call of a probe wakes idle cores: slower than the next ones; the
    # probe is judged on the calls after it
    policy = _Clockless(2, free=2)
    _drive(policy, lambda n: 5.0 if n == 2 else 1.0, 20)  # 2 threads lose at first
    assert policy.current == 1
    seen = []

    def cost(n):  # now 2 threads are faster, except right after a switch
        seen.append(n)
        return 1.0 if n == 1 else (1.5 if len(seen) < 2 or seen[-2] != 2 else 0.6)

    picks = _drive(policy, cost, 60)
    assert picks[-10:] == [2] * 10


def test_step_threads_goes_back_up_when_the_machine_frees():
    policy = _Clockless(2, free=2)
    _drive(policy, lambda n: 5.0 if n == 2 else 1.0, 300)  # busy: 2 threads lose
    assert policy.current == 1
    picks = _drive(policy, lambda n: 0.5 if n == 2 else 1.0, 2000)  # free: 2 threads win
    assert picks[-20:] == [2] * 20


def test_free_cores_is_bounded():
    assert 1 <= threads.free_cores(4) <= 4


def test_step_threads_runs_one_thread_on_a_crowded_machine():
    # more other runnable threads than cores: one thread from the first call on
    policy = _Clockless(4, others=5)
    assert set(_drive(policy, lambda n: 1.0 / n, 50)) == {1}
    assert not any(policy.samples.values())  # crowded calls are not samples
    policy.others = 0  # the machine frees up: more threads are tried again
    assert 4 in _drive(policy, lambda n: 1.0 / n, 50)
    assert set(_drive(_Clockless(2, others=3), lambda n: 1.0 / n, 50)) == {1}


def test_step_threads_keeps_the_quiet_choice_while_the_cores_are_shared():
    # beside busy processes (at most as many as cores) a split step gets the share of
    # its threads; wall times there are two clusters (ran through / waited a slice),
    # so they neither count as samples nor change the choice made on a quiet machine
    policy = _Clockless(2, others=0)
    _drive(policy, lambda n: 1.0 / n, 20)
    assert policy.current == 2
    policy.others = 2
    _drive(policy, lambda n: 1.0 / n, 3)  # the average of other threads catches up
    before = {c: list(q) for c, q in policy.samples.items()}
    noisy = iter([10.0, 1.0] * 100)  # 2-thread calls that look slow half of the time
    assert set(_drive(policy, lambda n: next(noisy) if n == 2 else 1.0, 100)) == {2}
    assert {c: list(q) for c, q in policy.samples.items()} == before
    small = _Clockless(2, others=0)  # a step too small to split stays on one thread
    _drive(small, lambda n: float(n), 20)
    small.others = 1
    assert set(_drive(small, lambda n: float(n), 50)) == {1}
    fresh = _Clockless(2, others=2)  # no quiet sample yet: every core
    assert set(_drive(fresh, lambda n: 1.0, 20)) == {2}


def test_step_threads_ignores_a_core_busy_at_every_other_call_only():
    # another library's threads spin for a moment after its calls: seen at one call's
    # start in two, they are not a busy core (the calls stay samples); a process
    # keeping the cores crowded is, from its first sample on
    policy = _Clockless(2)
    picks = []
    for k in range(200):
        policy.others = 1 if k % 2 else 0
        picks.append(policy.pick())
        policy.record(picks[-1], 1.0 / picks[-1])
    assert picks[-50:].count(2) >= 45 and len(policy.samples[2]) == threads.WINDOW
    policy.others = 3  # crowded from now on: one thread once the average has caught up
    assert [policy.pick() for _ in range(12)][-5:] == [1] * 5
    crowded = _Clockless(2, others=3)
    assert set(_drive(crowded, lambda n: 1.0 / n, 50)) == {1}  # from the first call on


def test_step_threads_on_more_cores_tries_half_of_them():
    policy = _Clockless(8)
    assert policy.choices == [1, 4, 8]
    picks = _drive(policy, lambda n: {1: 3.0, 4: 1.0, 8: 2.0}[n], 200)
    assert picks[-50:].count(4) >= 45


def test_blas_runs_on_one_thread_after_a_gemm():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    f = fflow.jit(lambda a, b: a @ b)
    x = np.ones((4, 4), np.float32)
    np.testing.assert_allclose(np.asarray(f(x, x)), x @ x)
    infos = threadpoolctl.threadpool_info()
    assert all(i["num_threads"] == 1 for i in infos if i["user_api"] == "blas")


@pytest.mark.parametrize("fixed", [0, 2])
@pytest.mark.parametrize(
    "spec, shape_a, shape_b",
    [
        ("ij,jk->ik", (96, 256), (256, 384)),  # 19 MFLOP: the pool path
        ("ji,jk->ik", (256, 96), (256, 384)),
        ("ij,kj->ik", (96, 256), (384, 256)),
        ("bij,bjk->bik", (8, 64, 128), (8, 128, 160)),
        ("bhsd,bhtd->bhst", (2, 4, 64, 32), (2, 4, 64, 32)),
        ("bshd,bthd->bhst", (2, 64, 4, 32), (2, 64, 4, 32)),  # batch dims not leading
        ("bsd,de->bse", (4, 32, 64), (64, 48)),
        ("ijk,jkl->il", (16, 8, 12), (8, 12, 20)),  # two contracted dims
    ],
)
def test_jit_dot_general_layouts_match_numpy(fixed, spec, shape_a, shape_b):
    import fflow.numpy as jnp

    rng = np.random.default_rng(1)
    a = rng.normal(size=shape_a).astype(np.float32)
    b = rng.normal(size=shape_b).astype(np.float32)
    fflow.config.update("blas_threads", fixed)
    try:
        f = fflow.jit(lambda x, y: jnp.einsum(spec, x, y))
        got = np.asarray(f(a, b))
        source = f.lower(a, b).source
    finally:
        fflow.config.update("blas_threads", 0)
    want = np.einsum(spec, a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)
    assert "impl_dot_general" not in source  # lowered to matmul over views


def test_grad_of_jitted_mlp_with_pool_matches_numpy():
    import fflow.numpy as jnp

    rng = np.random.default_rng(2)
    x = rng.normal(size=(128, 256)).astype(np.float32)
    w = (rng.normal(size=(256, 384)) * 0.05).astype(np.float32)
    fflow.config.update("blas_threads", 2)
    try:
        g = fflow.jit(fflow.grad(lambda w: jnp.sum(jnp.tanh(x @ w))))(w)
    finally:
        fflow.config.update("blas_threads", 0)
    h = np.tanh(x.astype(np.float64) @ w)
    want = x.T.astype(np.float64) @ (1 - h * h)
    np.testing.assert_allclose(np.asarray(g), want, rtol=1e-3, atol=1e-3)


def test_product_read_transposed_is_computed_in_that_layout():
    import fflow.numpy as jnp

    rng = np.random.default_rng(3)
    a = rng.normal(size=(64, 48)).astype(np.float32)
    b = rng.normal(size=(64, 80)).astype(np.float32)
    w = rng.normal(size=(80, 48)).astype(np.float32)
    f = fflow.jit(lambda a, b, w: w - 0.5 * jnp.transpose(a.T @ b))  # a weight-gradient shape
    np.testing.assert_allclose(np.asarray(f(a, b, w)), w - 0.5 * (a.T @ b).T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_c_pool_matches_numpy_for_every_layout(n_threads):
    from fflow.lowering import cpu_gemm

    rng = np.random.default_rng(4)
    a = rng.normal(size=(96, 70)).astype(np.float32)
    b = rng.normal(size=(70, 130)).astype(np.float32)
    q = rng.normal(size=(2, 40, 3, 16)).astype(np.float32).transpose(0, 2, 1, 3)
    cases = [
        (a, b),
        (a.T.copy().T, b),
        (b.T, a.T),  # both transposed
        (a[:, :50], b[:50]),  # leading dimensions larger than the matrix
        (a[:, ::2], b[::2]),  # not BLAS-able: the Python pool path
        (a[:1], b),
        (q, np.swapaxes(q, -1, -2)),  # two batch dims, attention layout
        (a.astype(np.float64), b.astype(np.float64)),
    ]
    for x, y in cases:
        out = np.empty(np.matmul(x, y).shape, x.dtype)
        assert cpu_gemm.matmul(x, y, out, n_threads) is out
        want = x.astype(np.float64) @ y.astype(np.float64)
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


def test_blas_threads_minus_one_hands_blas_back_and_zero_takes_it_again():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    x = np.ones((4, 4), np.float32)
    fflow.jit(lambda a: a @ a)(x)  # fflow owns BLAS now
    original = {ctl.filepath: count for ctl, count in threads.blas().original}

    def counts():  # the libraries fflow took over (others may have loaded since)
        infos = threadpoolctl.threadpool_info()
        return {i["filepath"]: i["num_threads"] for i in infos if i["filepath"] in original}

    try:
        fflow.config.update("blas_threads", -1)
        assert counts() == original
        np.testing.assert_allclose(np.asarray(fflow.jit(lambda a: a @ a + 1)(x)), x @ x + 1)
    finally:
        fflow.config.update("blas_threads", 0)
    assert set(counts().values()) == {1}


def test_c_pool_in_a_forked_child():
    from fflow.lowering import cpu_gemm

    a = np.random.default_rng(5).normal(size=(64, 80)).astype(np.float32)
    out = np.empty((64, 64), np.float32)
    cpu_gemm.matmul(a, a.T, out, 2)  # the parent's pool threads exist
    pid = os.fork()
    if pid == 0:  # the child has no pool threads: the Python pool takes over
        ok = False
        try:
            child = np.empty((64, 64), np.float32)
            cpu_gemm.matmul(a, a.T, child, 2)
            ok = bool(np.allclose(child, a.astype(np.float64) @ a.T, rtol=1e-4, atol=1e-4))
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0


_KERNEL_SCRIPT = """
import ctypes, numpy as np, threadpoolctl
from fflow.lowering import cpu_gemm
rng = np.random.default_rng(6)
a, b = rng.normal(size=(96, 300)).astype(np.float32), rng.normal(size=(300, 200)).astype(np.float32)
for nt in (1, 2):
    out = np.empty((96, 200), np.float32)
    cpu_gemm.matmul(a, b, out, nt)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
info = [i for i in threadpoolctl.threadpool_info() if i["internal_api"] == "openblas"]
lib = cpu_gemm.kernel_library(info[0]["filepath"])
print(info[0]["architecture"], cpu_gemm._own[0], cpu_gemm._corename(lib).decode())
"""


@pytest.mark.parametrize("kernel", ["auto", "numpy"])
def test_gemm_kernels_of_the_cpu_even_when_openblas_coretype_pins_numpys(kernel, tmp_path):
    """OPENBLAS_CORETYPE=Prescott (SSE3 kernels) pins NumPy's OpenBLAS; fflow's GEMMs
    run the core OpenBLAS detects (blas_kernel "auto") or NumPy's ("numpy")."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    if not any(i["internal_api"] == "openblas" for i in threadpoolctl.threadpool_info()):
        pytest.skip("NumPy's BLAS is not OpenBLAS")

    def run(**env):
        env = dict(os.environ, FFLOW_BLAS_KERNEL=kernel, **env)
        env["FFLOW_CACHE_DIR"] = os.environ.get("FFLOW_CACHE_DIR") or str(tmp_path)
        if env["OPENBLAS_CORETYPE"] is None:
            del env["OPENBLAS_CORETYPE"]
        cmd = [sys.executable, "-c", _KERNEL_SCRIPT]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split()

    detected, own, fflow_core = run(OPENBLAS_CORETYPE=None)
    assert (own, fflow_core) == ("False", detected)  # nothing pinned: NumPy's library
    pinned, own, fflow_core = run(OPENBLAS_CORETYPE="Prescott")
    if pinned == detected:
        pytest.skip(f"this CPU runs the kernels of {pinned} anyway")
    if kernel == "numpy":
        assert (own, fflow_core) == ("False", pinned)
    else:
        assert (own, fflow_core) == ("True", detected)


def test_mid_size_products_run_this_cpus_kernels_when_numpys_are_pinned():
    from fflow.lowering import cpu_gemm

    import fflow.numpy as jnp

    rng = np.random.default_rng(7)
    a = rng.normal(size=(128, 64)).astype(np.float32)
    b = rng.normal(size=(256, 64)).astype(np.float32)
    f = fflow.jit(lambda a, b: jnp.maximum(a @ b.T, 0.0))  # 4 MFLOP, B read transposed
    got = np.asarray(f(a, b))
    np.testing.assert_allclose(got, np.maximum(a.astype(np.float64) @ b.T, 0), rtol=1e-4, atol=1e-4)
    source = f.lower(a, b).source
    assert ("_mm(" in source) == cpu_gemm.own_kernels(), source


@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_two_independent_products_side_by_side_match_numpy(n_threads):
    from fflow.lowering import cpu_gemm

    rng = np.random.default_rng(8)
    h = rng.normal(size=(96, 70)).astype(np.float32)
    g = rng.normal(size=(96, 130)).astype(np.float32)
    w = rng.normal(size=(70, 130)).astype(np.float32)
    cases = [
        (h.T, g, w, g.T),  # the weight and input gradients of one layer
        (
            h.T.astype(np.float64),
            g.astype(np.float64),
            w.astype(np.float64),
            g.T.astype(np.float64),
        ),
        (h.T, g, w[:, ::2], g.T[::2]),  # the second is not BLAS-able: one after the other
    ]
    for a1, b1, a2, b2 in cases:
        o1 = np.empty((a1.shape[0], b1.shape[1]), a1.dtype)
        o2 = np.empty((a2.shape[0], b2.shape[1]), a2.dtype)
        assert cpu_gemm.matmul2(a1, b1, o1, a2, b2, o2, n_threads) is o2
        for a, b, o in ((a1, b1, o1), (a2, b2, o2)):
            np.testing.assert_allclose(o, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_jitted_layer_gradients_run_side_by_side_and_match_numpy():
    import fflow.numpy as jnp

    rng = np.random.default_rng(9)
    x = rng.normal(size=(128, 256)).astype(np.float32)
    w1 = (rng.normal(size=(256, 384)) / 16).astype(np.float32)
    w2 = (rng.normal(size=(384, 256)) / 20).astype(np.float32)

    def loss(w1, w2, x):
        return jnp.sum(jnp.tanh(jnp.tanh(x @ w1) @ w2) ** 2)

    f = fflow.jit(fflow.grad(loss, argnums=(0, 1)))
    g1, g2 = (np.asarray(v, np.float64) for v in f(w1, w2, x))
    assert "_mm2(" in f.lower(w1, w2, x).source  # dW2 and dX2 of the second layer
    x64, w164, w264 = (v.astype(np.float64) for v in (x, w1, w2))
    h = np.tanh(x64 @ w164)
    y = np.tanh(h @ w264)
    dz = 2 * y * (1 - y**2)
    dh = (dz @ w264.T) * (1 - h**2)
    np.testing.assert_allclose(g2, h.T @ dz, rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(g1, x64.T @ dh, rtol=2e-4, atol=2e-4)


_FAULTS_SCRIPT = """
import resource, numpy as np, fflow, fflow.numpy as jnp
def ln(x, g):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mu) * (x - mu), axis=-1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + 1e-5) * g
rng = np.random.default_rng(0)
x = rng.normal(size=(8, 128, 256)).astype(np.float32)
g, w = np.ones(256, np.float32), rng.normal(size=x.shape).astype(np.float32)
f = fflow.jit(fflow.grad(lambda x, g, w: jnp.sum(ln(x, g) * w), argnums=(0, 1)))
for _ in range(3):
    f(x, g, w)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    f(x, g, w)
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 10)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_compiled_steps_do_not_fault_their_temporaries_in_again():
    # a layernorm gradient: 2272 page faults per call (4.2 ms of CPU) with glibc's
    # defaults, as freed heap went back to the OS after every call
    proc = subprocess.run([sys.executable, "-c", _FAULTS_SCRIPT], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) < 50


def _drive_estimated(policy, cost, single, calls):
    """As _drive, each multi-threaded call also saying what one thread would take."""
    picks = []
    for _ in range(calls):
        n = policy.pick()
        picks.append(n)
        policy.record(n, cost(n), single(n) if n > 1 else None)
    return picks


def test_step_threads_spares_one_thread_clearly_estimated_slower():
    # two threads at 1.0, one thread estimated at 1.8 (> CLEAR_MARGIN): after its
    # warm-up call, one thread runs only until the estimates are in, then never again
    policy = _Clockless(2, free=2)
    picks = _drive_estimated(policy, lambda n: 1.0 if n == 2 else 1.9, lambda n: 1.8, 2000)
    assert picks.count(1) <= threads.WARMUP + threads.FIRST_SAMPLES
    assert picks[-1000:].count(1) == 0
    # the same costs without estimates: one thread is sampled and probed
    plain = _drive(_Clockless(2, free=2), lambda n: 1.0 if n == 2 else 1.9, 2000)
    assert plain.count(1) > picks.count(1) + threads.PROBE_CALLS


def test_step_threads_still_probes_one_thread_when_the_estimate_is_close():
    # estimated 1.1x (within CLEAR_MARGIN) and really faster: sampled, and it wins
    policy = _Clockless(2, free=2)
    picks = _drive_estimated(policy, lambda n: 1.0 if n == 2 else 0.8, lambda n: 1.1, 200)
    assert picks[-50:].count(1) >= 45


def test_step_threads_keeps_one_thread_out_when_estimated_clearly_slower():
    # early 1-thread samples that look fast (a noisy start) do not make one thread the
    # choice while the 2-thread calls say one thread would take 1.8x as long
    policy = _Clockless(2, free=2)
    costs = iter([5.0, 5.0, 1.0, 0.5, 1.0, 0.5, 1.0] + [1.0] * 200)
    picks = []
    for _ in range(60):
        n = policy.pick()
        picks.append(n)
        cost = next(costs)
        policy.record(n, cost if n == 2 else min(cost, 0.5), 1.8 if n == 2 else None)
    assert picks[8:].count(1) == 0
