"""amp: the rewritten program (casts, classes, folding), policies, accumulation,
master weights and composition with grad / jit / vmap.

References are the un-rewritten fp32 function and NumPy; the structural tests read
the equations of the rewritten program."""

import ml_dtypes
import numpy as np
import pytest

import fflow
import fflow.numpy as jnp
from fflow.experimental import enable_x64

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
LOW = {"bf16": BF16, "fp16": F16}


def log_softmax(z):
    shifted = z - jnp.max(z, axis=-1, keepdims=True)
    return shifted - jnp.log(jnp.sum(jnp.exp(shifted), axis=-1, keepdims=True))


def predict(params, x):
    h = jnp.maximum(x @ params["w1"] + params["b1"], 0.0)
    return h @ params["w2"] + params["b2"]


def loss_fn(params, x, y):
    logp = log_softmax(predict(params, x))
    one_hot = (y[:, None] == jnp.arange(4)[None, :]).astype(jnp.float32)
    return -jnp.mean(jnp.sum(one_hot * logp, axis=-1))


def make_mlp(seed=0, n=16, d=8, h=32):
    rng = np.random.default_rng(seed)
    params = {
        "w1": jnp.asarray((rng.normal(size=(d, h)) / np.sqrt(d)).astype(np.float32)),
        "b1": jnp.asarray(rng.normal(size=h).astype(np.float32) * 0.1),
        "w2": jnp.asarray((rng.normal(size=(h, 4)) / np.sqrt(h)).astype(np.float32)),
        "b2": jnp.zeros(4),
    }
    x = jnp.asarray(rng.normal(size=(n, d)).astype(np.float32))
    y = jnp.asarray(rng.integers(0, 4, n).astype(np.int32))
    return params, x, y


def eqns_of(program, name):
    return [e for e in program.eqns if e.primitive.name == name]


def producers(program):
    return {e.outputs[0]: e for e in program.eqns if len(e.outputs) == 1}


def as_np(x):
    return np.asarray(x, dtype=np.float64)


# ----------------------------------------------------------------------------
# The rewritten program


@pytest.mark.parametrize("policy", ["bf16", "fp16"])
def test_mlp_program_has_low_matmuls_and_fp32_softmax(policy):
    params, x, y = make_mlp()
    low = LOW[policy]
    plain = fflow.make_jaxpr(loss_fn)(params, x, y)
    assert not eqns_of(plain, "convert_element_type") or all(
        e.inputs[0].aval.dtype.kind == "b" for e in eqns_of(plain, "convert_element_type")
    )
    prog = fflow.make_jaxpr(fflow.amp(loss_fn, policy))(params, x, y)
    dots = eqns_of(prog, "dot_general")
    assert len(dots) == 2
    for e in dots:
        assert [v.aval.dtype for v in e.inputs] == [low, low]
        # fp32 accumulation is explicit in the program
        assert e.params["preferred_element_type"] == F32
        assert e.outputs[0].aval.dtype == F32
    for name in ("exp", "log", "reduce_sum"):
        found = eqns_of(prog, name)
        assert found, name
        for e in found:
            assert e.inputs[0].aval.dtype == F32, (name, e)
            assert e.outputs[0].aval.dtype == F32, (name, e)
    # master weights: the program's inputs and output keep the caller's dtypes
    assert [v.aval.dtype for v in prog.invars] == [v.aval.dtype for v in plain.invars]
    assert [v.aval for v in prog.outvars] == [v.aval for v in plain.outvars]
    # printing shows the casts
    assert f"convert_element_type[new_dtype={'bf16' if policy == 'bf16' else 'f16'}" in str(prog)


def test_casts_fold_and_are_not_repeated():
    params, x, y = make_mlp()

    def f(params, x):
        # w1 feeds two matmuls: cast once; the second matmul's fp32 consumer
        # (exp) reads the fp32 accumulator, not a bf16 -> f32 round trip
        a = x @ params["w1"]
        b = (x * 0.5) @ params["w1"]
        return jnp.sum(jnp.exp(jnp.tanh(a) + b * 0.0)) + jnp.sum(jnp.exp(b))

    prog = fflow.make_jaxpr(fflow.amp(f, "bf16"))(params, x)
    converts = eqns_of(prog, "convert_element_type")
    keys = [(id(e.inputs[0]), e.params["new_dtype"]) for e in converts]
    assert len(keys) == len(set(keys)), "the same value was cast to the same dtype twice"
    prod = producers(prog)
    for e in converts:
        src = prod.get(e.inputs[0])
        if src is not None and src.primitive.name == "convert_element_type":
            # back-to-back AMP casts fold: never down and straight back up
            assert src.inputs[0].aval.dtype != e.params["new_dtype"], str(prog)


def test_weak_scalars_do_not_widen_low_values():
    def f(w, x):
        return jnp.tanh(x @ w) * 2.0 + 1.0

    w = jnp.ones((3, 2))
    x = jnp.ones((4, 3))
    prog = fflow.make_jaxpr(fflow.amp(f, "bf16"))(w, x)
    for name in ("tanh", "mul", "add"):
        (e,) = eqns_of(prog, name)
        assert e.outputs[0].aval.dtype == BF16, str(prog)
    # one cast back to the caller's dtype at the very end
    assert prog.outvars[0].aval.dtype == F32
    assert eqns_of(prog, "convert_element_type")[-1].outputs[0] is prog.outvars[0]


def test_follow_promotes_to_the_widest_input():
    def f(w, x, b):
        return (x @ w) + b  # bf16 matmul + f32 bias -> f32 add

    prog = fflow.make_jaxpr(fflow.amp(f, "bf16"))(jnp.ones((3, 2)), jnp.ones((4, 3)), jnp.ones(2))
    (add,) = eqns_of(prog, "add")
    assert [v.aval.dtype for v in add.inputs] == [F32, F32]


def test_float64_and_integers_are_left_alone():
    def f(a, b, i):
        return jnp.sum(a @ b), i * 3 + 1

    with enable_x64():  # float64 on purpose
        a = np.ones((3, 3), np.float64)
        i = jnp.arange(4)
        prog = fflow.make_jaxpr(fflow.amp(f, "bf16"))(a, a, i)
        assert not eqns_of(prog, "convert_element_type"), str(prog)
        (s, j) = fflow.amp(f, "bf16")(a, a, i)
        assert s.dtype == np.float64 and float(s) == 27.0
        assert j.dtype == i.dtype and j.tolist() == [1, 4, 7, 10]


def test_explicit_user_casts_are_honoured():
    def f(w, x):
        h = (x @ w).astype(jnp.float32)
        return h.astype(jnp.float16)

    out = fflow.amp(f, "bf16")(jnp.ones((3, 2)), jnp.ones((4, 3)))
    assert out.dtype == F16
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.full((4, 2), 3.0))


# ----------------------------------------------------------------------------
# Policies


def test_policy_overrides_change_classes():
    params, x, y = make_mlp()
    keep_dot = fflow.amp.Policy("bf16", overrides={"dot_general": "deny"})
    prog = fflow.make_jaxpr(fflow.amp(loss_fn, keep_dot))(params, x, y)
    assert all(v.aval.dtype == F32 for e in eqns_of(prog, "dot_general") for v in e.inputs)
    from fflow.primitives.unary import exp_p

    low_exp = fflow.amp.Policy("fp16", overrides={exp_p: "allow", "log": "low"})
    prog = fflow.make_jaxpr(fflow.amp(loss_fn, low_exp))(params, x, y)
    for name in ("exp", "log"):
        assert all(e.inputs[0].aval.dtype == F16 for e in eqns_of(prog, name)), name
    assert low_exp.class_of("reduce_sum") == "fp32" and low_exp.class_of("add") == "follow"


def test_policy_param_and_output_dtypes():
    pol = fflow.amp.Policy("bf16", param_dtype="bf16", output_dtype="bf16")
    f = fflow.amp(lambda w, x: jnp.tanh(x @ w), pol)
    prog = fflow.make_jaxpr(f)(jnp.ones((3, 2)), jnp.ones((4, 3)))
    assert prog.eqns[0].primitive.name == "convert_element_type"
    assert prog.outvars[0].aval.dtype == BF16
    assert f(jnp.ones((3, 2)), jnp.ones((4, 3))).dtype == BF16
    p = fflow.amp.Policy.resolve("params=float32,compute=float16,output=float32")
    assert (p.param_dtype, p.compute_dtype, p.output_dtype) == (F32, F16, F32)
    tree = p.cast_to_compute({"a": jnp.ones(2), "i": jnp.arange(2)})
    assert tree["a"].dtype == F16 and tree["i"].dtype == np.int32


def test_bad_policies_raise_user_errors():
    with pytest.raises(ValueError, match="unknown policy"):
        fflow.amp(lambda x: x, "fp8")
    with pytest.raises(TypeError, match="function first"):
        fflow.amp("bf16", lambda x: x)
    with pytest.raises(ValueError, match="not a primitive"):
        fflow.amp.Policy("bf16", overrides={"matmul_typo": "low"})
    with pytest.raises(ValueError, match="not an AMP class"):
        fflow.amp.Policy("bf16", overrides={"exp": "sometimes"})


# ----------------------------------------------------------------------------
# Numbers and accumulation


@pytest.mark.parametrize("policy,tol", [("bf16", 2e-2), ("fp16", 3e-3)])
def test_mlp_loss_and_grads_close_to_fp32(policy, tol):
    # relative-norm tolerances: ~5x the unit roundoff (bf16 2^-8, fp16 2^-11). A seed
    # with no relu input within rounding of 0 (a flipped relu mask is a legitimate
    # difference of a whole sample's contribution, not an AMP error).
    params, x, y = make_mlp(seed=0)
    ref_loss = float(loss_fn(params, x, y))
    ref_grads = fflow.grad(loss_fn)(params, x, y)
    loss = fflow.amp(loss_fn, policy)(params, x, y)
    assert loss.dtype == F32
    assert abs(float(loss) - ref_loss) <= tol * (1 + abs(ref_loss))
    for grads in (
        fflow.grad(fflow.amp(loss_fn, policy))(params, x, y),
        fflow.amp(fflow.grad(loss_fn), policy)(params, x, y),
    ):
        for k, g in grads.items():
            assert g.dtype == F32, k  # gradients reach the optimizer in fp32
            r = as_np(ref_grads[k])
            err = np.linalg.norm(as_np(g) - r) / np.linalg.norm(r)
            assert err <= tol, (k, err)


def test_low_precision_sums_and_matmuls_accumulate_in_fp32():
    n = 3000  # bf16 running sums stall at 256; fp16 loses integers above 2048
    total = fflow.jit(lambda v: (jnp.sum(v), jnp.cumsum(v)[-1]))
    for dt in (BF16, F16):
        ones = jnp.asarray(np.ones(n, dt))
        assert float(jnp.sum(ones)) == pytest.approx(n, rel=4e-3)
        assert float(jnp.cumsum(ones)[-1]) == pytest.approx(n, rel=4e-3)
        for t in total(ones):  # and in the compiled NumPy backend
            assert t.dtype == dt and float(t) == pytest.approx(n, rel=4e-3)
        a = jnp.asarray(np.ones((2, n), dt))
        assert float((a @ a.T)[0, 0]) == pytest.approx(n, rel=4e-3)
        assert float(fflow.jit(lambda m: m @ m.T)(a)[0, 0]) == pytest.approx(n, rel=4e-3)
    # under amp, an f32 sum stays f32 and an amp matmul accumulates in f32
    x = jnp.asarray(np.full((1, 1001), 1.0, np.float32))
    out = fflow.amp(lambda a, b: a @ b, "bf16")(x, x.T)
    assert float(out[0, 0]) == 1001.0  # the folded fp32 accumulator, exact


def test_eager_python_control_flow_under_amp():
    def f(w, x):
        h = x @ w
        if float(jnp.sum(h)) > 0:  # concrete under eager amp
            return jnp.sum(jnp.exp(h))
        return jnp.sum(h)

    w = jnp.ones((3, 2))
    x = jnp.ones((4, 3))
    assert float(fflow.amp(f, "bf16")(w, x)) == pytest.approx(float(f(w, x)), rel=1e-2)


def test_rewrite_program():
    params, x, y = make_mlp()
    prog = fflow.make_jaxpr(loss_fn)(params, x, y)
    new = fflow.amp.rewrite_program(prog, "fp16")
    assert [v.aval for v in new.invars] == [v.aval for v in prog.invars]
    assert all(v.aval.dtype == F16 for e in eqns_of(new, "dot_general") for v in e.inputs)


# ----------------------------------------------------------------------------
# Composition


def test_jit_of_amp_matches_eager_amp():
    params, x, y = make_mlp(seed=2)
    f = fflow.amp(fflow.value_and_grad(loss_fn), "bf16")
    loss_e, g_e = f(params, x, y)
    loss_j, g_j = fflow.jit(f)(params, x, y)
    np.testing.assert_allclose(float(loss_j), float(loss_e), rtol=1e-6)
    for k in g_e:
        np.testing.assert_allclose(as_np(g_j[k]), as_np(g_e[k]), rtol=1e-5, atol=1e-7)
    g_jg = fflow.jit(fflow.grad(fflow.amp(loss_fn, "bf16")))(params, x, y)
    g_g = fflow.grad(fflow.amp(loss_fn, "bf16"))(params, x, y)
    for k in g_g:
        np.testing.assert_allclose(as_np(g_jg[k]), as_np(g_g[k]), rtol=1e-5, atol=1e-7)


def test_amp_of_jit_rewrites_the_jitted_program():
    params, x, y = make_mlp()
    prog = fflow.make_jaxpr(fflow.amp(fflow.jit(loss_fn), "bf16"))(params, x, y)
    assert all(v.aval.dtype == BF16 for e in eqns_of(prog, "dot_general") for v in e.inputs)


def test_vmap_of_amp_matches_per_example_amp():
    vmap = fflow.vmap
    params, x, y = make_mlp(seed=3, n=6)

    def per_example(params, xi, yi):
        return loss_fn(params, xi[None], yi[None])

    f = fflow.amp(per_example, "bf16")
    batched = vmap(f, in_axes=(None, 0, 0))(params, x, y)
    loop = np.array([float(f(params, x[i], y[i])) for i in range(6)])
    assert batched.dtype == F32
    np.testing.assert_allclose(as_np(batched), loop, rtol=1e-2, atol=1e-3)
    # and amp outside vmap: per-example gradients in fp32
    g = fflow.amp(vmap(fflow.grad(per_example), in_axes=(None, 0, 0)), "bf16")(params, x, y)
    ref = vmap(fflow.grad(per_example), in_axes=(None, 0, 0))(params, x, y)
    for k in g:
        assert g[k].dtype == F32 and g[k].shape == ref[k].shape
        r = as_np(ref[k])
        assert np.abs(as_np(g[k]) - r).max() <= 0.1 * (1e-2 + np.abs(r).max())


def test_amp_training_example_learns_like_fp32():
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))
    try:
        import amp_training
    finally:
        sys.path.pop(0)
    r = amp_training.main(steps=100, batch_size=64, hidden=64, log_every=50)
    assert r["fp32"]["accuracy"] >= 0.85
    for name in ("bf16", "fp16"):
        assert abs(r[name]["accuracy"] - r["fp32"]["accuracy"]) <= 0.03, name
        for (_, ref), (_, got) in zip(r["fp32"]["curve"], r[name]["curve"]):
            assert abs(got - ref) <= 0.02 * (1 + ref), name
    assert r["fp16"]["skipped"] == 0


def test_control_flow_bodies_are_rewritten():
    from fflow import lax

    rng = np.random.default_rng(0)
    w = jnp.asarray((rng.normal(size=(4, 4)) / 2).astype(np.float32))
    x = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))

    def f(w, x):
        def body(h, _):
            h = jnp.tanh(h @ w)
            return h, jnp.sum(jnp.exp(h))

        h, ys = lax.scan(body, x, None, length=5)
        h = lax.cond(jnp.sum(h) > 0, lambda h: h @ w, lambda h: h * 2.0, h)
        h = lax.fori_loop(0, 3, lambda i, h: jnp.tanh(h @ w), h)
        return jnp.sum(h) + jnp.sum(ys)

    prog = fflow.make_jaxpr(fflow.amp(f, "bf16"))(w, x)
    nested = []
    for e in prog.eqns:
        for v in e.params.values():
            progs = v if isinstance(v, (tuple, list)) else [v]
            nested += [p for p in progs if isinstance(p, fflow.core.Program)]
    assert len(nested) == 4  # scan body, two cond branches, fori body
    dots = [e for p in nested for e in eqns_of(p, "dot_general")]
    assert len(dots) == 3 and all(v.aval.dtype == BF16 for e in dots for v in e.inputs)
    exps = [e for p in nested for e in eqns_of(p, "exp")]
    assert exps and all(e.inputs[0].aval.dtype == F32 for e in exps)
    ref = float(f(w, x))
    for g in (fflow.amp(f, "bf16"), fflow.jit(fflow.amp(f, "fp16"))):
        assert float(g(w, x)) == pytest.approx(ref, rel=2e-2)
    g_ref = as_np(fflow.grad(f)(w, x))
    for g in (fflow.grad(fflow.amp(f, "bf16"))(w, x), fflow.amp(fflow.grad(f), "bf16")(w, x)):
        assert g.dtype == F32
        assert np.linalg.norm(as_np(g) - g_ref) <= 3e-2 * np.linalg.norm(g_ref)


def test_amp_around_a_sharded_call_keeps_its_input_dtypes():
    params, x, y = make_mlp(seed=0, n=16)
    pl = fflow.placement("cpu", [0, 1])
    S, B = fflow.sbp.split, fflow.sbp.broadcast
    inner = fflow.shard(fflow.value_and_grad(loss_fn), pl, in_sbp=(B, S(0), S(0)))

    def f(params, x, y):
        return inner(params, jnp.tanh(x @ params["w0"]), y)  # a bf16 value flows in

    params = dict(params, w0=jnp.eye(8) * 0.5)
    loss, _ = fflow.amp(f, "bf16")(params, x, y)
    ref, _ = fflow.value_and_grad(loss_fn)(params, jnp.tanh(x * 0.5), y)
    assert float(np.asarray(loss)) == pytest.approx(float(ref), rel=1e-2)


def test_param_dtype_bf16_keeps_activations_low_and_grads_fp32():
    params, x, y = make_mlp()
    pol = fflow.amp.Policy("bf16", param_dtype="bf16")
    prog = fflow.make_jaxpr(fflow.grad(fflow.amp(loss_fn, pol)))(params, x, y)
    forward_adds = eqns_of(prog, "add")[:2]  # the two bias adds come first
    assert all(v.aval.dtype == BF16 for e in forward_adds for v in e.inputs), str(prog)
    (relu,) = eqns_of(prog, "max")
    assert relu.outputs[0].aval.dtype == BF16
    assert [v.aval.dtype for v in prog.outvars] == [F32] * 4
    grads = fflow.grad(fflow.amp(loss_fn, pol))(params, x, y)
    ref = fflow.grad(loss_fn)(params, x, y)
    for k in ref:
        r = as_np(ref[k])
        assert np.linalg.norm(as_np(grads[k]) - r) <= 3e-2 * np.linalg.norm(r), k


def test_checkpointed_body_is_rewritten():
    w = jnp.ones((3, 3)) * 0.3
    x = jnp.ones((2, 3))
    g = fflow.checkpoint(lambda w, x: jnp.tanh(x @ w))

    def f(w, x):
        return jnp.sum(jnp.exp(g(w, x)))

    prog = fflow.make_jaxpr(fflow.amp(f, "bf16"))(w, x)
    (ck,) = eqns_of(prog, "checkpoint")
    (dot,) = eqns_of(ck.params["program"], "dot_general")
    assert [v.aval.dtype for v in dot.inputs] == [BF16, BF16]
    ref = as_np(fflow.grad(f)(w, x))
    got = fflow.grad(fflow.amp(f, "bf16"))(w, x)
    assert got.dtype == F32
    np.testing.assert_allclose(as_np(got), ref, rtol=2e-2)


def test_docstring_examples_run():
    import doctest

    from fflow.transforms import amp as amp_mod
    from fflow.transforms import amp_policy, amp_scale

    for mod in (amp_mod, amp_policy, amp_scale):
        result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
        assert result.attempted > 0 and result.failed == 0, mod.__name__


def test_amp_program_on_the_cuda_backend_matches_eager_amp():
    """The CUDA backend (generated kernels run through the host shim on CPU) runs the
    rewritten program — bf16/fp16 gemms with fp32 output — with AMP's numbers."""
    from fflow.lowering import nvrtc

    try:
        nvrtc.load_library()
    except nvrtc.NVRTCUnavailable:
        pytest.skip("NVRTC is not available")
    params, x, y = make_mlp(seed=0)
    previous = fflow.config.jit_backend
    fflow.config.update("jit_backend", "cuda_shim")
    try:
        for policy in ("bf16", "fp16"):
            f = fflow.amp(fflow.value_and_grad(loss_fn), policy)
            jitted = fflow.jit(f)
            assert "cublas gemm" in jitted.lower(params, x, y).as_text()
            loss, grads = jitted(params, x, y)
            loss_ref, grads_ref = f(params, x, y)
            np.testing.assert_allclose(float(loss), float(loss_ref), rtol=1e-5)
            for k in grads_ref:
                r = as_np(grads_ref[k])
                np.testing.assert_allclose(
                    as_np(grads[k]), r, rtol=1e-4, atol=1e-5 * np.abs(r).max()
                )
    finally:
        fflow.config.update("jit_backend", previous)
