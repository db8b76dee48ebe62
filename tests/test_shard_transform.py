"""The shard transform: planning (Megatron, data parallel, search), printing, composition
with grad / jit / vmap, with_sbp, eager global arrays and user errors."""

import itertools
import os

import numpy as np
import pytest
from fflow.transforms.shard_boxing import boxing_bytes
from fflow.transforms.shard_rules import signatures

import fflow
import fflow.numpy as jnp
from fflow.sharding import B, P, S, partial_max


def pl(n=4):
    return fflow.placement("cpu", list(range(n)))


def pl2x2():
    return fflow.placement("cpu", [[0, 1], [2, 3]])


rng = np.random.default_rng(0)


def rand(*shape):
    return rng.normal(size=shape).astype(np.float32)


def mlp(x, w1, w2):
    return jnp.tanh(x @ w1) @ w2


def np_mlp(x, w1, w2):
    return np.tanh(x @ w1) @ w2


# ----------------------------------------------------------------------------
# planning


def test_megatron_plan_from_weight_annotations_has_one_all_reduce():
    x, w1, w2 = rand(8, 16), rand(16, 32), rand(32, 16)
    f = fflow.shard(mlp, pl(), in_sbp=(None, S(1), S(0)))
    sp = f.plan(x, w1, w2)
    assert sp.collectives() == ["all_reduce"]
    assert sp.bytes == 2 * 3 * 8 * 16 * 4
    text = str(sp)
    assert "{S(1)}" in text and "{P}" in text and "all_reduce" in text and "bytes per call" in text
    y = f(x, w1, w2)
    assert y.sbp == (B,)
    np.testing.assert_allclose(np.asarray(y), np_mlp(x, w1, w2), rtol=1e-4, atol=1e-4)


def test_megatron_2d_mesh_data_times_model():
    x, w1, w2 = rand(8, 16), rand(16, 32), rand(32, 16)
    f = fflow.shard(mlp, pl2x2(), in_sbp=((S(0), B), (B, S(1)), (B, S(0))), out_sbp=(S(0), B))
    sp = f.plan(x, w1, w2)
    assert sp.collectives() == ["all_reduce"]
    ((_, _, src, dst, bp),) = sp.boxings()
    assert src == (S(0), P) and dst == (S(0), B)
    assert bp.bytes == 2 * 1 * 8 * 16 * 4  # two groups of 2, each a half batch
    np.testing.assert_allclose(np.asarray(f(x, w1, w2)), np_mlp(x, w1, w2), rtol=1e-4, atol=1e-4)


def loss_fn(params, x, y):
    w1, w2 = params
    return jnp.mean((mlp(x, w1, w2) - y) ** 2)


def test_data_parallel_has_one_all_reduce_per_gradient():
    params = (rand(16, 8), rand(8, 4))
    x, y = rand(256, 16), rand(256, 4)
    step = fflow.shard(fflow.value_and_grad(loss_fn), pl(), in_sbp=((B, B), S(0), S(0)), out_sbp=B)
    sp = step.plan(params, x, y)
    # one all-reduce per gradient and the loss (before or after a transpose: same bytes)
    assert sp.collectives() == ["all_reduce"] * 3
    assert sp.bytes == 2 * 3 * (16 * 8 + 8 * 4 + 1) * 4
    loss, grads = step(params, x, y)
    ref_loss, ref_grads = fflow.value_and_grad(loss_fn)(params, x, y)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    for g, r in zip(grads, ref_grads):
        assert g.sbp == (B,)
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-6)


def test_grad_of_shard_data_parallel_gradient_all_reduce_appears_by_itself():
    params = (rand(16, 8), rand(8, 4))
    x, y = rand(256, 16), rand(256, 4)
    sharded_loss = fflow.shard(loss_fn, pl(), in_sbp=((B, B), S(0), S(0)))
    grads = fflow.grad(sharded_loss)(params, x, y)
    ref = fflow.grad(loss_fn)(params, x, y)
    for g, r in zip(grads, ref):
        assert g.sbp == (B,)
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-6)
    tsp = [d for d in _derived_programs(sharded_loss) if d.name == "transpose"][0]
    # one all-reduce per gradient (at the output or before its last transpose)
    assert tsp.collectives() == ["all_reduce", "all_reduce"]


def _derived_programs(sharded):
    out = []
    for sp, _ in sharded.cache.values():
        stack = [sp]
        while stack:
            cur = stack.pop()
            for d in getattr(cur, "derived", {}).values():
                items = d if isinstance(d, tuple) else (d,)
                for it in items:
                    if hasattr(it, "plan"):
                        out.append(it)
                        stack.append(it)
    return out


def test_planner_search_equals_brute_force_minimum():
    # small programs: the planner's bytes equal the minimum over every signature choice
    cases = [
        (lambda a, b: jnp.sum(a @ b, axis=0), (rand(6, 5), rand(5, 7)), (S(1), S(0)), B),
        (lambda a, b: jnp.tanh(a) * b, (rand(6, 5), rand(6, 5)), (S(0), S(1)), S(1)),
        (lambda a: jnp.max(a, axis=1) + 1.0, (rand(6, 5),), (S(1),), B),
        (lambda a, b: (a.T @ b).sum(), (rand(8, 3), rand(8, 3)), (S(0), S(0)), B),
    ]
    p = pl()
    for f, args, in_sbp, out_sbp in cases:
        sp = fflow.shard(f, p, in_sbp=in_sbp, out_sbp=out_sbp).plan(*args)
        assert sp.bytes == _brute_force(sp)


def _brute_force(sp):
    prog, h = sp.program, sp.placement.hierarchy
    cands = [
        signatures(
            e.primitive, [v.aval for v in e.inputs], [v.aval for v in e.outputs], e.params, h
        )
        for e in prog.eqns
    ]
    best = None
    for choice in itertools.product(*cands):
        var = dict(zip(prog.invars, sp.in_sbps))
        total = 0
        done = set()  # a value converted once serves every consumer
        needs = []
        for e, sig in zip(prog.eqns, choice):
            needs += [(v, want, var.get(v, (B,))) for v, want in zip(e.inputs, sig.ins)]
            var.update(zip(e.outputs, sig.outs))
        needs += [(v, want, var[v]) for v, want in zip(prog.outvars, sp.out_sbps)]
        for v, want, have in needs:
            if have != want and (id(v), want) not in done:
                done.add((id(v), want))
                total += boxing_bytes(v.aval.shape, v.aval.dtype, h, have, want)
        best = total if best is None else min(best, total)
    return best


def test_with_sbp_constraint_forces_a_conversion():
    x, w = rand(8, 6), rand(6, 4)

    def f(x, w):
        h = fflow.with_sbp(x @ w, S(1))
        return jnp.sin(h)

    g = fflow.shard(f, pl(2), in_sbp=(S(0), B), out_sbp=S(1))
    sp = g.plan(x, w)
    assert sp.collectives() == ["all_to_all"]
    assert "sbp_constraint" in str(sp)
    np.testing.assert_allclose(np.asarray(g(x, w)), np.sin(x @ w), rtol=1e-5, atol=1e-5)


def test_partial_max_reduction_needs_no_all_gather():
    x = rand(10, 6)
    f = fflow.shard(lambda x: jnp.max(x, axis=0), pl(), in_sbp=S(0))
    sp = f.plan(x)
    assert sp.collectives() == ["all_reduce"]
    assert any(s == (partial_max,) for s in sp.plan.var_sbp.values())
    np.testing.assert_allclose(np.asarray(f(x)), x.max(axis=0))


# ----------------------------------------------------------------------------
# composition


def test_shard_of_grad_and_jit_of_both():
    params = (rand(16, 8), rand(8, 4))
    x, y = rand(32, 16), rand(32, 4)
    ref = fflow.grad(loss_fn)(params, x, y)
    a = fflow.jit(fflow.shard(fflow.grad(loss_fn), pl(), in_sbp=((B, B), S(0), S(0))))
    b = fflow.jit(fflow.grad(fflow.shard(loss_fn, pl(), in_sbp=((S(1), S(0)), B, B))))
    for fn in (a, b):
        for g, r in zip(fn(params, x, y), ref):
            np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-6)


def test_vmap_inside_and_outside_shard():
    x, w = rand(5, 6, 4), rand(4, 3)

    def per_example(xi, w):
        return jnp.tanh(xi @ w).sum(axis=0)

    f = fflow.shard(fflow.vmap(per_example, in_axes=(0, None)), pl(), in_sbp=(S(0), B))
    want = np.tanh(x @ w).sum(axis=1)
    np.testing.assert_allclose(np.asarray(f(x, w)), want, rtol=1e-5, atol=1e-5)
    g = fflow.vmap(fflow.shard(per_example, pl(2), in_sbp=(S(0), B)), in_axes=(0, None))
    np.testing.assert_allclose(np.asarray(g(x, w)), want, rtol=1e-5, atol=1e-5)


def test_control_flow_runs_broadcast():
    x = rand(6, 4)

    def f(x):
        y = fflow.lax.cond(x.sum() > 0, lambda v: v * 2.0, lambda v: v - 1.0, x)
        y = fflow.lax.fori_loop(0, 3, lambda i, v: v + 1.0, y)
        return fflow.lax.scan(lambda c, r: (c + r, c), jnp.zeros(4), y)[0]

    g = fflow.shard(f, pl(), in_sbp=S(0))
    np.testing.assert_allclose(np.asarray(g(x)), np.asarray(f(x)), rtol=1e-5, atol=1e-5)


def test_sharded_random_numbers_equal_unsharded():
    key = fflow.random.PRNGKey(3)

    def f(key):
        return fflow.random.normal(key, (9, 4))

    for out in (S(0), S(1)):
        g = fflow.shard(f, pl(), out_sbp=out)
        y = g(key)
        assert y.sbp == (out,)
        np.testing.assert_array_equal(np.asarray(y), np.asarray(f(key)))
        assert g.plan(key).bytes == 0


# ----------------------------------------------------------------------------
# eager global arrays


def test_eager_global_arrays_run_op_by_op():
    p = pl()
    a = rand(7, 5)
    x = fflow.to_global(a, p, S(0))
    w = fflow.to_global(rand(5, 3), p, B)
    y = jnp.tanh(x @ w) + 1.0
    assert y.sbp == (S(0),)
    s = jnp.sum(y, axis=0)
    assert s.sbp == (P,)  # eager results may stay partial, as in OneFlow
    np.testing.assert_allclose(np.asarray(s), (np.tanh(a @ np.asarray(w)) + 1).sum(0), rtol=1e-5)
    b = s.to_global(sbp=B)
    assert b.sbp == (B,) and b.placement == p
    loc = x.to_local()
    assert loc.shape == (2, 5) and loc.placement is None
    assert np.asarray(jnp.max(x)) == a.max()


def test_global_arrays_feed_sharded_functions_without_reboxing():
    p = pl()
    x = fflow.to_global(rand(8, 4), p, S(0))
    f = fflow.shard(lambda v: v * 3.0, p)
    y = f(x)
    assert y.sbp == (S(0),) and f.plan(x).bytes == 0


# ----------------------------------------------------------------------------
# user errors name the user's line

HERE = os.path.basename(__file__)


def test_error_split_axis_out_of_range():
    with pytest.raises(ValueError) as e:
        fflow.to_global(np.ones((4, 4), np.float32), pl(), S(2))
    assert "split(2)" in str(e.value) and HERE in str(e.value)


def test_error_placement_device_count():
    with pytest.raises(ValueError) as e:
        fflow.placement("cpu", list(range(64)))
    assert "devices" in str(e.value) and HERE in str(e.value)


def test_error_mixing_placements():
    x = fflow.to_global(np.ones(4, np.float32), pl(2), S(0))
    y = fflow.to_global(np.ones(4, np.float32), fflow.placement("cpu", [2, 3]), S(0))
    with pytest.raises(ValueError) as e:
        x + y
    assert "placements" in str(e.value) and HERE in str(e.value)
    f = fflow.shard(lambda v: v + 1, pl(4))  # a global input on another placement moves
    y = f(x)
    assert y.placement == pl(4)
    np.testing.assert_array_equal(np.asarray(y), np.full(4, 2.0, np.float32))


def test_error_sbp_does_not_fit_shape():
    f = fflow.shard(lambda v: v + 1, pl(4), in_sbp=S(0))
    with pytest.raises(ValueError) as e:
        f(np.ones((2, 3), np.float32))
    assert "split(0)" in str(e.value) and HERE in str(e.value)
    with pytest.raises(ValueError) as e:
        fflow.shard(lambda v: v, pl2x2(), in_sbp=S(0))(np.ones((4, 4), np.float32))
    assert "mesh axis" in str(e.value) and HERE in str(e.value)


def test_closures_over_traced_values_and_global_arrays():
    x = np.arange(6, dtype=np.float32)
    p = pl(2)

    def outer(w):
        return fflow.shard(lambda v: jnp.sum(jnp.sin(v * w)), p, in_sbp=S(0))(x)

    got = fflow.grad(outer)(np.float32(1.5))
    np.testing.assert_allclose(float(got), float(np.sum(np.cos(1.5 * x) * x)), rtol=1e-5)
    np.testing.assert_allclose(float(fflow.jit(outer)(np.float32(1.5))), np.sin(1.5 * x).sum(),
                               rtol=1e-5)  # fmt: skip
    g = fflow.to_global(np.full(6, 2.0, np.float32), p, S(0))
    out = fflow.shard(lambda v: v + g, p, in_sbp=S(0))(x)
    np.testing.assert_array_equal(np.asarray(out), x + 2.0)


def test_custom_rules_and_checkpoint_inside_shard():
    @fflow.custom_jvp
    def f(x):
        return jnp.tanh(x)

    @f.defjvp
    def f_jvp(primals, tangents):
        (x,), (tx,) = primals, tangents
        y = jnp.tanh(x)
        return y, tx * (1 - y * y)

    @fflow.custom_vjp
    def g(x):
        return jnp.sin(x)

    g.defvjp(lambda x: (jnp.sin(x), jnp.cos(x)), lambda c, ct: (ct * c,))

    def loss(w, x):
        return jnp.sum(fflow.checkpoint(lambda h: g(f(h)) * 2.0)(x @ w))

    w, x = rand(3, 2), rand(8, 3)
    sharded = fflow.shard(loss, pl(2), in_sbp=(B, S(0)))
    sp = sharded.plan(w, x)
    assert "tanh" in str(sp) and sp.collectives() == ["all_reduce"]  # bodies were inlined
    np.testing.assert_allclose(float(sharded(w, x)), float(loss(w, x)), rtol=1e-5)
    want = np.asarray(fflow.grad(loss)(w, x))
    for got in (
        fflow.grad(sharded)(w, x),
        fflow.shard(fflow.grad(loss), pl(2), in_sbp=(B, S(0)))(w, x),
    ):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


def test_nested_shard_on_the_same_placement_is_inlined_with_constraints():
    p = pl(2)
    inner = fflow.shard(lambda a: jnp.tanh(a) * 2.0, p, in_sbp=S(0), out_sbp=S(1))
    outer = fflow.shard(lambda a, w: jnp.sum(inner(a @ w)), p, in_sbp=(S(0), B))
    a, w = rand(4, 3), rand(3, 2)
    sp = outer.plan(a, w)
    assert "shard_call" not in str(sp) and sp.count("all_to_all") == 1
    np.testing.assert_allclose(float(outer(a, w)), np.sum(np.tanh(a @ w) * 2), rtol=1e-5)


def test_partial_sums_reduce_before_narrowing_casts():
    x, w = rand(4, 8), rand(8, 3)
    f = fflow.shard(lambda x, w: (x @ w).astype(jnp.float16), pl(2), in_sbp=(S(1), S(0)))
    sp = f.plan(x, w)
    (reduced,) = [v for _, v, _, _, bp in sp.boxings() if bp.bytes]
    assert reduced.aval.dtype == np.float32  # the f32 partials are summed, then cast once
    got = np.asarray(f(x, w)).astype(np.float32)
    np.testing.assert_allclose(got, (x @ w).astype(np.float16), rtol=1e-3, atol=1e-3)
