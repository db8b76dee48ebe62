"""The shared IR passes: DCE, CSE, constant folding (NaN-safe), fusion, liveness."""

import numpy as np
from fflow.lowering import passes
from fflow.lowering.pad_sums import fold_pad_sums
from hypothesis import given, settings
from hypothesis import strategies as st

import fflow
import fflow.numpy as jnp


def prims(program):
    return [e.primitive.name for e in program.eqns]


def test_dce_drops_unused_and_keeps_effects():
    def f(x):
        _unused = jnp.sin(x) * 3
        fflow.debug.print("x={}", x)
        return x + 1

    program = fflow.make_jaxpr(f)(jnp.ones(3))
    out = passes.dce(program)
    assert "sin" not in prims(out)
    assert "debug_callback" in prims(out)


def test_cse_merges_duplicates_but_not_effects():
    def f(x):
        fflow.debug.print("a {}", x)
        fflow.debug.print("a {}", x)
        return jnp.sin(x) + jnp.sin(x)

    program = fflow.make_jaxpr(f)(jnp.ones(3))
    out = passes.cse(program)
    assert prims(out).count("sin") == 1
    assert prims(out).count("debug_callback") == 2


def test_cse_keeps_signed_zero_and_nan_literals_apart():
    def f(x):
        return x * 0.0 + x * -0.0

    # merging -0.0 into 0.0 would give -0.0 + -0.0 = -0.0 at x = -1 (NumPy: +0.0); -0.0 ==
    # 0.0, so the check compares sign bits
    x = np.asarray([-1.0, 2.0, np.inf], np.float32)
    ref = x * np.float32(0.0) + x * np.float32(-0.0)
    out = np.asarray(fflow.jit(f)(jnp.asarray(x)))
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(np.signbit(out), np.signbit(ref))
    assert prims(passes.cse(fflow.make_jaxpr(f)(jnp.asarray(x)))).count("mul") == 2


def test_constant_folding_keeps_nan_semantics():
    f = fflow.jit(lambda x: 1 + x * 0)
    assert np.isnan(float(f(jnp.float32(np.nan))))
    assert np.isnan(float(f(jnp.float32(np.inf))))
    g = fflow.jit(lambda x: x - x)
    assert np.isnan(float(g(jnp.float32(np.inf))))


def test_constant_folding_evaluates_constant_subexpressions():
    def f(x):
        c = jnp.exp(jnp.float32(2.0)) * 3.0
        return x * c

    program = fflow.make_jaxpr(f)(jnp.ones(3))
    folded = passes.fold_constants(program)
    assert "exp" not in prims(passes.dce(folded))
    np.testing.assert_array_equal(fflow.jit(f)(jnp.ones(3)), f(jnp.ones(3)))


def test_fusion_groups_have_one_output_and_valid_order():
    def f(x, y):
        a = jnp.tanh(x * 2 + y)
        b = a @ y.T  # not elementwise: splits
        return jnp.exp(b) * 3 - 1, a

    program = fflow.make_jaxpr(f)(jnp.ones((3, 3)), jnp.ones((3, 3)))
    steps = passes.fusion_groups(program)
    groups = [s for s in steps if isinstance(s, passes.FusionGroup)]
    assert len(groups) == 2
    defined = set(program.invars) | set(program.constvars)
    for s in steps:
        for v in passes.step_inputs(s):
            assert v in defined, "a step reads a value not yet computed"
        defined.update(s.outputs)
    for g in groups:
        assert len(g.outputs) == 1
        assert all(e.outputs[0].aval.shape == g.shape for e in g.eqns)


def test_liveness_counts_views():
    def f(x):
        y = x * 2
        z = y.reshape(-1)  # a view of y
        w = y + 1
        return z, w

    program = fflow.make_jaxpr(f)(jnp.ones((2, 2)))
    steps = passes.fusion_groups(program, min_size=10)
    live = passes.liveness(steps, program.outvars)
    y = program.eqns[1].outputs[0]
    # y itself dies at the add, but its view z is an output: the buffer stays alive
    add_step = [
        i
        for i, s in enumerate(steps)
        if getattr(s, "primitive", None) is not None and s.primitive.name == "add"
    ][0]
    assert live.dead_after(y, add_step)
    assert not live.buffer_dead_after(y, add_step)
    out = fflow.jit(f)(jnp.ones((2, 2)))
    np.testing.assert_array_equal(out[0], np.full(4, 2.0, np.float32))
    np.testing.assert_array_equal(out[1], np.full((2, 2), 3.0, np.float32))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from(["mul", "add", "sin", "dup", "reuse"]), min_size=1, max_size=8))
def test_passes_preserve_results(ops):
    def f(x, y):
        vals = [x, y]
        for op in ops:
            a, b = vals[-1], vals[-2]
            if op == "mul":
                vals.append(a * b)
            elif op == "add":
                vals.append(a + 1.5)
            elif op == "sin":
                vals.append(jnp.sin(a))
            elif op == "dup":
                vals.append(jnp.sin(a) + jnp.sin(a))
            else:
                vals.append(vals[0] * a)
        return vals[-1], vals[len(vals) // 2]

    x = jnp.asarray(np.linspace(-1, 1, 6, dtype=np.float32))
    y = jnp.asarray(np.linspace(2, 3, 6, dtype=np.float32))
    for e, j in zip(f(x, y), fflow.jit(f)(x, y)):
        np.testing.assert_array_equal(e, j)


def test_cast_round_trip_folds_only_when_exact():
    def f(x):
        up = x.astype(np.float32).astype(np.float16)  # exact: f16 -> f32 -> f16
        down = x.astype(np.float16).astype(np.float32)  # not a round trip of x's dtype
        return up, down

    x = jnp.asarray(np.array([1.0009765625, 65504.0, np.nan], np.float16))
    program = passes.fold_cast_round_trips(fflow.make_jaxpr(f)(x))
    assert prims(program).count("convert_element_type") == 1
    for e, j in zip(f(x), fflow.jit(f)(x)):
        np.testing.assert_array_equal(np.asarray(e), np.asarray(j))
    g = lambda v: v.astype(np.float16).astype(np.float32)  # narrowing: never folded
    v = jnp.asarray(np.array([1.0001], np.float32))
    np.testing.assert_array_equal(fflow.jit(g)(v), g(v))


def test_checkpoint_and_custom_calls_run_compiled():
    @fflow.checkpoint
    def block(x):
        return jnp.sin(x) * jnp.cos(x)

    f = fflow.jit(fflow.grad(lambda x: jnp.sum(block(x) ** 2)))
    x = jnp.linspace(0.0, 1.0, 5)
    np.testing.assert_allclose(f(x), fflow.grad(lambda x: jnp.sum(block(x) ** 2))(x), rtol=1e-6)


def test_outputs_aliasing_inputs_are_never_overwritten():
    from fflow import lax_control

    def f(x):
        y = x * 2  # a fresh buffer...
        z = lax_control.cond(x[0] > 0, lambda a: a, lambda a: a + 1, y)  # ...maybe returned
        w = jnp.exp(y)  # y is dead here: an in-place exp would clobber z
        return z, w

    x = jnp.asarray([1.0, 2.0])
    z, w = fflow.jit(f)(x)
    np.testing.assert_array_equal(z, [2.0, 4.0])
    np.testing.assert_array_equal(w, np.exp(np.asarray([2.0, 4.0], np.float32)))


def test_view_trait_covers_every_primitive_whose_result_shares_its_input():
    # independent of the trait table: run each one-operand primitive's NumPy impl and
    # look at the memory; a result sharing the input must carry the trait "view"
    # (liveness then keeps the input's buffer alive while the view lives)
    from fflow.core import primitives

    x = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    params = {
        "reshape": {"new_sizes": (3, 2)},
        "transpose": {"permutation": (1, 0)},
        "broadcast_in_dim": {"shape": (2, 3), "broadcast_dimensions": (0, 1)},
        "squeeze": {"dimensions": ()},
        "slice": {"start_indices": (0, 0), "limit_indices": (2, 2), "strides": None},
        "rev": {"dimensions": (0,)},
        "stop_gradient": {},
        "convert_element_type": {"new_dtype": np.dtype(np.float32), "weak_type": False},
        "integer_pow": {"y": 1},
    }
    for name, kw in params.items():
        prim = primitives[name]
        out = prim.impl(x, **kw)
        if np.shares_memory(np.asarray(out), x):
            assert "view" in prim.traits, name
    for name in ("sin", "exp", "neg"):  # fresh results: no trait, so buffers get reused
        assert not np.shares_memory(primitives[name].impl(x), x)
        assert "view" not in primitives[name].traits


def test_sum_of_padded_pieces_becomes_one_concatenate():
    # the gradient of q, k, v = qkv[..., :4], [..., 4:8], [..., 8:] (and of a middle
    # part of an axis, which keeps one pad) against the same function un-jitted
    def f(x):
        q, k, v = x[..., :4], x[..., 4:8], x[..., 8:]
        return jnp.sum(jnp.tanh(q) * k * v)

    def g(x):
        return jnp.sum(jnp.tanh(x[:, 1:3]) * x[:, 3:5])  # columns 1:5 of 12

    x = np.random.default_rng(0).normal(size=(2, 3, 12)).astype(np.float32)
    for fn, xx, pads in ((f, x, 0), (g, x[0], 1)):
        prog = fold_pad_sums(fflow.make_jaxpr(fflow.grad(fn))(xx).jaxpr)
        names = [e.primitive.name for e in prog.eqns]
        assert names.count("pad") == pads and names.count("concatenate") == 1
        want = fflow.grad(fn)(xx)  # eager: three pads and their sum
        np.testing.assert_array_equal(fflow.jit(fflow.grad(fn))(xx), want)
