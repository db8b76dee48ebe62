"""Registry-driven gradient checks: every differentiable primitive in
`fflow.core.primitives` is checked by `check_grads` (forward mode against central
finite differences, reverse mode against forward mode) on several shapes.

A new primitive needs a case in `CASES` below, or an entry in `NOT_GRAD_CHECKED`
with the reason. Inputs are float64 with x64 on (so finite differences are accurate) and kept
inside each function's domain and away from kinks, ties and discontinuities.
"""

import zlib

import fflow.transforms.remat  # noqa: F401  (registers the custom_* and checkpoint primitives)
import numpy as np
import pytest
from op_db import OPS

import fflow
import fflow.numpy as jnp
from fflow import lax
from fflow.core import primitives
from fflow.test_util import check_grads, primitive_names

pytestmark = pytest.mark.usefixtures("x64")  # float64 on purpose: tight finite differences

RNG_SEED = 0
SHAPES = [(), (3,), (2, 3)]


def _rng(key):
    # a stable seed per case: str hashes change between processes (PYTHONHASHSEED)
    return np.random.RandomState(zlib.crc32(repr(key).encode()) % (2**31))


def uniform(lo, hi, shape, key="u"):
    return _rng((key, lo, hi, shape)).uniform(lo, hi, size=shape)


def away_from_zero(lo, hi, shape, key="z"):
    r = _rng((key, lo, hi, shape))
    return r.uniform(lo, hi, size=shape) * r.choice([-1.0, 1.0], size=shape)


def distinct(shape, key="d"):
    """Values with gaps >= 0.1 between any two (no ties for max/min/sort)."""
    n = int(np.prod(shape, dtype=np.int64))
    vals = _rng((key, shape)).permutation(n) * 0.3 - 0.15 * n
    return vals.reshape(shape).astype(np.float64)


def unary_cases(fn, lo=-2.0, hi=2.0, sampler=None):
    sampler = sampler or (lambda s: uniform(lo, hi, s, fn.__name__))
    return [(str(s), fn, lambda s=s: (sampler(s),)) for s in SHAPES]


def binary_cases(fn, sample_x, sample_y):
    return [(str(s), fn, lambda s=s: (sample_x(s), sample_y(s))) for s in SHAPES]


def _u(lo, hi):
    return lambda s: uniform(lo, hi, s)


def _int_pow(y):
    def f(x):
        return lax.integer_pow(x, y)

    f.__name__ = f"integer_pow_{y}"
    return f


def _bind(name):
    def f(*args):
        return primitives[name].bind(*args)

    f.__name__ = name
    return f


def _cases():
    c = {}
    for name, lo, hi in [
        ("sin", -3, 3),
        ("cos", -3, 3),
        ("tan", -1.2, 1.2),
        ("asin", -0.9, 0.9),
        ("acos", -0.9, 0.9),
        ("atan", -3, 3),
        ("sinh", -2, 2),
        ("cosh", -2, 2),
        ("tanh", -2, 2),
        ("asinh", -3, 3),
        ("acosh", 1.1, 3),
        ("atanh", -0.9, 0.9),
        ("exp", -2, 2),
        ("exp2", -2, 2),
        ("expm1", -2, 2),
        ("log", 0.2, 3),
        ("log1p", -0.8, 3),
        ("sqrt", 0.2, 3),
        ("rsqrt", 0.2, 3),
        ("logistic", -4, 4),
        ("erf", -2, 2),
        ("square", -2, 2),
        ("neg", -2, 2),
        ("erf_inv", -0.9, 0.9),
        ("lgamma", 0.5, 3),
        ("digamma", 0.5, 3),
    ]:
        c[name] = unary_cases(_bind(name), lo, hi)
    c["polygamma"] = unary_cases(lambda x: primitives["polygamma"].bind(x, n=1), 0.5, 3)
    c["copy"] = unary_cases(lambda x: primitives["copy"].bind(x))
    c["cbrt"] = unary_cases(lax.cbrt, sampler=lambda s: away_from_zero(0.3, 2, s))
    c["abs"] = unary_cases(lax.abs, sampler=lambda s: away_from_zero(0.3, 2, s))
    c["integer_pow"] = [
        (f"y={y}{s}", _int_pow(y), lambda s=s: (away_from_zero(0.4, 1.5, s),))
        for y in (0, 1, 2, 3, -2)
        for s in SHAPES
    ]
    c["add"] = binary_cases(lax.add, _u(-2, 2), _u(-2, 2))
    c["sub"] = binary_cases(lax.sub, _u(-2, 2), _u(-2, 2))
    c["mul"] = binary_cases(lax.mul, _u(-2, 2), _u(-2, 2))
    c["div"] = binary_cases(lax.div, _u(-2, 2), lambda s: away_from_zero(0.5, 2, s))
    c["pow"] = binary_cases(lax.pow, _u(0.5, 2), _u(-1.5, 1.5))
    c["atan2"] = binary_cases(lax.atan2, _u(-2, 2), lambda s: away_from_zero(0.5, 2, s))
    # fmod: x/y stays away from integers, where rem jumps
    c["rem"] = binary_cases(lax.rem, lambda s: away_from_zero(2.2, 2.8, s), _u(1.05, 1.15))
    c["max"] = binary_cases(lax.max, lambda s: distinct(s, "a"), lambda s: distinct(s, "b") + 0.05)
    c["min"] = binary_cases(lax.min, lambda s: distinct(s, "a"), lambda s: distinct(s, "b") + 0.05)
    c["select_n"] = [
        (
            f"bool{s}",
            lambda a, b, s=s: lax.select_n(np.asarray(uniform(0, 1, s) > 0.5), a, b),
            lambda s=s: (uniform(-1, 1, s, "a"), uniform(-1, 1, s, "b")),
        )
        for s in SHAPES
    ] + [
        (
            "int3",
            lambda a, b, d: lax.select_n(np.array([0, 1, 2, 2, 1, 0], np.int32), a, b, d),
            lambda: tuple(uniform(-1, 1, (6,), k) for k in "abd"),
        ),
        (
            "scalar_pred",
            lambda a, b: lax.select_n(np.bool_(True), a, b),
            lambda: (uniform(-1, 1, (3,), "a"), uniform(-1, 1, (3,), "b")),
        ),
    ]
    c["convert_element_type"] = [
        (
            "f64->f32->f64",
            lambda x: lax.convert_element_type(
                lax.mul(lax.convert_element_type(x, np.float32), 2.0), np.float64
            ),
            lambda: (uniform(-1, 1, (4,)),),
            # linear, so a large step has no truncation error and beats f32 rounding
            dict(eps=0.5, atol=1e-5, rtol=1e-5),
        ),
        (
            "weak",
            lambda x: fflow.core.bind(
                primitives["convert_element_type"], x, new_dtype=np.dtype("float64"), weak_type=True
            ),
            lambda: (uniform(-1, 1, (3,)),),
        ),
    ]
    c["cumsum"] = _axis_cases(lax.cumsum, uniform_like=True)
    c["cumprod"] = _axis_cases(lax.cumprod, uniform_like=True) + [
        ("with_zero", lambda x: lax.cumprod(x, 0), lambda: (np.array([1.5, 0.0, 2.0, -1.2]),)),
        (
            "two_zeros_rev",
            lambda x: lax.cumprod(x, 0, reverse=True),
            lambda: (np.array([1.5, 0.0, 2.0, 0.0, 0.7]),),
        ),
    ]
    c["cummax"] = _axis_cases(lax.cummax)
    c["cummin"] = _axis_cases(lax.cummin)
    c["reduce_sum"] = _reduce_cases(lax.reduce_sum, uniform_like=True)
    c["reduce_max"] = _reduce_cases(lax.reduce_max)
    c["reduce_min"] = _reduce_cases(lax.reduce_min)
    c["reduce_prod"] = _reduce_cases(lax.reduce_prod, uniform_like=True) + [
        ("one_zero", lambda x: lax.reduce_prod(x, (0,)), lambda: (np.array([1.5, 0.0, 2.0]),)),
        (
            "two_zeros",
            lambda x: lax.reduce_prod(x, (1,)),
            lambda: (np.array([[1.5, 0.0, 2.0, 0.0], [1.0, 2.0, 0.5, -1.0]]),),
        ),
        (
            "all_axes_3d",
            lambda x: lax.reduce_prod(x, (0, 2)),
            lambda: (uniform(0.5, 1.5, (2, 2, 3)),),
        ),
    ]
    c["dot_general"] = _dot_cases()
    c["broadcast_in_dim"] = [
        ("scalar", lambda x: lax.broadcast_in_dim(x, (2, 3), ()), lambda: (uniform(-1, 1, ()),)),
        ("row", lambda x: lax.broadcast_in_dim(x, (2, 3), (1,)), lambda: (uniform(-1, 1, (3,)),)),
        (
            "expand1",
            lambda x: lax.broadcast_in_dim(x, (4, 2, 3), (1, 2)),
            lambda: (uniform(-1, 1, (1, 3)),),
        ),
    ]
    c["reshape"] = [
        ("2x3->6", lambda x: lax.reshape(x, (6,)), lambda: (uniform(-1, 1, (2, 3)),)),
        ("6->3x1x2", lambda x: lax.reshape(x, (3, 1, 2)), lambda: (uniform(-1, 1, (6,)),)),
    ]
    c["transpose"] = [
        ("2d", lambda x: lax.transpose(x, (1, 0)), lambda: (uniform(-1, 1, (2, 3)),)),
        ("3d", lambda x: lax.transpose(x, (2, 0, 1)), lambda: (uniform(-1, 1, (2, 3, 4)),)),
    ]
    c["squeeze"] = [
        ("mid", lambda x: lax.squeeze(x, (1,)), lambda: (uniform(-1, 1, (2, 1, 3)),)),
        ("all", lambda x: lax.squeeze(x, (0, 1)), lambda: (uniform(-1, 1, (1, 1)),)),
    ]
    c["slice"] = [
        ("plain", lambda x: lax.slice(x, (1,), (4,)), lambda: (uniform(-1, 1, (5,)),)),
        (
            "strided2d",
            lambda x: lax.slice(x, (0, 1), (3, 6), (2, 2)),
            lambda: (uniform(-1, 1, (4, 7)),),
        ),
        ("stride_tail", lambda x: lax.slice(x, (1,), (6,), (3,)), lambda: (uniform(-1, 1, (8,)),)),
    ]
    c["pad"] = [
        (
            "edges",
            lambda x, v: lax.pad(x, v, ((1, 2, 0),)),
            lambda: (uniform(-1, 1, (3,)), np.float64(0.5)),
        ),
        (
            "interior_2d",
            lambda x, v: lax.pad(x, v, ((0, 1, 1), (2, 0, 2))),
            lambda: (uniform(-1, 1, (2, 3)), np.float64(-0.3)),
        ),
        (
            "negative",
            lambda x, v: lax.pad(x, v, ((-1, 2, 1), (1, -2, 0))),
            lambda: (uniform(-1, 1, (3, 4)), np.float64(0.7)),
        ),
    ]
    c["concatenate"] = [
        (
            "axis0",
            lambda a, b: lax.concatenate([a, b], 0),
            lambda: (uniform(-1, 1, (2, 3), "a"), uniform(-1, 1, (1, 3), "b")),
        ),
        (
            "axis1_three",
            lambda a, b: lax.concatenate([a, b, a], 1),
            lambda: (uniform(-1, 1, (2, 3), "a"), uniform(-1, 1, (2, 2), "b")),
        ),
    ]
    c["rev"] = [("2d", lambda x: lax.rev(x, (0, 1)), lambda: (uniform(-1, 1, (2, 3)),))]
    c["dynamic_slice"] = [
        ("inb", lambda x: lax.dynamic_slice(x, (1, 0), (2, 2)), lambda: (uniform(-1, 1, (3, 4)),)),
        (
            "clamped",
            lambda x: lax.dynamic_slice(x, (5, -1), (2, 3)),
            lambda: (uniform(-1, 1, (3, 4)),),
        ),
    ]
    c["dynamic_update_slice"] = [
        (
            "inb",
            lambda x, u: lax.dynamic_update_slice(x, u, (1, 1)),
            lambda: (uniform(-1, 1, (3, 4), "x"), uniform(-1, 1, (2, 2), "u")),
        ),
        (
            "clamped",
            lambda x, u: lax.dynamic_update_slice(x, u, (7,)),
            lambda: (uniform(-1, 1, (5,), "x"), uniform(-1, 1, (2,), "u")),
        ),
    ]
    idx_dup = np.array([[0], [2], [0], [1]], np.int32)
    idx_2d = np.array([[0, 1], [2, 0], [0, 1]], np.int32)
    idx_unique = np.array([[2], [0]], np.int32)
    c["gather"] = [
        ("rows_dup", lambda x: lax.gather(x, idx_dup, (0,)), lambda: (uniform(-1, 1, (3, 2)),)),
        ("points", lambda x: lax.gather(x, idx_2d, (0, 1)), lambda: (uniform(-1, 1, (3, 2)),)),
        ("axis1", lambda x: lax.gather(x, idx_dup, (1,)), lambda: (uniform(-1, 1, (2, 3)),)),
        (
            "clamped",
            lambda x: lax.gather(x, np.array([[5], [-2]], np.int32), (0,)),
            lambda: (uniform(-1, 1, (3,)),),
        ),
    ]
    idx_along = np.array([[2, 0, 2], [1, 1, 7], [-3, 0, 1]], np.int32)  # repeats, clamps
    c["take_along_axis"] = [
        (
            "axis1",
            lambda x: lax.take_along_axis(x, idx_along, 1),
            lambda: (uniform(-1, 1, (3, 4)),),
        ),
        (
            "axis0",
            lambda x: lax.take_along_axis(x, idx_along.T[:2], 0),
            lambda: (uniform(-1, 1, (3, 3)),),
        ),
    ]
    c["scatter_add_along_axis"] = [
        (
            "axis1",
            lambda x, u: lax.scatter_add_along_axis(x, idx_along, u, 1),
            lambda: (uniform(-1, 1, (3, 4), "x"), uniform(-1, 1, (3, 3), "u")),
        ),
        (
            "one_per_line",
            lambda x, u: lax.scatter_add_along_axis(x, idx_along[:, :1], u, -1),
            lambda: (uniform(-1, 1, (3, 4), "x"), uniform(-1, 1, (3, 1), "u")),
        ),
    ]
    c["scatter_add"] = [
        (
            "dup",
            lambda x, u: lax.scatter_add(x, idx_dup, u, (0,)),
            lambda: (uniform(-1, 1, (3, 2), "x"), uniform(-1, 1, (4, 2), "u")),
        ),
        (
            "oob_dropped",
            lambda x, u: lax.scatter_add(x, np.array([[1], [7]], np.int32), u, (0,)),
            lambda: (uniform(-1, 1, (3,), "x"), uniform(-1, 1, (2,), "u")),
        ),
    ]
    c["scatter"] = [
        (
            "unique",
            lambda x, u: lax.scatter(x, idx_unique, u, (0,)),
            lambda: (uniform(-1, 1, (3, 2), "x"), uniform(-1, 1, (2, 2), "u")),
        ),
        (
            "dup_last_wins",
            lambda x, u: lax.scatter(x, idx_dup, u, (0,)),
            lambda: (uniform(-1, 1, (3, 2), "x"), uniform(-1, 1, (4, 2), "u")),
        ),
    ]
    c["scatter_mul"] = [
        (
            "unique",
            lambda x, u: lax.scatter_mul(x, idx_unique, u, (0,)),
            lambda: (uniform(-1, 1, (3, 2), "x"), uniform(-1, 1, (2, 2), "u")),
        ),
        (
            "dup",
            lambda x, u: lax.scatter_mul(x, idx_dup, u, (0,)),
            lambda: (uniform(-1, 1, (3, 2), "x"), away_from_zero(0.5, 1.5, (4, 2), "u")),
        ),
    ]
    c["scatter_mul"] += [
        (
            "dup_zeros",
            lambda x, u: lax.scatter_mul(x, idx_dup, u, (0,)),
            lambda: (
                uniform(-1, 1, (3, 2), "x"),
                np.array([[0.0, 0.5], [1.2, 0.0], [0.0, 0.0], [2.0, 0.7]]),
            ),
        ),
    ]
    for name, fn in [("scatter_min", lax.scatter_min), ("scatter_max", lax.scatter_max)]:
        c[name] = [
            (
                "unique",
                lambda x, u, fn=fn: fn(x, idx_unique, u, (0,)),
                lambda: (distinct((3, 2), "x"), distinct((2, 2), "u") + 0.05),
            ),
            (
                "dup_oob",
                lambda x, u, fn=fn: fn(x, np.array([[0], [2], [0], [5]], np.int32), u, (0,)),
                lambda: (distinct((3, 2), "x"), distinct((4, 2), "u") + 0.05),
            ),
        ]
    c["sort"] = [
        ("1d", lambda x: lax.sort(x), lambda: (distinct((5,)),)),
        ("2d_axis0", lambda x: lax.sort(x, 0), lambda: (distinct((3, 4)),)),
        (
            "two_operands",
            lambda k, v: tuple(lax.sort([k, v], 1, num_keys=1)),
            lambda: (distinct((2, 4), "k"), uniform(-1, 1, (2, 4), "v")),
        ),
    ]
    _custom_cases(c)
    if hasattr(lax, "scan"):
        _control_flow_cases(c)
    return c


@fflow.custom_jvp
def _softplus(x):
    return jnp.log1p(jnp.exp(x))


@_softplus.defjvp
def _softplus_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return _softplus(x), t * lax.logistic(x)


@fflow.custom_vjp
def _scaled_tanh(x, y):
    return jnp.tanh(x) * y


def _scaled_tanh_fwd(x, y):
    out = _scaled_tanh(x, y)
    return out, (x, y)


def _scaled_tanh_bwd(res, ct):
    x, y = res
    th = jnp.tanh(x)
    return ct * y * (1 - th * th), ct * th


_scaled_tanh.defvjp(_scaled_tanh_fwd, _scaled_tanh_bwd)


def _custom_cases(c):
    c["custom_jvp_call"] = [
        (str(s), lambda x: _softplus(x) * 2.0, lambda s=s: (uniform(-2, 2, s),)) for s in SHAPES
    ]
    # forward mode of a custom_vjp function is undefined (as in JAX): reverse mode only
    c["custom_vjp_call"] = [
        (
            str(s),
            lambda x, y: _scaled_tanh(jnp.sin(x), y),
            lambda s=s: (uniform(-2, 2, s, "x"), uniform(-2, 2, s, "y")),
            dict(modes=("rev",)),
        )
        for s in SHAPES
    ]
    c["checkpoint"] = [
        (
            str(s),
            fflow.checkpoint(lambda x, y: jnp.sin(jnp.exp(x) * y) * x),
            lambda s=s: (uniform(-1, 1, s, "x"), uniform(-1, 1, s, "y")),
        )
        for s in SHAPES
    ] + [
        (
            "dots_saveable",
            fflow.checkpoint(
                lambda w, x: jnp.tanh(jnp.tanh(x @ w) @ w),
                policy=fflow.checkpoint_policies.dots_saveable,
            ),
            lambda: (uniform(-1, 1, (3, 3), "w"), uniform(-1, 1, (2, 3), "x")),
        )
    ]


def _control_flow_cases(c):
    c["cond"] = [
        (
            f"{branch}{s}",
            lambda x, y, b=branch: lax.cond(
                b == "true", lambda a, z: jnp.sin(a) * z, lambda a, z: jnp.cos(a) + z, x, y
            ),
            lambda s=s: (uniform(-2, 2, s, "x"), uniform(-2, 2, s, "y")),
        )
        for branch in ("true", "false")
        for s in SHAPES
    ] + [
        (
            "traced_pred",
            lambda x, y: lax.cond(
                jnp.sum(x) > 0, lambda a, z: jnp.sin(a) * z, lambda a, z: jnp.cos(a) + z, x, y
            ),
            lambda: (uniform(0.5, 2, (3,), "x"), uniform(-2, 2, (3,), "y")),
        )
    ]
    c["scan"] = [
        (
            str(s),
            lambda c0, xs: lax.scan(lambda h, x: (h * jnp.sin(x) + x, h * x), c0, xs),
            lambda s=s: (uniform(-1, 1, s, "c"), uniform(-1, 1, (4,) + s, "xs")),
        )
        for s in SHAPES
    ] + [
        (
            "reverse",
            lambda c0, xs: lax.scan(lambda h, x: (jnp.tanh(h + x), h), c0, xs, reverse=True),
            lambda: (uniform(-1, 1, (2,), "c"), uniform(-1, 1, (3, 2), "xs")),
        )
    ]
    # reverse mode of while_loop is undefined (as in JAX): forward mode only
    c["while"] = [
        (
            str(s),
            lambda x: lax.while_loop(
                lambda st: st[0] < 3, lambda st: (st[0] + 1, jnp.sin(st[1]) * 1.5), (0, x)
            )[1],
            lambda s=s: (uniform(-1, 1, s),),
            dict(modes=("fwd",)),
        )
        for s in SHAPES
    ]


def _axis_cases(fn, uniform_like=False):
    sample = (lambda s: uniform(0.5, 1.5, s)) if uniform_like else distinct
    out = []
    for shape, axis, reverse in [((5,), 0, False), ((3, 4), 1, False), ((3, 4), 0, True)]:
        out.append(
            (
                f"{shape}ax{axis}{'r' if reverse else ''}",
                lambda x, a=axis, r=reverse: fn(x, a, reverse=r),
                lambda s=shape: (sample(s),),
            )
        )
    return out


def _reduce_cases(fn, uniform_like=False):
    sample = (lambda s: uniform(0.5, 1.5, s)) if uniform_like else distinct
    out = []
    for shape, axes in [((4,), (0,)), ((2, 3), (1,)), ((2, 3, 4), (0, 2)), ((2, 3), ())]:
        out.append((f"{shape}{axes}", lambda x, a=axes: fn(x, a), lambda s=shape: (sample(s),)))
    return out


def _dot_cases():
    specs = [
        ("matvec", (3, 4), (4,), (((1,), (0,)), ((), ()))),
        ("matmul", (2, 3), (3, 4), (((1,), (0,)), ((), ()))),
        ("outer", (2,), (3,), (((), ()), ((), ()))),
        ("batch_leading", (5, 2, 3), (5, 3, 4), (((2,), (1,)), ((0,), (0,)))),
        ("batch_middle", (2, 5, 3), (3, 5, 4), (((2,), (0,)), ((1,), (1,)))),
        ("two_contract", (2, 3, 4), (4, 5, 3), (((1, 2), (2, 0)), ((), ()))),
        ("batch_and_contract_rev", (3, 2, 4), (4, 3, 5), (((2,), (0,)), ((0,), (1,)))),
    ]
    return [
        (
            name,
            lambda a, b, dn=dn: lax.dot_general(a, b, dn),
            lambda ls=ls, rs=rs: (uniform(-1, 1, ls, "l"), uniform(-1, 1, rs, "r")),
        )
        for name, ls, rs, dn in specs
    ]


CASES = _cases()
OP_DB_GRAD = {op.name for op in OPS if op.grad is True}

# Differentiable primitives that are not checked against finite differences here.
NOT_GRAD_CHECKED = {
    "nextafter": "a step of one ulp: the derivative is defined as zero (like floor), "
    "which finite differences of the discrete step cannot confirm",
    "iota": "no operands to differentiate",
    **{
        name: "a host callback: not differentiable (as in JAX), tests/test_compat_callbacks.py "
        "checks that grad raises"
        for name in ("pure_callback", "io_callback")
    },
    "debug_callback": "a side effect (fflow.debug.print) with no output to differentiate; "
    "tests/test_debug.py runs it under grad and jit(grad)",
    "sbp_constraint": "an identity carrying an SBP annotation (with_sbp); only meaningful "
    "under shard, whose tests check its gradient against unsharded runs",
    "shard_call": "runs a sharded nested program per device; its gradients are checked by the "
    "shard tests against unsharded runs",
    **{
        name: "a dense linear-algebra primitive whose input must be well conditioned (SPD "
        "for cholesky, distinct eigen/singular values): checked against finite differences "
        "on such matrices in tests/test_numpy_linalg.py"
        for name in ("cholesky", "eigh", "svd", "qr", "slogdet", "linalg_solve")
    },
    "fft": "complex-valued outputs: its JVP and transposes are checked against finite "
    "differences through real parts in tests/test_numpy_fft.py",
    "pipeline_call": "a pipelined loss over placements; its gradients are checked against "
    "the un-pipelined model in tests/test_pipeline.py",
    "pipeline_call_lin": "the linear tangent map of pipeline_call, checked with it",
    "shard_move": "a move between placements inside shard: values and gradients checked "
    "against the unsharded function for every SBP pair in tests/test_shard_mixed.py",
    **{
        name: "a linear map inside dot_product_attention's derivative (its tangent map and "
        "that map's transpose): run by the dot_product_attention row of tests/op_db.py"
        for name in ("attention_jvp", "attention_bwd")
    },
    "custom_lin": "only appears in linearized programs of custom_vjp_call (its transpose runs "
    "the user's bwd); checked through the custom_vjp_call cases",
    **{
        name: "a collective over a named vmap axis: the vmap evaluates it, so it never appears "
        "in a traced program; its gradients are checked through vmap (check_grads, order 2) "
        "in tests/test_vmap_named.py"
        for name in ("psum", "pmax", "pmin", "all_gather_axis")
    },
}


# Families checked elsewhere, by trait.
NOT_GRAD_CHECKED_TRAITS = {
    "collective": "collectives only run inside shard's per-device SPMD programs; their "
    "gradients (the B<->P duality) are checked by the shard tests against unsharded runs",
}


def _differentiable():
    names = []
    for name, prim in sorted(primitives.items()):
        if "zero_derivative" in prim.traits or prim.traits & set(NOT_GRAD_CHECKED_TRAITS):
            continue
        names.append(name)
    return names


def _params():
    out = []
    for name in _differentiable():
        if name in NOT_GRAD_CHECKED:
            continue
        cases = CASES.get(name)
        if not cases and name in OP_DB_GRAD:
            continue  # grad-checked from its op-database row (tests/test_op_db.py)
        if not cases:
            out.append(pytest.param(name, None, None, {}, id=f"{name}-MISSING"))
            continue
        for case_id, fn, make_args, *kw in cases:
            kw = kw[0] if kw else {}
            out.append(pytest.param(name, fn, make_args, kw, id=f"{name}-{case_id}"))
    return out


@pytest.mark.parametrize("name,fn,make_args,kw", _params())
def test_primitive_grads(name, fn, make_args, kw):
    if fn is None:
        pytest.fail(
            f"primitive {name!r} has no gradient-check case: add one to CASES in "
            f"tests/test_autodiff_primitives.py (or to NOT_GRAD_CHECKED with the reason)"
        )
    args = make_args()
    used = _primitives_used(fn, args)
    assert name in used, f"case for {name} does not bind it (binds {sorted(used)})"
    check_grads(fn, args, **{"order": 2, "modes": ("fwd", "rev"), **kw})


def _primitives_used(fn, args):
    return primitive_names(fflow.make_jaxpr(fn)(*args))


def test_cases_name_real_primitives():
    unknown = sorted(set(CASES) - set(primitives) - {"erf_inv"})
    assert not unknown, f"CASES has entries for primitives that do not exist: {unknown}"
