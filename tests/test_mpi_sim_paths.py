"""The distributed runtime's paths on simulated devices (the MPI side runs in
tests/test_shard_mpi.py): make_global_array, closed-over global arrays, jit of a
sharded function, reading partial values."""

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp
from fflow.errors import ShapeError
from fflow.sharding import B, P, S, partial_max


def test_make_global_array_from_per_device_pieces_equals_numpy():
    pl = fflow.placement("cpu", [[0, 1], [2, 3]])
    full = np.arange(7 * 6, dtype=np.float32).reshape(7, 6)
    rows = np.array_split(full, 2, axis=0)  # balanced: 4 + 3 rows

    def piece(i):
        r, c = pl.coords(i)
        return np.array_split(rows[r], 2, axis=1)[c]

    x = fflow.make_global_array(piece, pl, (S(0), S(1)))
    assert x.shape == (7, 6) and x.sbp == (S(0), S(1))
    np.testing.assert_array_equal(np.asarray(x), full)
    # partial values: the logical value is the sum of what each device passed
    parts = [np.full((3,), i + 1.0, np.float32) for i in range(4)]
    p = fflow.make_global_array(parts, pl, (P, P))
    np.testing.assert_array_equal(np.asarray(p), np.full((3,), 10.0))
    m = fflow.make_global_array(parts, fflow.placement("cpu", [0, 1, 2, 3]), partial_max)
    np.testing.assert_array_equal(np.asarray(m), np.full((3,), 4.0))


def test_eager_ops_on_a_made_global_array_in_a_fresh_process():
    # nothing else loaded transforms/shard.py: the eager dispatch for global arrays is
    # installed by `import fflow` itself (it multiplied the local pieces before)
    import subprocess
    import sys

    code = (
        "import fflow, numpy as np\n"
        "pl = fflow.placement('cpu', [0, 1])\n"
        "x = fflow.make_global_array(lambda i: np.full((2, 3), i + 1.0, np.float32), pl,"
        " fflow.sbp.split(0))\n"
        "y = (x * 2).to_global(sbp=fflow.sbp.broadcast)\n"
        "print(y.sbp, np.asarray(y)[:, 0].tolist())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    expected = (np.repeat([1.0, 2.0], 2) * 2).tolist()
    assert out.stdout.strip() == f"(B,) {expected}"


def test_make_global_array_names_the_device_and_both_shapes():
    pl = fflow.placement("cpu", [0, 1, 2])
    shards = [np.zeros((2, 5), np.float32)] * 2 + [np.zeros((2, 4), np.float32)]
    with pytest.raises(ShapeError, match=r"device 2 passed a shard of shape \(2, 4\).*\(2, 5\)"):
        fflow.make_global_array(shards, pl, S(0))
    with pytest.raises(ValueError, match="one per device"):
        fflow.make_global_array(shards[:2], pl, S(0))
    with pytest.raises(ValueError, match="list of shards"):
        fflow.make_global_array(shards[0], pl, S(0))
    unbalanced = [np.zeros((1, 5), np.float32), np.zeros((3, 5), np.float32)]
    with pytest.raises(ShapeError, match="balanced"):
        fflow.make_global_array(unbalanced, fflow.placement("cpu", [0, 1]), S(0))


def test_shard_closing_over_a_global_array_traces_once():
    pl = fflow.placement("cpu", [0, 1])
    w = fflow.to_global(np.arange(6.0, dtype=np.float32).reshape(3, 2), pl, S(1))
    f = fflow.shard(lambda x: jnp.tanh(x @ w), pl, in_sbp=S(0))
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    want = np.tanh(x @ np.asarray(w))
    for _ in range(3):
        np.testing.assert_allclose(np.asarray(f(x)), want, rtol=1e-6)
    assert f.trace_count == 1


def test_jit_of_shard_equals_the_function():
    pl = fflow.placement("cpu", [0, 1, 2])

    def f(x, w):
        return jnp.sum(jnp.tanh(x @ w), axis=0)

    x = np.linspace(-2, 2, 5 * 4, dtype=np.float32).reshape(5, 4)
    w = np.linspace(-1, 1, 4 * 3, dtype=np.float32).reshape(4, 3)
    js = fflow.jit(fflow.shard(f, pl, in_sbp=(S(0), B)))
    want = np.tanh(x @ w).sum(0)
    for _ in range(2):
        np.testing.assert_allclose(np.asarray(js(x, w)), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("outs", [1, 2])
def test_jit_of_shard_on_one_device_runs_its_segment_directly(outs):
    # one simulated device, no collectives: jit's executable calls the compiled segment
    # (one input and one output: the segment itself; more: the runner's list)
    pl = fflow.placement("cpu", [0])
    f = (lambda x: x * 2 + 1) if outs == 1 else (lambda x: (x * 2 + 1, jnp.sin(x)))
    js = fflow.jit(fflow.shard(f, pl, in_sbp=B, out_sbp=B))
    x = np.linspace(-1, 1, 6, dtype=np.float32)
    gx = fflow.to_global(x, pl, B)
    got = [js(gx) for _ in range(3)]
    for y in got:
        y = y if outs == 1 else y[0]
        assert y.placement == pl and y.sharding.sbp == (B,)
        np.testing.assert_allclose(np.asarray(y), x * 2 + 1, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(jnp.sum(y)), (x * 2 + 1).sum(), rtol=1e-5)
    if outs == 2:
        np.testing.assert_allclose(np.asarray(got[-1][1]), np.sin(x), rtol=1e-6)
    assert js.trace_count == 1


@pytest.mark.parametrize("devices", [[0], [0, 1]])
def test_jit_of_shard_on_global_arrays_equals_numpy_and_hits_its_cache(devices):
    # a cache hit runs the one shard_call of the jitted program directly (no re-binding)
    pl = fflow.placement("cpu", devices)
    f = fflow.shard(lambda x, w: (jnp.tanh(x @ w), x, 3.0), pl, in_sbp=(S(0), B))
    js = fflow.jit(f)
    x = np.linspace(-2, 2, 4 * 3, dtype=np.float32).reshape(4, 3)
    w = np.linspace(-1, 1, 3 * 2, dtype=np.float32).reshape(3, 2)
    gx, gw = fflow.to_global(x, pl, S(0)), fflow.to_global(w, pl, B)
    for _ in range(3):
        y, same, three = js(gx, gw)
        np.testing.assert_allclose(np.asarray(y), np.tanh(x @ w), rtol=1e-6)
        np.testing.assert_array_equal(np.asarray(same), x)
        assert float(three) == 3.0
    assert js.trace_count == 1 and y.placement == pl
    # a local input next to a global one, and the AOT executable, give the same numbers
    np.testing.assert_allclose(np.asarray(js(gx, w)[0]), np.tanh(x @ w), rtol=1e-6)
    compiled = js.lower(gx, gw).compile()
    np.testing.assert_allclose(np.asarray(compiled(gx, gw)[0]), np.tanh(x @ w), rtol=1e-6)


def test_gradient_buckets_change_no_number_and_show_in_the_plan():
    pl = fflow.placement("cpu", [0, 1, 2, 3])

    def loss(params, x):
        h = x
        for w, b in params:
            h = jnp.tanh(h @ w + b)
        return jnp.mean(h**2)

    rng = np.random.default_rng(0)
    params = [(rng.normal(size=(6, 6)).astype(np.float32), np.zeros(6, np.float32))] * 3
    x = rng.normal(size=(10, 6)).astype(np.float32)
    ref = fflow.grad(loss)(params, x)
    got = {}
    step = fflow.shard(lambda p, x: fflow.grad(loss)(p, x), pl, in_sbp=(B, S(0)), out_sbp=B)
    try:
        for mb in (0.0, 0.0001, 25.0):
            fflow.config.update("grad_bucket_mb", mb)
            g = fflow.grad(fflow.shard(loss, pl, in_sbp=(B, S(0))))(params, x)
            got[mb] = [np.asarray(a) for a in fflow.tree_util.tree_leaves(g)]
            text = str(step.plan(params, x))
            if mb == 0.0:
                assert "gradient buckets" not in text
            else:  # one bucket per gradient, or one for all six; the gradient computed
                # last has nothing left to hide behind and stays a plain all_reduce
                assert text.count("  bucket ") == (5 if mb < 1 else 1), text
    finally:
        fflow.config.update("grad_bucket_mb", 25.0)
    for a, b, c, r in zip(got[0.0], got[0.0001], got[25.0], fflow.tree_util.tree_leaves(ref)):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
        np.testing.assert_allclose(a, np.asarray(r), rtol=1e-5, atol=1e-6)


def test_a_lone_all_reduce_with_nothing_to_overlap_is_not_a_bucket():
    """P -> B of a program's input: no equation to hide it behind, so a plain collective
    (one call, no packing) with the same numbers as NumPy's sum of the partial values."""
    pl = fflow.placement("cpu", [0, 1])
    parts = [np.arange(6, dtype=np.float32) * (k + 1) for k in range(2)]
    g = fflow.make_global_array(lambda i: parts[i], pl, P)
    ident = fflow.shard(lambda v: v, pl, in_sbp=P, out_sbp=B)
    assert "gradient buckets" not in str(ident.plan(g))
    np.testing.assert_array_equal(np.asarray(ident(g)), parts[0] + parts[1])


def test_cache_hit_call_uses_numpy_inputs_in_place_but_never_aliases_them():
    # the fast call path borrows a caller's NumPy buffer (no defensive copy) and
    # copies an output that would alias it: a later write must not show through
    pl = fflow.placement("cpu", [0, 1])
    f = fflow.shard(lambda x, y: (x, y * 2.0, x.sum()), pl, in_sbp=(B, S(0)))
    x = np.arange(6, dtype=np.float32)
    y = np.arange(4, dtype=np.float64)  # narrowed to float32, as in JAX
    for _ in range(3):
        a, b, s = f(x, y)
    assert f.trace_count == 1
    want_a, want_b = x.copy(), (y * 2.0).astype(np.float32)
    x[:] = -1.0
    np.testing.assert_array_equal(np.asarray(a), want_a)
    np.testing.assert_array_equal(np.asarray(b), want_b)
    assert float(s) == 15.0 and np.asarray(b).dtype == np.float32
    # other argument kinds take the full path and give the same numbers
    np.testing.assert_array_equal(np.asarray(f(np.arange(6.0), y)[0]), np.arange(6.0))
    g = fflow.shard(lambda x, k: x * k, pl, in_sbp=(S(0), B))
    np.testing.assert_array_equal(np.asarray(g(np.ones(4, np.float32), 3.0)), np.full(4, 3.0))
    np.testing.assert_array_equal(np.asarray(g(np.ones(4, np.float32), 2)), np.full(4, 2.0))


def test_planned_all_reduce_buffers_stay_within_the_keep_budget(monkeypatch):
    """Planned all-reduces (mpi_ops.planned) keep one result buffer per (shape, dtype),
    at most mpi_ops.KEEP_BYTES in all; past that budget they take the general path,
    whose buffers come from the capped `_empty`."""
    from fflow import mpi_ops

    class Comm:  # two members; only what planning reads
        Iallgather = Iallreduce = Ialltoall = None

        def Get_size(self):
            return 2

        def Get_rank(self):
            return 0

    monkeypatch.setattr(mpi_ops, "_cells", {})
    monkeypatch.setattr(mpi_ops, "_cell_bytes", [0])
    monkeypatch.setattr(mpi_ops, "KEEP_BYTES", 4096)
    monkeypatch.setattr(mpi_ops, "_shm", [False])  # MPI's own paths: the window has its own budget

    def plan(n):  # float32 max of 2 members: the one-all-gather path, rows (2, n)
        return mpi_ops.planned("all_reduce", Comm(), (0, 1), {"op": "max"}, (n,), np.float32)

    assert plan(256).__name__ == "rows"  # (2, 256) float32: 2 KB kept
    assert plan(256).__name__ == "rows"  # the same buffer again: nothing more kept
    assert mpi_ops._cell_bytes[0] == 2048
    assert plan(512).__name__ == "general"  # 4 KB more would pass the 4 KB budget
    assert plan(128).__name__ == "rows"  # 1 KB still fits
    assert mpi_ops._cell_bytes[0] == 3072
