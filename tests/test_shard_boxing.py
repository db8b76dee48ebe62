"""Boxing: every SBP conversion on 1-D and 2-D meshes (uneven splits included) gives the
reference value, and the bytes the runtime measured equal the cost model's."""

import itertools

import numpy as np
import pytest
from fflow.transforms.shard_boxing import boxing_bytes, plan_boxing
from hypothesis import given, settings
from hypothesis import strategies as st

import fflow
from fflow.sharding import (
    B,
    P,
    S,
    global_from_shards,
    local_box,
    partial_max,
    partial_min,
    runtime,
    scatter_global,
)

ONE_D = [S(0), S(1), B, P, partial_max, partial_min]


def _placement(h):
    return fflow.placement("cpu", np.arange(int(np.prod(h))).reshape(h).tolist())


def make_global(x, nd, pl, seed):
    """A global array of logical value `x` whose partial shards are genuinely partial."""
    shards = scatter_global(x, nd, pl)
    rng = np.random.default_rng(seed)
    noise = {}
    for m, s in enumerate(nd):
        if not s.is_partial():
            continue
        for i in range(pl.size):
            c = pl.coords(i)
            if c[m] == 0:
                continue
            # replicas along B and other P axes must stay equal: key on split coords only
            key = (m, c[m]) + tuple(v for a, v in enumerate(c) if nd[a].is_split())
            if key not in noise:
                noise[key] = rng.uniform(0.5, 1.5, size=shards[i].shape).astype(x.dtype)
            base = list(c)
            base[m] = 0
            j = pl.index_of(base)
            if s.op == "sum":
                shards[i] = shards[i] + noise[key]
                shards[j] = shards[j] - noise[key]
            elif s.op == "max":
                shards[i] = shards[i] - noise[key]
            else:
                shards[i] = shards[i] + noise[key]
    return global_from_shards(shards, x.shape, pl, nd)


def check_conversion(x, src, dst, pl, seed=0):
    g = make_global(x, src, pl, seed)
    np.testing.assert_allclose(np.asarray(g), x, rtol=1e-5, atol=1e-5)
    rt = runtime()
    before = rt.bytes_moved
    y = g.to_global(sbp=dst)
    measured = rt.bytes_moved - before
    assert y.sbp == dst
    np.testing.assert_allclose(np.asarray(y), x, rtol=1e-5, atol=1e-5)
    if not any(s.is_partial() for s in dst):
        for i, shard in enumerate(y.to_local_shards()):
            box = local_box(x.shape, dst, pl.hierarchy, pl.coords(i))
            want = x[tuple(slice(a, b) for a, b in box)]
            np.testing.assert_allclose(np.asarray(shard), want, rtol=1e-5, atol=1e-5)
    assert measured == boxing_bytes(x.shape, x.dtype, pl.hierarchy, src, dst), (src, dst)
    return measured


@pytest.mark.parametrize("p", [2, 3, 4])
def test_all_1d_conversions(p):
    pl = _placement((p,))
    rng = np.random.default_rng(p)
    for shape in [(7, 5), (8, 4)]:  # uneven and even
        x = rng.normal(size=shape).astype(np.float32)
        for src in ONE_D:
            for dst in ONE_D:
                check_conversion(x, (src,), (dst,), pl)


@settings(max_examples=40, deadline=None)
@given(
    src=st.tuples(st.sampled_from(ONE_D), st.sampled_from(ONE_D)),
    dst=st.tuples(st.sampled_from(ONE_D), st.sampled_from(ONE_D)),
    rows=st.integers(4, 9),
    cols=st.integers(4, 7),
    seed=st.integers(0, 1000),
)
def test_2d_mesh_conversions(src, dst, rows, cols, seed):
    pl = _placement((2, 2))
    x = np.random.default_rng(seed).normal(size=(rows, cols)).astype(np.float32)
    check_conversion(x, src, dst, pl, seed)


def test_2x3_mesh_and_exchange_fallback():
    pl = _placement((2, 3))
    x = np.random.default_rng(1).normal(size=(13, 7)).astype(np.float32)
    for src, dst in [
        ((S(0), B), (S(0), S(0))),
        ((S(0), S(0)), (S(1), S(0))),
        ((S(0), S(1)), (S(1), S(0))),
        ((P, S(0)), (B, B)),
        ((S(1), P), (S(0), partial_max)),
    ]:
        check_conversion(x, src, dst, pl)
    assert (
        "exchange" in plan_boxing(x.shape, x.dtype, (2, 3), (S(0), B), (S(0), S(0))).collectives()
    )


def test_cost_model_matches_oneflow_formulas():
    t = 8 * 12 * 4  # bytes of a f32[8,12]
    p = 4
    h = (p,)
    shape, dt = (8, 12), np.float32
    assert boxing_bytes(shape, dt, h, (P,), (B,)) == 2 * (p - 1) * t
    assert boxing_bytes(shape, dt, h, (P,), (S(0),)) == (p - 1) * t
    assert boxing_bytes(shape, dt, h, (S(0),), (B,)) == (p - 1) * t
    assert boxing_bytes(shape, dt, h, (S(0),), (S(1),)) == (p - 1) * t // p
    assert boxing_bytes(shape, dt, h, (B,), (S(1),)) == 0
    assert boxing_bytes(shape, dt, h, (B,), (P,)) == 0
    assert boxing_bytes(shape, dt, h, (S(1),), (P,)) == 0
    # 2-D: (P, S0) -> (B, B) reduces over the first axis on halves, then gathers
    assert boxing_bytes(shape, dt, (2, 2), (S(0), P), (S(0), B)) == 2 * (2 * 1 * t // 2)
    bp = plan_boxing(shape, dt, (2, 2), (P, P), (B, B))
    assert bp.collectives() == ["all_reduce"] and bp.bytes == 2 * 3 * t  # merged to one group


def test_size_one_axes_and_merged_axes_are_canonical():
    pl = _placement((1, 4))
    x = np.arange(20.0, dtype=np.float32).reshape(5, 4)
    g = fflow.to_global(x, pl, (B, S(0)))
    assert [s.shape for s in g.to_local_shards()] == [(2, 4), (1, 4), (1, 4), (1, 4)]
    assert plan_boxing((5, 4), np.float32, (1, 4), (S(1), S(0)), (B, S(0))).steps == []
    pl2 = _placement((2, 2))
    g2 = fflow.to_global(x, pl2, (S(0), S(0)))  # merged: one balanced 4-way split
    assert [s.shape[0] for s in g2.to_local_shards()] == [2, 1, 1, 1]
    assert check_conversion(x, (S(0), S(0)), (B, B), pl2) == 3 * x.nbytes


def test_exchange_bytes_counts_what_the_exchange_plan_sends():
    # the planner prices the general exchange by a per-device formula; the runtime
    # sends the messages exchange_plan lists: both must agree
    from fflow.transforms.shard_boxing import exchange_bytes, exchange_plan

    sbps = [B, S(0), S(1), S(2)]
    for h in ((2, 2), (2, 3), (3, 2)):
        for shape in ((4, 6, 5), (7, 3, 2)):
            for src in itertools.product(sbps, repeat=2):
                for dst in itertools.product(sbps, repeat=2):
                    want = exchange_plan(shape, 4, h, src, dst)[1]
                    assert exchange_bytes(shape, 4, h, src, dst) == want, (h, shape, src, dst)


def test_plans_of_evenly_split_shapes_scale_from_a_small_one():
    # plan_boxing plans (8, 12, 5) as (4, 4, 5) and scales; the direct plan must agree
    from fflow.transforms.shard_boxing import _plan

    sbps = [B, P, S(0), S(1), S(2)]
    for src in itertools.product(sbps, repeat=2):
        for dst in itertools.product(sbps, repeat=2):
            got = plan_boxing((8, 12, 5), np.float32, (2, 2), src, dst)
            want = _plan((8, 12, 5), 4, (2, 2), src, dst)
            assert [s.bytes for s in got.steps] == [s.bytes for s in want.steps], (src, dst)
            assert got.collectives() == want.collectives()


@pytest.mark.parametrize("h", [(2, 2), (2, 4)])
def test_nested_split_on_the_inner_mesh_axis_is_one_collective(h):
    # (S(0), P) -> (S(0), S(0)) is one reduce-scatter on mesh axis 1 inside axis 0's
    # halves (device (a0, a1) gets chunk a0*n1 + a1), half the bytes of the all-reduce
    # and slice planned before; gathers, slices and all-to-alls nest the same way
    pl = _placement(h)
    n1 = h[1]
    x = np.random.default_rng(3).normal(size=(8, 6)).astype(np.float32)
    t = x.nbytes
    want = {
        ((S(0), P), (S(0), S(0))): ("reduce_scatter", (n1 - 1) * t),  # was 2 (n1-1) t
        ((S(0), S(0)), (S(0), B)): ("all_gather", (n1 - 1) * t),
        ((S(0), B), (S(0), S(0))): ("shard_slice", 0),
        ((S(0), S(1)), (S(0), S(0))): ("all_to_all", t - t // n1),
    }
    for (src, dst), (op, nbytes) in want.items():
        bp = plan_boxing(x.shape, x.dtype, h, src, dst)
        assert [s.describe().split("[")[0] for s in bp.steps] == [op], (src, dst)
        assert bp.steps[0].axes == (1,)
        assert check_conversion(x, src, dst, pl) == nbytes, (src, dst)
    # the outer axis cannot split inside the inner one's pieces (wrong chunk order),
    # and uneven rows (6 over 2x2: nested 2,1,2,1 vs the layout's 2,2,1,1) are refused
    for shape, src in [((8, 6), (P, S(0))), ((3 * h[1], 5), (S(0), P))]:
        x = np.random.default_rng(4).normal(size=shape).astype(np.float32)
        bp = plan_boxing(shape, x.dtype, h, src, (S(0), S(0)))
        assert "reduce_scatter" not in bp.collectives()
        check_conversion(x, src, (S(0), S(0)), pl)
