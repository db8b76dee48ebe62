"""AMP coverage: every primitive has an AMP class (or an `amp_rules` entry, or sits
on the "no class, on purpose" list), and the NumPy implementations work on bf16 and
fp16 inputs — right dtype out, and the value of the fp32 computation on the same
(already rounded) inputs, rounded once more."""

import zlib

import fflow.transforms.remat  # noqa: F401  (registers custom_jvp_call, checkpoint...)
import ml_dtypes
import numpy as np
import pytest
from fflow.transforms.amp import amp_rules
from fflow.transforms.amp_policy import CLASSES

import fflow
import fflow.numpy as jnp
from fflow import lax
from fflow.core import primitives

# Primitives without an `amp_class` run in the dtypes of the un-rewritten program.
NO_AMP_CLASS = {
    "custom_jvp_call": "its Python JVP rule must see the dtypes it was written for",
    "custom_vjp_call": "its Python fwd/bwd rules must see the dtypes they were written for",
    "custom_lin": "the linearized custom rule of custom_vjp, same reason",
    "checkpoint": "nested program: rewritten by amp's nested-program rule, operands kept",
}


def _registry():
    try:  # primitives that load with optional parts of fflow
        import fflow.transforms.shard  # noqa: F401
    except ImportError:  # pragma: no cover
        pass
    import fflow.random  # noqa: F401

    return sorted(primitives)


@pytest.mark.parametrize("name", _registry())
def test_every_primitive_has_an_amp_class(name):
    prim = primitives[name]
    cls = getattr(prim, "amp_class", None)
    if name in NO_AMP_CLASS:
        assert cls is None, f"{name} has amp_class={cls!r}: remove it from NO_AMP_CLASS"
        return
    assert cls in CLASSES or prim in amp_rules, (
        f"primitive {name!r} has no AMP class: set `{name}_p.amp_class` next to its "
        f"definition (one of {CLASSES}) or list it in NO_AMP_CLASS with the reason"
    )


def test_no_amp_class_list_names_real_primitives():
    assert not set(NO_AMP_CLASS) - set(primitives)


BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)


def _cases():
    pos = lambda x: lax.abs(x) + 0.5  # noqa: E731
    unit = lambda x: x * 0.5  # noqa: E731  (inside (-1, 1))
    c = {
        name: (lambda x, y, n=name: getattr(lax, n)(x))
        for name in "neg sin cos tan atan sinh cosh tanh asinh exp exp2 expm1 cbrt "
        "logistic erf abs sign floor ceil square".split()
    }
    c.update(
        {
            "asin": lambda x, y: lax.asin(unit(x)),
            "acos": lambda x, y: lax.acos(unit(x)),
            "atanh": lambda x, y: lax.atanh(unit(x)),
            "acosh": lambda x, y: lax.acosh(pos(x) + 1.0),
            "log": lambda x, y: lax.log(pos(x)),
            "log1p": lambda x, y: lax.log1p(pos(x)),
            "sqrt": lambda x, y: lax.sqrt(pos(x)),
            "rsqrt": lambda x, y: lax.rsqrt(pos(x)),
            "round": lambda x, y: lax.round(x * 4.0),
            "integer_pow": lambda x, y: lax.integer_pow(x, 3),
            "integer_pow_neg": lambda x, y: lax.integer_pow(pos(x), -2),
            "pow": lambda x, y: lax.pow(pos(x), y),
            "div": lambda x, y: lax.div(x, pos(y)),
            # exact in any precision: no rounding before the discontinuous op
            "rem": lambda x, y: lax.rem(x, y),
            "atan2": lambda x, y: lax.atan2(x, y),
            "select": lambda x, y: lax.select(lax.lt(x, y), x, y),
            "reduce_sum": lambda x, y: lax.reduce_sum(x, (1,)),
            "reduce_prod": lambda x, y: lax.reduce_prod(pos(x), (1,)),
            "reduce_max": lambda x, y: lax.reduce_max(x, (0, 1)),
            "cumsum": lambda x, y: lax.cumsum(x, 1),
            "cumprod": lambda x, y: lax.cumprod(pos(x), 1, reverse=True),
            "cummax": lambda x, y: lax.cummax(x, 1),
            "sort": lambda x, y: lax.sort(x, 1),
            "dot_general": lambda x, y: lax.dot(x, lax.transpose(y, (1, 0))),
            "pad": lambda x, y: lax.pad(x, np.asarray(0.5, x.dtype), [(1, 1, 0), (0, 0, 1)]),
            "concatenate": lambda x, y: lax.concatenate([x, y], 0),
            "dynamic_update_slice": lambda x, y: lax.dynamic_update_slice(x, y[:, :2], (0, 1)),
            "gather": lambda x, y: lax.gather(x, jnp.asarray([[1], [0], [2]]), (1,)),
            "scatter_add": lambda x, y: lax.scatter_add(
                x, jnp.asarray([[1], [1]]), jnp.ones((2, 4), x.dtype), (0,)
            ),
            "softmax": lambda x, y: fflow.nn.softmax(x),
            "mean_var": lambda x, y: jnp.var(x, axis=1) + jnp.mean(x),
        }
    )
    for name in ("add", "sub", "mul", "max", "min", "nextafter"):
        c[name] = lambda x, y, n=name: getattr(lax, n)(x, y)
    return c


CASES = _cases()


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_numpy_impls_on_low_precision_inputs(name, dtype):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    x = rng.uniform(-1.5, 1.5, (3, 4)).astype(dtype)
    y = rng.uniform(-1.5, 1.5, (3, 4)).astype(dtype)
    fn = CASES[name]
    low = fn(jnp.asarray(x), jnp.asarray(y))
    ref = fn(jnp.asarray(x.astype(np.float32)), jnp.asarray(y.astype(np.float32)))
    lows = low if isinstance(low, (list, tuple)) else [low]
    refs = ref if isinstance(ref, (list, tuple)) else [ref]
    eps = float(ml_dtypes.finfo(dtype).eps)
    for lo, re in zip(lows, refs):
        assert lo.dtype == dtype, f"{name} returned {lo.dtype} for {dtype} inputs"
        lo64 = np.asarray(lo).astype(np.float64)
        re64 = np.asarray(re).astype(np.float64)
        if name == "nextafter":  # one step in the input's own precision
            assert np.all(np.abs(lo64 - x.astype(np.float64)) <= eps * np.abs(x.astype(float)))
            continue
        # a handful of roundings of the input's precision (several for chained cases)
        np.testing.assert_allclose(lo64, re64, rtol=8 * eps, atol=8 * eps, err_msg=name)
