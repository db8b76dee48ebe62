"""JAX's weak-type rule on jax.numpy functions, function by function: weakly typed
operands (Python scalars, jnp.asarray(0.3)) give a weak result through elementwise
functions (integers promoting to float included), and reductions, log2/log10,
signbit and angle give a strong one. The table was recorded from JAX 0.10.2 in
tests/golden/jax_weak_types.json (`python tests/test_compat_weak_types.py --regen`)."""

import json
import os
import sys

import numpy as np

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "jax_weak_types.json")
BINARY = ["add", "subtract", "multiply", "divide", "true_divide", "floor_divide", "remainder",
          "fmod", "power", "float_power", "maximum", "minimum", "fmax", "fmin", "arctan2",
          "hypot", "copysign", "nextafter", "logaddexp", "logaddexp2", "heaviside"]  # fmt: skip
UNARY = ["negative", "positive", "abs", "sqrt", "exp", "log", "sign", "floor", "ceil", "round",
         "trunc", "square", "reciprocal", "sinc", "deg2rad", "rad2deg", "cbrt", "exp2", "log2",
         "log10", "expm1", "log1p", "fabs", "signbit", "conj", "real", "imag", "angle", "cumsum",
         "sum", "mean", "max", "prod", "std", "var", "ravel", "clip", "nan_to_num",
         "atleast_1d", "cumprod"]  # fmt: skip


def table(jnp, only=None):
    """{"fn operand-kinds": [dtype, weak]} for calls that do not raise."""
    a, i = jnp.asarray(0.3), jnp.asarray(3)
    calls = [(f"{n} {t}", n, args) for n in BINARY for t, args in [
        ("wf,py", (a, 2.0)), ("py,wf", (2.0, a)), ("wi,py", (i, 2)), ("wf,wf", (a, a)),
        ("py,py", (2, 3.0))]]  # fmt: skip
    calls += [(f"{n} {t}", n, args) for n in UNARY for t, args in [
        ("wf", (a,)), ("wi", (i,)), ("py", (2.5,))]]  # fmt: skip
    rows = {}
    for key, name, args in calls:
        if only is not None and key not in only:
            continue
        try:
            r = getattr(jnp, name)(*args)
        except Exception:  # noqa: BLE001, S112 - JAX raises for some kinds: not recorded
            continue
        rows[key] = [str(r.dtype), bool(r.weak_type)]
    return rows


def test_weak_types_match_jax():
    import fflow.numpy as jnp

    with open(GOLDEN) as f:
        want = json.load(f)
    got = table(jnp, only=set(want))
    assert set(got) == set(want), f"fflow raises where JAX does not: {set(want) - set(got)}"
    wrong = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
    assert not wrong, f"(fflow, JAX) dtype / weak differ: {wrong}"
    assert 200 < len(want) and sum(w for _, w in want.values()) > 100  # both kinds present


def test_weak_rule_inside_jit_and_for_lists():
    import fflow
    import fflow.numpy as jnp

    out = fflow.jit(lambda x: (x / 2, jnp.sum(x), x**0.5, jnp.sqrt(x)))(2.0)
    assert [o.weak_type for o in out] == [True, False, True, True]  # as JAX
    assert not jnp.array([jnp.asarray(1.0), jnp.asarray(2.0)]).weak_type
    assert (-jnp.asarray(0.5)).weak_type and jnp.asarray(3) / 2 == np.float32(1.5)


if __name__ == "__main__" and "--regen" in sys.argv:
    import jax.numpy

    with open(GOLDEN, "w") as f:
        json.dump(table(jax.numpy), f, indent=0, sort_keys=True)
        f.write("\n")


def test_loops_and_vmapped_switch_keep_jax_weak_types():
    """Recorded from JAX 0.10.2 (eager and jit agree): a weak scan carry the body makes
    strong ends strong but its stacked per-step values stay weak; a vmapped switch over
    a Python scalar operand stays weak."""
    import fflow
    import fflow.numpy as jnp
    from fflow import lax

    xs = jnp.arange(1.0, 7.0)
    cases = [
        (lambda: lax.scan(lambda c, x: (c * x, c), 1.0, xs), [False, True]),
        (lambda: lax.scan(lambda c, x: (c + 1.0, c * 2), 1.0, None, length=3), [True, True]),
        (lambda: lax.scan(lambda c, x: (c + x, c), 0, jnp.arange(3)), [False, True]),
        (lambda: lax.scan(lambda c, x: (c + x, c), 0, jnp.arange(3.0)), [False, False]),
        (lambda: lax.fori_loop(0, 10, lambda i, a: a + i, 0), [True]),
        (lambda: lax.fori_loop(0, 3, lambda i, a: a * xs[i], 1.0), [False]),
        (lambda: lax.while_loop(lambda c: c < 5, lambda c: c + jnp.float32(1), 0.0), [False]),
        (
            lambda: fflow.vmap(
                lambda i, x: lax.switch(i, [lambda x: x * 2, lambda x: -x], x), in_axes=(0, None)
            )(jnp.array([0, 1, 0]), 2.0),
            [True],
        ),
    ]
    for f, want in cases:
        for g in (f, fflow.jit(f)):
            got = [leaf.weak_type for leaf in fflow.tree_util.tree_leaves(g())]
            assert got == want, (f, got, want)
    carry, ys = lax.scan(lambda c, x: (c * x, c), 1.0, xs)  # the values are unchanged
    np.testing.assert_allclose(ys, np.cumprod(np.r_[1.0, np.arange(1.0, 6.0)]))
