"""Collective primitives on per-device programs: results vs NumPy, transposes by the
adjoint identity sum_d <A x, y> == sum_d <x, A^T y>, JVPs vs finite differences, and
batching rules vs a loop over the batch. Programs run on the simulated runtime."""

import numpy as np
import pytest
from fflow.primitives import collectives as coll
from fflow.transforms.staging import trace_to_program

import fflow
from fflow.core import ShapedArray, set_current_trace
from fflow.sharding import balanced, runtime

P_DEV = 3


def placement():
    return fflow.placement("cpu", list(range(P_DEV)))


def common(d):
    return dict(group=tuple(range(P_DEV)), index=d, placement=placement())


def linear_ops():
    """name -> (fn(x, d) binding the collective on device d, input shape of device d)."""
    rows = balanced(7, P_DEV)  # uneven: 3, 2, 2
    cols = balanced(5, P_DEV)
    return {
        "all_reduce": (lambda x, d: coll.all_reduce_p.bind(x, op="sum", **common(d)),
                       lambda d: (7, 5)),
        "all_gather": (lambda x, d: coll.all_gather_p.bind(x, axis=0, sizes=tuple(rows),
                                                           **common(d)),
                       lambda d: (rows[d], 5)),
        "reduce_scatter": (lambda x, d: coll.reduce_scatter_p.bind(
            x, op="sum", axis=1, sizes=tuple(cols), **common(d)), lambda d: (7, 5)),
        "all_to_all": (lambda x, d: coll.all_to_all_p.bind(
            x, in_axis=0, out_axis=1, in_sizes=tuple(rows), out_sizes=tuple(cols), **common(d)),
            lambda d: (rows[d], 5)),
        "shard_slice": (lambda x, d: coll.shard_slice_p.bind(x, axis=0, sizes=tuple(rows),
                                                             **common(d)),
                        lambda d: (7, 5)),
        "shard_pad": (lambda x, d: coll.shard_pad_p.bind(x, axis=0, sizes=tuple(rows), fill=0,
                                                         **common(d)),
                      lambda d: (rows[d], 5)),
        "keep_one": (lambda x, d: coll.keep_one_p.bind(x, **common(d)), lambda d: (7, 5)),
        "exchange": (lambda x, d: coll.exchange_p.bind(
            # rows 0:2 go to the next device, rows 2:4 stay; a ring shift of the first half
            x, sends=(((d + 1) % P_DEV, ((0, 2), (0, 5))),),
            recvs=(((d - 1) % P_DEV, ((0, 2), (0, 5))),),
            local=((((2, 4), (0, 5)), ((2, 4), (0, 5))),),
            out_shape=(4, 5), accumulate=False, **common(d)), lambda d: (4, 5)),
    }  # fmt: skip


def per_device(fn_of_device, in_avals_of_device):
    with set_current_trace(_root()):
        return [
            trace_to_program(lambda *xs, d=d: _listify(fn_of_device(d, *xs)), in_avals_of_device(d))
            for d in range(P_DEV)
        ]


def _listify(out):
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _root():
    from fflow.array import root_trace

    return root_trace


def run(programs, args):
    return runtime().run_programs(programs, args)


def aval(shape):
    return ShapedArray(shape, np.float32)


def rand(shape, seed):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def test_collective_results_match_numpy():
    ops = linear_ops()
    xs = [rand((balanced(7, P_DEV)[d], 5), d) for d in range(P_DEV)]
    fn, _ = ops["all_gather"]
    progs = per_device(lambda d, x: fn(x, d), lambda d: [aval(xs[d].shape)])
    outs = run(progs, [[x] for x in xs])
    for (o,) in outs:
        np.testing.assert_array_equal(o, np.concatenate(xs))
    full = [rand((7, 5), 10 + d) for d in range(P_DEV)]
    fn, _ = ops["reduce_scatter"]
    progs = per_device(lambda d, x: fn(x, d), lambda d: [aval((7, 5))])
    outs = run(progs, [[x] for x in full])
    total = full[0] + full[1] + full[2]
    bounds = np.cumsum([0] + balanced(5, P_DEV))
    for d, (o,) in enumerate(outs):
        np.testing.assert_allclose(o, total[:, bounds[d] : bounds[d + 1]], rtol=1e-6)
    progs = per_device(
        lambda d, x: coll.all_reduce_p.bind(x, op="max", **common(d)), lambda d: [aval((7, 5))]
    )
    for (o,) in run(progs, [[x] for x in full]):
        np.testing.assert_array_equal(o, np.maximum(np.maximum(full[0], full[1]), full[2]))


@pytest.mark.parametrize("name", sorted(linear_ops()))
def test_transpose_is_the_adjoint(name):
    fn, shape_of = linear_ops()[name]
    fwd = per_device(lambda d, x: fn(x, d), lambda d: [aval(shape_of(d))])
    xs = [rand(shape_of(d), d) for d in range(P_DEV)]
    ys_shape = [run(fwd, [[x] for x in xs])[d][0].shape for d in range(P_DEV)]
    outs = run(fwd, [[x] for x in xs])
    ys = [rand(ys_shape[d], 20 + d) for d in range(P_DEV)]

    def transpose_fn(d, x, ct):
        _, vjp = fflow.vjp(lambda v: fn(v, d), x)
        return vjp(ct)[0]

    bwd = per_device(transpose_fn, lambda d: [aval(shape_of(d)), aval(ys_shape[d])])
    cts = run(bwd, [[x, y] for x, y in zip(xs, ys)])
    lhs = sum(float(np.vdot(o[0], y)) for o, y in zip(outs, ys))
    rhs = sum(float(np.vdot(x, c[0])) for x, c in zip(xs, cts))
    np.testing.assert_allclose(lhs, rhs, rtol=1e-4)


@pytest.mark.parametrize("op", ["max", "min", "sum"])
def test_all_reduce_jvp_matches_finite_differences(op):
    def f(d, x):
        return coll.all_reduce_p.bind(fflow.numpy.sin(x), op=op, **common(d))

    def jvp_fn(d, x, t):
        return fflow.jvp(lambda v: f(d, v), (x,), (t,))[1]

    xs = [rand((4, 3), d) for d in range(P_DEV)]
    ts = [rand((4, 3), 30 + d) for d in range(P_DEV)]
    prog = per_device(jvp_fn, lambda d: [aval((4, 3)), aval((4, 3))])
    tangents = run(prog, [[x, t] for x, t in zip(xs, ts)])
    fwd = per_device(f, lambda d: [aval((4, 3))])
    eps = 1e-3
    plus = run(fwd, [[(x + eps * t).astype(np.float32)] for x, t in zip(xs, ts)])
    minus = run(fwd, [[(x - eps * t).astype(np.float32)] for x, t in zip(xs, ts)])
    for d in range(P_DEV):
        fd = (plus[d][0] - minus[d][0]) / (2 * eps)
        np.testing.assert_allclose(tangents[d][0], fd, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("name", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                  "shard_slice", "shard_pad", "keep_one", "exchange"])  # fmt: skip
def test_batching_rule_matches_a_loop(name):
    fn, shape_of = linear_ops()[name]
    nb = 2
    batched = per_device(
        lambda d, x: fflow.vmap(lambda v: fn(v, d))(x), lambda d: [aval((nb,) + shape_of(d))]
    )
    xs = [rand((nb,) + shape_of(d), 40 + d) for d in range(P_DEV)]
    got = run(batched, [[x] for x in xs])
    single = per_device(lambda d, x: fn(x, d), lambda d: [aval(shape_of(d))])
    for b in range(nb):
        want = run(single, [[x[b]] for x in xs])
        for d in range(P_DEV):
            np.testing.assert_allclose(got[d][0][b], want[d][0], rtol=1e-6)
