"""The GEMM pool's workers poll for the next job only while a compiled step runs."""

import os
import time

import numpy as np
import pytest
from fflow.lowering import cpu_gemm

from fflow import threads


@pytest.fixture
def quiet(monkeypatch):
    """A machine where nothing else runs (the policy's quiet regime) and a pool."""
    if not cpu_gemm._load():
        pytest.skip("no C compiler: no GEMM pool")
    monkeypatch.setattr(threads, "other_runnable", lambda: 0)


def _cpu_while_sleeping(seconds):
    c0 = time.process_time()
    time.sleep(seconds)
    return time.process_time() - c0


def _begin_on_two(step):
    for _ in range(20):  # the first calls may sample one thread
        n, t0 = step.begin()
        if n == 2:
            return t0
        step.end(n, t0)
    pytest.fail("the policy never gave two threads on a quiet machine")


def test_polling_workers_compute_right_and_stop_at_the_step_end(quiet, monkeypatch):
    monkeypatch.setattr(cpu_gemm, "STEP_SPIN", 5.0)  # a poll that would outlast the test
    rng = np.random.default_rng(0)
    a = rng.normal(size=(128, 96)).astype(np.float32)
    b = rng.normal(size=(96, 160)).astype(np.float32)
    # no BLAS for the reference: NumPy's OpenBLAS threads would spin after it
    want = np.einsum("ik,kj->ij", a.astype(np.float64), b.astype(np.float64))
    step = cpu_gemm.PooledStep(cores=2)
    t0 = _begin_on_two(step)
    before = cpu_gemm.pool_stats()
    for _ in range(3):
        out = cpu_gemm.matmul(a, b, np.empty((128, 160), np.float32), 2)
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    after = cpu_gemm.pool_stats()
    done = ("caller chunks", "worker chunks", "backups kept")  # each chunk once
    chunks = sum(after[k] - before[k] for k in done)
    assert chunks == 3 * 2  # one chunk per thread while the workers poll
    polled = _cpu_while_sleeping(0.05)  # between the step's jobs a worker polls
    step.end(2, t0)
    time.sleep(0.005)
    after = _cpu_while_sleeping(0.05)  # after the step's end nothing spins
    assert polled > 0.01, polled  # (a fifth of a core, even beside another process)
    assert after < 0.01, after


def test_a_step_records_what_one_thread_would_take(quiet):
    a = np.ones((256, 256), np.float32)
    step = cpu_gemm.PooledStep(cores=2)
    seen = []
    step.record = lambda n, seconds, single=None: seen.append((n, seconds, single))
    before = cpu_gemm.pool_stats()["worker chunk seconds"]
    for _ in range(6):
        n, t0 = step.begin()
        cpu_gemm.matmul(a, a, np.empty_like(a), n)
        step.end(n, t0)
    worker = cpu_gemm.pool_stats()["worker chunk seconds"] - before
    two = [(s, one) for n, s, one in seen if n == 2]
    # one thread: the wall time plus the chunks the workers computed (on a busy
    # machine a worker may compute none: then the caller did them all)
    assert two and all(one is not None and one >= s for s, one in two)
    assert sum(one - s for s, one in two) == pytest.approx(worker, rel=1e-6, abs=1e-9)
    assert all(one is None for n, _, one in seen if n == 1)


def test_polling_workers_keep_off_the_callers_cpu(quiet, monkeypatch):
    # a VM's idle vCPU looks preempted, so a woken worker lands on its waker's CPU and
    # polls there with the caller preempted: while a step polls, no worker may run on
    # the caller's CPU; a step on a busy machine lets them run anywhere again
    mask = os.sched_getaffinity(0)
    if len(mask) < 2:
        pytest.skip("one CPU: nothing to keep off")
    tids = cpu_gemm.worker_tids()
    assert tids
    step = cpu_gemm.PooledStep(cores=2)
    for _ in range(50):  # until the caller did not move to another CPU around begin()
        before = _caller_cpu()
        t0 = _begin_on_two(step)
        here = _caller_cpu()
        if here == before:
            break
        step.end(2, t0)
    else:
        pytest.skip("the caller kept moving between CPUs")
    for tid in tids:
        assert os.sched_getaffinity(tid) == mask - {here}
    step.end(2, t0)
    monkeypatch.setattr(threads, "other_runnable", lambda: 1)  # another process appears
    step.samples[1].extend([1.0] * threads.WINDOW)  # one thread was slow when quiet
    for _ in range(20):
        n, t0 = step.begin()
        step.end(n, t0)
        if not step.timed:  # a shared machine's call: no polling, workers anywhere
            break
    assert n == 2 and not step.timed
    for tid in tids:
        assert os.sched_getaffinity(tid) == mask


def _caller_cpu():
    """The CPU this thread last ran on (field 39 of /proc/thread-self/stat)."""
    with open("/proc/thread-self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])
