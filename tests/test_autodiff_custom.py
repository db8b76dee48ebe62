"""custom_jvp, custom_vjp and checkpoint/remat: eagerly, under jit, under
grad/vjp/jvp/linearize, and composed. References are closed-form derivatives and
the un-customised functions."""

import functools

import numpy as np
import pytest
from fflow.transforms import autodiff as ad
from fflow.transforms.remat import checkpoint_policies

import fflow
import fflow.numpy as jnp
from fflow import lax
from fflow.core import primitives

pytestmark = pytest.mark.usefixtures("x64")  # float64 references at 1e-12 on purpose

X = np.array([0.3, -1.2, 2.0])


def _close(a, b, tol=1e-6):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


def _prims_in(program):
    names = []

    def walk(p):
        for e in p.eqns:
            names.append(e.primitive.name)
            for v in e.params.values():
                if isinstance(v, fflow.core.Program):
                    walk(v)

    walk(program)
    return names


# ---------------------------------------------------------------------------
# custom_jvp


@fflow.custom_jvp
def sin3(x):
    """sin with a deliberately different derivative (3 cos x), to see the rule is used."""
    return jnp.sin(x)


@sin3.defjvp
def _sin3_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return sin3(x), 3.0 * jnp.cos(x) * t


def _sin3_grad(x):
    return 3.0 * np.cos(x)


def _sin3_hess(x):
    return -3.0 * np.sin(x)


@pytest.mark.parametrize(
    "transform",
    [
        lambda f: f,
        fflow.jit,
        lambda f: fflow.jit(fflow.jit(f)),
    ],
    ids=["eager", "jit", "jit_jit"],
)
def test_custom_jvp_value(transform):
    _close(transform(lambda x: sin3(x) * 2)(X), 2 * np.sin(X))


@pytest.mark.parametrize(
    "make",
    [
        lambda f: fflow.grad(f),
        lambda f: fflow.jit(fflow.grad(f)),
        lambda f: fflow.grad(fflow.jit(f)),
        lambda f: fflow.jit(fflow.grad(fflow.jit(f))),
    ],
    ids=["grad", "jit_grad", "grad_jit", "jit_grad_jit"],
)
def test_custom_jvp_rule_used_by_grad(make):
    g = make(lambda x: jnp.sum(sin3(x)))
    _close(g(X), _sin3_grad(X))


def test_custom_jvp_forward_and_linearize_and_vjp():
    t = np.array([1.0, 2.0, -1.0])
    y, ty = fflow.jvp(sin3, (X,), (t,))
    _close(y, np.sin(X))
    _close(ty, _sin3_grad(X) * t)
    y, f_lin = fflow.linearize(sin3, X)
    _close(f_lin(t), _sin3_grad(X) * t)
    y, f_vjp = fflow.vjp(sin3, X)
    _close(f_vjp(t)[0], _sin3_grad(X) * t)


def test_custom_jvp_second_order_differentiates_the_rule():
    g2 = fflow.grad(fflow.grad(lambda x: sin3(x)))
    for x in X:
        _close(g2(x), _sin3_hess(x), 1e-5)
        _close(fflow.jit(g2)(x), _sin3_hess(x), 1e-5)
        _close(fflow.grad(fflow.jit(fflow.grad(sin3)))(x), _sin3_hess(x), 1e-5)


@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_custom_jvp_stable_log1pexp():
    @fflow.custom_jvp
    def log1pexp(x):
        return jnp.log(1.0 + jnp.exp(x))

    @log1pexp.defjvp
    def _jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        return log1pexp(x), t * (1.0 - 1.0 / (1.0 + jnp.exp(x)))

    # the naive derivative is exp(x)/(1+exp(x)) = inf/inf = nan at x = 100
    assert float(fflow.grad(log1pexp)(100.0)) == 1.0
    assert float(fflow.jit(fflow.grad(log1pexp))(100.0)) == 1.0


def test_custom_jvp_defjvps_and_multiple_args():
    @fflow.custom_jvp
    def f(x, y):
        return x * y

    f.defjvps(lambda tx, ans, x, y: 2.0 * tx * y, lambda ty, ans, x, y: 5.0 * x * ty)
    gx, gy = fflow.grad(f, argnums=(0, 1))(2.0, 3.0)
    assert (float(gx), float(gy)) == (6.0, 10.0)
    gx, gy = fflow.jit(fflow.grad(f, argnums=(0, 1)))(2.0, 3.0)
    assert (float(gx), float(gy)) == (6.0, 10.0)
    # differentiating only y: x's tangent is a zero
    assert float(fflow.grad(f, argnums=1)(2.0, 3.0)) == 10.0


def test_custom_jvp_nondiff_argnums_function_and_array():
    @functools.partial(fflow.custom_jvp, nondiff_argnums=(0, 2))
    def apply(fn, x, scale):
        return fn(x) * scale

    @apply.defjvp
    def _apply_jvp(fn, scale, primals, tangents):
        (x,), (t,) = primals, tangents
        return apply(fn, x, scale), 7.0 * t * scale

    scale = jnp.asarray(2.0)
    assert float(fflow.grad(lambda x: apply(jnp.sin, x, scale))(0.5)) == 14.0
    assert float(fflow.jit(fflow.grad(lambda x, s: apply(jnp.sin, x, s)))(0.5, scale)) == 14.0
    # a traced nondiff array under jit, then differentiated outside
    f = fflow.jit(lambda x, s: apply(jnp.sin, x, s))
    assert float(fflow.grad(f)(0.5, scale)) == 14.0


def test_custom_jvp_pytrees_and_kwargs():
    @fflow.custom_jvp
    def f(d, k=1.0):
        return {"p": d["a"] * d["b"] * k, "q": (d["a"],)}

    @f.defjvp
    def _f_jvp(primals, tangents):
        (d, k), (td, _) = primals, tangents
        out = f(d, k)
        return out, {"p": (td["a"] * d["b"] + d["a"] * td["b"]) * k, "q": (td["a"],)}

    d = {"a": jnp.asarray(2.0), "b": jnp.asarray(3.0)}
    g = fflow.grad(lambda d: f(d, k=2.0)["p"] + f(d)["q"][0])(d)
    assert (float(g["a"]), float(g["b"])) == (7.0, 4.0)


def test_custom_jvp_python_control_flow_eagerly():
    @fflow.custom_jvp
    def relu(x):
        return x if x > 0 else x * 0.0

    relu.defjvps(lambda t, ans, x: t * (x > 0))
    assert float(fflow.grad(relu)(2.0)) == 1.0
    assert float(fflow.grad(relu)(-2.0)) == 0.0


def test_custom_jvp_staged_with_nested_program():
    program = fflow.make_jaxpr(lambda x: sin3(x) + 1.0)(1.0)
    assert [e.primitive.name for e in program.eqns] == ["custom_jvp_call", "add"]
    inner = program.eqns[0].params["program"]
    assert [e.primitive.name for e in inner.eqns] == ["sin"]
    text = str(program)
    assert "custom_jvp_call[" in text and "jvp=_sin3_jvp" in text and "sin " in text


def test_custom_jvp_errors():
    @fflow.custom_jvp
    def no_rule(x):
        return x

    with pytest.raises(AttributeError, match="No JVP defined"):
        fflow.grad(no_rule)(1.0)

    @fflow.custom_jvp
    def bad_shape(x):
        return x

    bad_shape.defjvp(lambda p, t: (p[0], jnp.ones(3)))
    with pytest.raises(TypeError, match="tangent of shape"):
        fflow.grad(bad_shape)(1.0)

    def closes_over(y):
        @fflow.custom_jvp
        def f(a):
            return a * y

        f.defjvp(lambda p, t: (f(p[0]), t[0] * y))
        return f(2.0)

    with pytest.raises(TypeError, match="closes over a value that is being differentiated"):
        fflow.grad(fflow.jit(closes_over))(3.0)


def test_custom_jvp_closure_over_outer_constant():
    def outer(x, y):
        @fflow.custom_jvp
        def f(a):
            return a * y

        f.defjvp(lambda p, t: (f(p[0]), t[0] * y * 2.0))
        return fflow.grad(f)(x)

    assert float(outer(1.0, 3.0)) == 6.0
    assert float(fflow.jit(outer)(1.0, 3.0)) == 6.0


# ---------------------------------------------------------------------------
# custom_vjp


@fflow.custom_vjp
def clip_gradient(x):
    return x


def _clip_fwd(x):
    return x, None


def _clip_bwd(res, g):
    return (jnp.clip(g, -1.0, 1.0),)


clip_gradient.defvjp(_clip_fwd, _clip_bwd)


@fflow.custom_vjp
def mul5(x, y):
    """x * y whose VJP scales x's cotangent by 5 (to see bwd is used)."""
    return x * y


def _mul5_fwd(x, y):
    return mul5(x, y), (x, y)


def _mul5_bwd(res, ct):
    x, y = res
    return 5.0 * ct * y, ct * x


mul5.defvjp(_mul5_fwd, _mul5_bwd)


@pytest.mark.parametrize(
    "make",
    [
        lambda f: fflow.grad(f),
        lambda f: fflow.jit(fflow.grad(f)),
        lambda f: fflow.grad(fflow.jit(f)),
    ],
    ids=["grad", "jit_grad", "grad_jit"],
)
def test_custom_vjp_bwd_used(make):
    assert float(make(lambda x: 3.0 * clip_gradient(x))(2.0)) == 1.0
    assert float(make(lambda x: 0.5 * clip_gradient(x))(2.0)) == 0.5
    g = make(lambda x: jnp.sum(mul5(x, x + 1.0)))(X)
    _close(g, 5.0 * (X + 1.0) + X)


def test_custom_vjp_value_eager_and_jit():
    _close(mul5(X, 2.0 * X), 2 * X * X)
    _close(fflow.jit(mul5)(X, 2.0 * X), 2 * X * X)


def test_custom_vjp_vjp_and_argnums():
    y, f_vjp = fflow.vjp(mul5, X, 2.0 * X)
    ct = np.array([1.0, -1.0, 0.5])
    gx, gy = f_vjp(ct)
    _close(gx, 5.0 * ct * 2.0 * X)
    _close(gy, ct * X)
    _close(fflow.grad(lambda y: jnp.sum(mul5(X, y)))(X), X)


def test_custom_vjp_forward_mode_is_an_error():
    with pytest.raises(TypeError, match="forward-mode"):
        fflow.jvp(mul5, (1.0, 2.0), (1.0, 0.0))


def test_custom_vjp_second_order_differentiates_bwd():
    @fflow.custom_vjp
    def cube(x):
        return x * x * x

    cube.defvjp(lambda x: (cube(x), x), lambda x, g: (3.0 * x * x * g,))
    assert float(fflow.grad(fflow.grad(cube))(2.0)) == 12.0
    assert float(fflow.jit(fflow.grad(fflow.grad(cube)))(2.0)) == 12.0


def test_custom_vjp_linearize_stages_no_primal_work():
    @fflow.custom_vjp
    def f(x):
        return jnp.exp(jnp.sin(x))

    def f_fwd(x):
        y = f(x)
        return y, y

    f.defvjp(f_fwd, lambda y, g: (g * y,))
    _, program = ad.linearize_flat(lambda x: [f(x)], [jnp.asarray(0.5)])
    names = _prims_in(program)
    assert "custom_lin" in names
    assert "sin" not in names and "exp" not in names and "custom_vjp_call" not in names


def test_custom_vjp_nondiff_argnums_and_pytrees():
    @functools.partial(fflow.custom_vjp, nondiff_argnums=(0,))
    def f(n, d):
        return {"s": d["a"] * d["b"] * n, "t": d["a"]}

    def f_fwd(n, d):
        return f(n, d), d

    def f_bwd(n, d, ct):
        # None: a zero cotangent for the whole "b" entry
        return ({"a": ct["s"] * d["b"] * n + ct["t"], "b": None},)

    f.defvjp(f_fwd, f_bwd)
    d = {"a": jnp.asarray(2.0), "b": jnp.asarray(3.0)}
    for make in (fflow.grad, lambda h: fflow.jit(fflow.grad(h))):
        g = make(lambda d: f(2.0, d)["s"] + f(2.0, d)["t"])(d)
        assert (float(g["a"]), float(g["b"])) == (7.0, 0.0)


def test_custom_vjp_bwd_errors():
    @fflow.custom_vjp
    def f(x, y):
        return x * y

    f.defvjp(lambda x, y: (f(x, y), None), lambda res, g: (g,))
    with pytest.raises(TypeError, match="one cotangent per"):
        fflow.grad(f)(1.0, 2.0)

    @fflow.custom_vjp
    def h(x):
        return x

    with pytest.raises(AttributeError, match="No VJP defined"):
        fflow.grad(h)(1.0)


def test_custom_vjp_staged_program():
    text = str(fflow.make_jaxpr(lambda x, y: mul5(x, y))(1.0, 2.0))
    assert "custom_vjp_call[" in text and "bwd=_mul5_bwd" in text and "fwd=_mul5_fwd" in text


# ---------------------------------------------------------------------------
# checkpoint / remat


def _ff(x, w):
    h = jnp.tanh(x @ w)
    return jnp.sum(jnp.sin(h @ w) * h)


W = np.random.RandomState(0).randn(3, 3) * 0.5
XB = np.random.RandomState(1).randn(2, 3)


@pytest.mark.parametrize(
    "make",
    [
        lambda f: fflow.grad(f, argnums=(0, 1)),
        lambda f: fflow.jit(fflow.grad(f, argnums=(0, 1))),
        lambda f: fflow.grad(fflow.jit(f), argnums=(0, 1)),
    ],
    ids=["grad", "jit_grad", "grad_jit"],
)
@pytest.mark.parametrize(
    "policy",
    [
        None,
        checkpoint_policies.dots_saveable,
        checkpoint_policies.everything_saveable,
        checkpoint_policies.nothing_saveable,
    ],
)
def test_checkpoint_grads_match(make, policy):
    ref = fflow.grad(_ff, argnums=(0, 1))(XB, W)
    got = make(fflow.checkpoint(_ff, policy=policy))(XB, W)
    for a, b in zip(got, ref):
        _close(a, b, 1e-10)


def test_checkpoint_value_jvp_and_second_order():
    f = fflow.remat(lambda x: jnp.sin(jnp.sin(x)))
    _close(f(X), np.sin(np.sin(X)))
    _close(fflow.jit(f)(X), np.sin(np.sin(X)))
    t = np.ones(3)
    _, ty = fflow.jvp(f, (X,), (t,))
    _close(ty, np.cos(np.sin(X)) * np.cos(X))
    ref = fflow.grad(fflow.grad(lambda x: jnp.sin(jnp.sin(x))))
    for x in X:
        _close(fflow.grad(fflow.grad(f))(x), ref(x))
        _close(fflow.jit(fflow.grad(fflow.grad(f)))(x), ref(x))


def _count_impl_calls(name, fn):
    prim = primitives[name]
    calls = [0]
    impl = prim.impl

    def counting(*args, **kw):
        calls[0] += 1
        return impl(*args, **kw)

    prim.impl = counting
    try:
        fn()
    finally:
        prim.impl = impl
    return calls[0]


def test_checkpoint_recomputes_in_backward_pass():
    plain = lambda x: jnp.sum(jnp.sin(jnp.sin(x)))  # noqa: E731
    x = jnp.asarray(X)
    n_plain = _count_impl_calls("sin", lambda: fflow.grad(plain)(x))
    n_remat = _count_impl_calls("sin", lambda: fflow.grad(fflow.checkpoint(plain))(x))
    assert n_plain == 2  # the forward pass only
    assert n_remat == 3  # + the inner sin, recomputed for cos(sin x) in the backward pass


def test_checkpoint_residuals_are_the_inputs():
    f = fflow.checkpoint(lambda x: jnp.sin(jnp.exp(x)))
    x = jnp.asarray(X)
    _, program = ad.linearize_flat(lambda v: [f(v)], [x])
    (eqn,) = [e for e in program.eqns if e.primitive.name == "checkpoint"]
    known = [v for v in eqn.inputs if v in program.constvars]
    assert len(known) == 1
    (value,) = [c for v, c in zip(program.constvars, program.consts) if v is known[0]]
    assert value is x  # the saved residual is the input itself, not exp(x) or cos(...)
    assert "exp" not in [e.primitive.name for e in program.eqns]


def test_checkpoint_policy_saves_dots():
    x, w = jnp.asarray(XB), jnp.asarray(W)

    def run(policy):
        f = fflow.checkpoint(_ff, policy=policy)
        return _count_impl_calls("dot_general", lambda: fflow.grad(f, argnums=1)(x, w))

    n_none, n_dots = run(None), run(checkpoint_policies.dots_saveable)
    assert n_none == n_dots + 2  # both forward matmuls are recomputed without the policy


def test_checkpoint_static_argnums_allow_python_control_flow():
    @functools.partial(fflow.checkpoint, static_argnums=(1,))
    def repeat_sin(x, n):
        for _ in range(n):
            x = jnp.sin(x)
        return x

    ref = fflow.grad(lambda x: jnp.sin(jnp.sin(jnp.sin(x))))(0.7)
    _close(fflow.grad(repeat_sin)(0.7, 3), ref)
    _close(fflow.jit(fflow.grad(repeat_sin), static_argnums=1)(0.7, 3), ref)


def test_checkpoint_printing_and_closure():
    w = jnp.asarray(W)
    f = fflow.checkpoint(lambda x: jnp.tanh(x @ w))
    program = fflow.make_jaxpr(f)(XB)
    (eqn,) = program.eqns
    assert eqn.primitive.name == "checkpoint"
    assert len(eqn.inputs) == 2  # the closed-over w became an input
    text = str(program)
    assert "checkpoint[" in text and "prevent_cse=True" in text and "program={ lambda ; " in text
    g = fflow.grad(lambda x: jnp.sum(f(x)))(XB)
    _close(g, fflow.grad(lambda x: jnp.sum(jnp.tanh(x @ w)))(XB), 1e-12)


def test_custom_inside_checkpoint_and_scan_like_loop():
    f = fflow.checkpoint(lambda x: jnp.sum(sin3(x) * clip_gradient(x)))
    x = jnp.asarray(X)
    # d/dx [sin3(x) * x] with sin3' = 3 cos x and an identity clip (|ct| small)
    expected = 3.0 * np.cos(X) * X + np.clip(np.sin(X), -1, 1)
    _close(fflow.grad(f)(x), expected)
    _close(fflow.jit(fflow.grad(f))(x), expected)
    _close(lax.stop_gradient(x), X)


@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_docstring_examples():
    import doctest

    import fflow.transforms.custom
    import fflow.transforms.remat

    import fflow.test_util

    for module in (fflow.transforms.custom, fflow.transforms.remat, fflow.test_util):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0, module.__name__


def test_transformed_programs_typecheck():
    from fflow.typecheck import check_program

    h = fflow.checkpoint(
        lambda x: jnp.sin(jnp.sin(x)) @ jnp.ones((3, 3)), policy=checkpoint_policies.dots_saveable
    )
    x = jnp.ones(3)
    for fn in (
        lambda x: jnp.sum(mul5(x, x)),
        lambda x: jnp.sum(h(x)),
        lambda x: jnp.sum(h(sin3(x))),
    ):
        check_program(fflow.make_jaxpr(fflow.grad(fn))(x))
        check_program(fflow.make_jaxpr(fflow.grad(fflow.grad(lambda s, fn=fn: fn(x * s))))(1.0))
        _, program = ad.linearize_flat(lambda v, fn=fn: [fn(v)], [x])
        check_program(program)


def test_residual_bytes_with_checkpoint():
    """Remat keeps only the input of a deep block as the residual (8x fewer bytes here)."""
    rng = np.random.RandomState(0)
    ws = [jnp.asarray(rng.randn(16, 16) / 4) for _ in range(8)]

    def block(x):
        for w in ws:
            x = jnp.tanh(x @ w)
        return x

    x = jnp.asarray(rng.randn(4, 16))

    def residual_bytes(fn):
        _, program = ad.linearize_flat(lambda v: [jnp.sum(fn(v))], [x])
        weights = {id(w) for w in ws}
        return sum(np.asarray(c).nbytes for c in program.consts if id(c) not in weights)

    plain = residual_bytes(block)
    remat = residual_bytes(fflow.checkpoint(block))
    assert remat == x.nbytes
    assert plain == 8 * x.nbytes


def test_checkpoint_prevent_cse_keeps_recomputation_as_one_equation():
    def f(x):
        return jnp.sum(jnp.sin(jnp.sin(x)))

    x = jnp.asarray(X)
    for prevent_cse, n_checkpoint in ((True, 1), (False, 0)):
        g = fflow.grad(fflow.checkpoint(f, prevent_cse=prevent_cse))
        names = [e.primitive.name for e in fflow.make_jaxpr(g)(x).eqns]
        assert names.count("checkpoint") == n_checkpoint
        _close(g(x), np.cos(np.sin(X)) * np.cos(X), 1e-12)


@pytest.mark.parametrize("policy", [None, checkpoint_policies.everything_saveable])
def test_checkpoint_odd_output_structures(policy):
    from fflow.test_util import check_grads

    def f(x, y, n):  # an input passed through, constants, an integer input and output
        return x, y * 2.0 + jnp.sin(x) * n, 3.0, jnp.ones(2), n * 2

    g = fflow.checkpoint(f, policy=policy)
    outs = g(jnp.asarray(0.5), jnp.asarray(1.0), 3)
    assert int(outs[4]) == 6 and float(outs[2]) == 3.0
    check_grads(lambda x, y: g(x, y, np.int32(3))[:2], (np.float64(0.5), np.float64(1.0)), order=2)
    h = fflow.jit(fflow.grad(lambda x, y: g(x, y, 3)[1] + jnp.sum(g(x, y, 3)[3]), argnums=(0, 1)))
    gx, gy = h(np.float64(0.5), np.float64(1.0))
    _close(gx, 3 * np.cos(0.5), 1e-12)
    _close(gy, 2.0)
