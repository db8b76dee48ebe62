"""The test op database: one record per primitive, in the manner of JAX's op records.

A record says how to call the primitive (`fn`, over arrays), which arguments to draw
(`args`: kind, shape, range), and which coverage tests it takes part in: `grad`
(forward and reverse mode against central finite differences, float64), `vmap`
(against a Python loop over the examples), `lower` (the jitted kernel against eager
evaluation, bit for bit unless `exact=False`), `amp` (the NumPy implementation on
bfloat16/float16 inputs against the float32 computation). A flag is True, or a string
saying why the test does not apply. tests/test_op_db.py runs every record.

Adding a primitive: one `Op(...)` row below. A primitive with no row must be in
`ELSEWHERE` with the test file that covers it (nested programs, collectives...), and
the rule-table exemptions (`NO_RULE`) are here too.
"""

import zlib
from dataclasses import dataclass

import numpy as np

import fflow.numpy as jnp
from fflow import lax
from fflow.core import primitives


@dataclass(frozen=True)
class Arg:
    kind: str  # "f" float, "i" int32, "u" uint32, "b" bool, "d" distinct floats (no ties)
    shape: tuple = (3, 4)
    lo: float = -2.0
    hi: float = 2.0

    def draw(self, key, float_dtype):
        rng = np.random.RandomState(zlib.crc32(repr((key, self)).encode()) % (2**31))
        if self.kind == "f":
            return rng.uniform(self.lo, self.hi, self.shape).astype(float_dtype)
        if self.kind == "d":  # gaps of at least 0.3: no ties for max/min/sort/argmax
            n = int(np.prod(self.shape, dtype=np.int64))
            return (rng.permutation(n) * 0.3 - 0.15 * n).reshape(self.shape).astype(float_dtype)
        if self.kind == "i":
            return rng.randint(int(self.lo), int(self.hi), self.shape).astype(np.int32)
        if self.kind == "u":
            return rng.randint(int(self.lo), int(self.hi), self.shape).astype(np.uint32)
        return rng.uniform(size=self.shape) < 0.5


F = Arg("f")
D = Arg("d")


@dataclass(frozen=True)
class Op:
    name: str  # the primitive the record covers (fn must bind it)
    fn: object  # arrays -> array or tuple of arrays
    args: tuple = (F,)
    grad: object = True  # True, or why not
    vmap: object = True
    lower: object = True
    amp: object = True  # checked only when every argument is a float
    exact: bool = True  # lowering bit for bit (False: rtol 1e-5)
    grad_tol: float = 1e-5

    def draw(self, float_dtype=np.float32):
        return [a.draw((self.name, i), float_dtype) for i, a in enumerate(self.args)]


def _bind(name, **params):
    return lambda *a: primitives[name].bind(*a, **params)


ZERO = "zero derivative (a step function or a non-float output)"
INT = "integer or bool operands"

OPS = []


def _add(*ops):
    OPS.extend(ops)


# -- elementwise unary (lax.name(x) on x drawn from (lo, hi)) -------------------------
for _name, _lo, _hi in [
    ("sin", -3, 3), ("cos", -3, 3), ("tan", -1.2, 1.2), ("asin", -0.9, 0.9),
    ("acos", -0.9, 0.9), ("atan", -3, 3), ("sinh", -3, 3), ("cosh", -3, 3),
    ("tanh", -3, 3), ("asinh", -3, 3), ("acosh", 1.1, 4), ("atanh", -0.9, 0.9),
    ("exp", -3, 3), ("exp2", -3, 3), ("expm1", -3, 3), ("log", 0.1, 4),
    ("log1p", -0.5, 3), ("sqrt", 0.1, 4), ("rsqrt", 0.1, 4), ("cbrt", 0.2, 3),
    ("logistic", -5, 5), ("erf", -2, 2), ("erf_inv", -0.9, 0.9), ("neg", -3, 3),
    ("square", -3, 3),
]:  # fmt: skip
    _add(Op(_name, getattr(lax, _name), (Arg("f", (3, 4), _lo, _hi),)))
for _name, _params in [("lgamma", {}), ("digamma", {}), ("polygamma", {"n": 1})]:
    _add(Op(_name, _bind(_name, **_params), (Arg("f", (3, 4), 0.5, 4),)))
_add(
    Op("abs", lax.abs, (Arg("f", (3, 4), 0.1, 2),)),  # away from the kink at 0
    Op("abs", lax.abs, grad=ZERO),  # the sign of zero only; same primitive, both signs
    Op("integer_pow", lambda x: lax.integer_pow(x, 3) + lax.integer_pow(x, -2),
       (Arg("f", (3, 4), 0.5, 2),)),
    Op("stop_gradient", lambda x: lax.stop_gradient(x) * 2, grad=ZERO),
    Op("copy", _bind("copy")),
    Op("is_finite", lambda x: lax.is_finite(lax.log(x)), grad=ZERO, amp="bool output"),
)  # fmt: skip
for _name in ("sign", "floor", "ceil"):
    _add(Op(_name, getattr(lax, _name), grad=ZERO))
_add(
    Op("round", lambda x: lax.round(x * 4.0), grad=ZERO),
    Op("round_even", lambda x: lax.round(x * 4.0, 1), grad=ZERO),
)

# -- elementwise binary, compare, select ---------------------------------------------
_POS = Arg("f", (3, 4), 0.5, 2)
for _name, _args in [
    ("add", (F, F)), ("sub", (F, F)), ("mul", (F, F)), ("div", (F, _POS)),
    ("pow", (_POS, F)), ("atan2", (F, _POS)), ("max", (D, Arg("d", (3, 4), 1))),
    ("min", (D, Arg("d", (3, 4), 1))), ("rem", (Arg("f", (3, 4), 0.6, 0.9), _POS)),
]:  # fmt: skip
    _add(Op(_name, getattr(lax, _name), _args))
_add(Op("nextafter", lax.nextafter, (F, F), grad="one ulp step: derivative defined as zero",
        amp="one step in the input's own precision, not a rounding of the float32 step"))  # fmt: skip
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    _add(Op(_name, getattr(lax, _name), (F, F), grad=ZERO))
_add(Op("select_n", lambda x, y: lax.select_n(lax.gt(x, y), x, y), (F, F), grad=ZERO))
_add(Op("select_n", lambda x, y: lax.select_n(lax.gt(x, 0.1), x * 2, y), (D, F)))

# -- integer and bool -----------------------------------------------------------------
_I, _S = Arg("i", (3, 4), -20, 20), Arg("i", (3, 4), 0, 8)
for _name, _fn, _args in [
    ("and", lax.bitwise_and, (_I, _I)), ("or", lax.bitwise_or, (_I, _I)),
    ("xor", lax.bitwise_xor, (_I, _I)), ("not", lax.bitwise_not, (Arg("b"),)),
    ("shift_left", lax.shift_left, (_I, _S)),
    ("shift_right_arithmetic", _bind("shift_right_arithmetic"), (_I, _S)),
    ("shift_right_logical", lax.shift_right_logical, (Arg("u", (3, 4), 0, 2**31), Arg("u", (3, 4), 0, 33))),
    ("div", lax.div, (_I, Arg("i", (3, 4), 1, 7))), ("rem", lax.rem, (_I, Arg("i", (3, 4), 1, 7))),
]:  # fmt: skip
    _add(Op(_name, _fn, _args, grad=INT))
_add(Op("and", lax.bitwise_and, (Arg("b"), Arg("b")), grad=INT))
_add(Op("population_count", lax.population_count, (Arg("u", (3, 4), 0, 2**31),), grad=INT))

# -- dtype, shape, indexing -----------------------------------------------------------
_A45 = (Arg("f", (4, 5)),)
_add(
    Op("convert_element_type", lambda x: lax.convert_element_type(x, np.float16) * 2,
       amp="its output dtype is the point",
       grad="a float16 output: finite differences see its rounding steps (tests/test_autodiff_primitives.py)"),
    Op("convert_element_type", lambda x: (x.astype(np.int32), x.astype(bool)), grad=ZERO),
    Op("bitcast_convert_type", lambda x: lax.bitcast_convert_type(x, np.int32), grad=ZERO,
       amp="its output is the input's bits"),
    Op("broadcast_in_dim", lambda x: lax.broadcast_in_dim(x, (2, 3, 4), (1, 2))),
    Op("reshape", lambda x: lax.reshape(x, (4, 3)) * 2),
    Op("transpose", lambda x: lax.transpose(x, (1, 0)) + 1),
    Op("squeeze", lambda x: lax.squeeze(lax.reshape(x, (1, 3, 4)), (0,))),
    Op("slice", lambda x: lax.slice(x, (1, 0), (4, 5), (2, 2)), _A45),
    Op("pad", lambda x: lax.pad(x, np.asarray(0.5, x.dtype), ((1, 2, 1), (0, -1, 0)))),
    Op("concatenate", lambda x, y: lax.concatenate([x, y * 2], 1), (F, F)),
    Op("rev", lambda x: lax.rev(x, (0,))),
    Op("iota", lambda x: lax.iota(x.dtype, 4) + x, grad="no operands (covered through x)"),
    Op("dynamic_slice", lambda x: lax.dynamic_slice(x, (np.int32(1), np.int32(3)), (2, 2)), _A45),
    Op("dynamic_update_slice",
       lambda x, y: lax.dynamic_update_slice(x * 2, y, (np.int32(1), np.int32(2))),
       (F, Arg("f", (2, 2)))),
    Op("gather", lambda x: lax.gather(x, jnp.asarray([[0], [3], [1]]), (0,)), _A45),
    Op("take_along_axis",
       lambda x: lax.take_along_axis(x, jnp.asarray([[0, 4, 4, 1], [2, 2, 0, 3]]), 1),
       (Arg("f", (2, 5)),)),
    Op("scatter_add_along_axis",
       lambda x, u: lax.scatter_add_along_axis(x, jnp.asarray([[0, 4, 4], [2, 2, 0]]), u, 1),
       (Arg("f", (2, 5)), Arg("f", (2, 3)))),
    Op("scatter", lambda x, u: lax.scatter(x, jnp.asarray([[0], [2]]), u, (0,)),
       (_A45[0], Arg("f", (2, 5)))),
    Op("scatter_add", lambda x, u: lax.scatter_add(x, jnp.asarray([[0], [0]]), u, (0,)),
       (_A45[0], Arg("f", (2, 5)))),
    Op("scatter_mul", lambda x, u: lax.scatter_mul(x, jnp.asarray([[1], [3]]), u, (0,)),
       (_A45[0], Arg("f", (2, 5)))),
    Op("scatter_min", lambda x, u: lax.scatter_min(x, jnp.asarray([[1], [3]]), u, (0,)),
       (Arg("d", (4, 5)), Arg("d", (2, 5), 1))),
    Op("scatter_max", lambda x, u: lax.scatter_max(x, jnp.asarray([[1], [3]]), u, (0,)),
       (Arg("d", (4, 5)), Arg("d", (2, 5), 1))),
)  # fmt: skip

# -- dot, reductions, cumulative, sort ------------------------------------------------
_add(
    Op("dot_general", lambda x, y: (lax.dot(x, lax.transpose(y, (1, 0))),
                                    lax.dot_general(x, y, (((1,), (1,)), ((0,), (0,))))),
       (F, F), exact=False),
    Op("reduce_sum", lambda x: (lax.reduce_sum(x, (0,)), lax.reduce_sum(x, (0, 1)))),
    Op("reduce_prod", lambda x: lax.reduce_prod(x, (1,)), (Arg("f", (3, 4), 0.5, 1.5),), exact=False),
    Op("reduce_max", lambda x: lax.reduce_max(x, (1,)), (D,)),
    Op("reduce_min", lambda x: lax.reduce_min(x, (0,)), (D,)),
    Op("reduce_or", lambda x: lax.reduce_or(x > 0, (1,)), grad=ZERO, amp="bool output"),
    Op("reduce_and", lambda x: lax.reduce_and(x > -1, (0,)), grad=ZERO, amp="bool output"),
    Op("argmax", lambda x: lax.argmax(x, 1), (D,), grad=ZERO, amp="index output"),
    Op("argmin", lambda x: lax.argmin(x, 0), (D,), grad=ZERO, amp="index output"),
    Op("cumsum", lambda x: lax.cumsum(x, 1)),
    Op("cumprod", lambda x: lax.cumprod(x, 0, reverse=True), (Arg("f", (3, 4), 0.5, 1.5),)),
    Op("cummax", lambda x: lax.cummax(x, 1), (D,)),
    Op("cummin", lambda x: lax.cummin(x, 0), (D,)),
    Op("sort", lambda x: lax.sort(x, 1), (D,)),
)  # fmt: skip


def _uniform(x):
    import fflow.random as fr  # fflow.random imports fflow.nn's layer: keep it out of the header

    return fr.uniform(fr.fold_in(fr.PRNGKey(1), 3), (3, 4), x.dtype) + x


_add(
    Op("random_bits", _uniform, grad="the key is an integer operand (covered through x)",
       amp="bits, not a float computation"),
    Op("random_fold_in", _uniform, grad="the key is an integer operand (covered through x)",
       amp="bits, not a float computation"),
)  # fmt: skip


def _attention(q, k, v):
    import fflow.nn  # noqa: PLC0415  (fflow.nn is above fflow.numpy in the layer order)

    return fflow.nn.dot_product_attention(q, k, v, is_causal=True)


_QKV = Arg("f", (2, 3, 2, 4), -1, 1)
_add(Op("dot_product_attention", _attention, (_QKV, _QKV, _QKV), exact=False))

_COLLECTIVE = "a collective: runs inside shard's per-device programs (tests/test_shard_*.py, MPI)"
_NAMED = "a named-axis collective, evaluated by vmap (tests/test_vmap_named.py)"
_LINALG = "needs well-conditioned inputs: tests/test_numpy_linalg.py"
_NESTED = "holds a nested program"

# Primitives without a record, and the tests that cover them.
ELSEWHERE = {
    **{
        n: _COLLECTIVE
        for n in (
            "all_gather",
            "all_reduce",
            "all_to_all",
            "reduce_scatter",
            "exchange",
            "keep_one",
            "shard_pad",
            "shard_slice",
        )
    },  # fmt: skip
    **{n: _NAMED for n in ("psum", "pmax", "pmin", "all_gather_axis", "axis_index")},
    **{n: _LINALG for n in ("cholesky", "eigh", "svd", "qr", "slogdet", "linalg_solve")},
    "fft": "complex outputs: tests/test_numpy_fft.py",
    "cond": f"{_NESTED}: tests/test_control_flow*.py",
    "while": f"{_NESTED}: tests/test_control_flow*.py",
    "scan": f"{_NESTED}: tests/test_control_flow*.py",
    "checkpoint": f"{_NESTED}: tests/test_control_flow_checkpoint.py, test_planner_remat.py",
    "custom_jvp_call": f"{_NESTED}: tests/test_autodiff_custom.py",
    "custom_vjp_call": f"{_NESTED}: tests/test_autodiff_custom.py",
    "custom_lin": "the linearized custom_vjp rule: tests/test_autodiff_custom.py",
    "pipeline_call": f"{_NESTED}: tests/test_pipeline*.py",
    "pipeline_call_lin": "the tangent map of pipeline_call: tests/test_pipeline*.py",
    "shard_call": f"{_NESTED}: tests/test_shard_transform.py",
    "shard_move": "a move between placements inside shard: tests/test_pipeline_transfer.py",
    "sbp_constraint": "an identity carrying an SBP annotation: tests/test_shard_sbp.py",
    "debug_callback": "a side effect: tests/test_debug.py",
    **{
        n: "a host callback: tests/test_compat_callbacks.py"
        for n in ("pure_callback", "io_callback")
    },
    "attention_jvp": "the tangent map of dot_product_attention: run by its grad row",
    "attention_bwd": "the transpose of attention_jvp: run by dot_product_attention's grad row",
}

# Rule-table exemptions: table -> {primitive: reason}.
NO_RULE = {
    "jvp": {
        "iota": "no operands, so it never sees a tangent (JVPTrace binds it on the parent)",
    },
    "transpose": {},
    "amp_class": {
        "custom_jvp_call": "its Python JVP rule must see the dtypes it was written for",
        "custom_vjp_call": "its Python fwd/bwd rules must see the dtypes they were written for",
        "custom_lin": "the linearized custom rule of custom_vjp, same reason",
        "checkpoint": "nested program: rewritten by amp's nested-program rule, operands kept",
    },
}


def load_all_primitives():
    """Import the modules that register primitives lazily (fflow's own: failures fail)."""
    import importlib

    for mod in ("fflow.random", "fflow.transforms.remat", "fflow.transforms.shard",
                "fflow.primitives.collectives", "fflow.primitives.control_flow",
                "fflow.pipelining", "fflow.debug", "fflow.callbacks",
                "fflow.transforms.custom"):  # fmt: skip
        importlib.import_module(mod)
    return primitives


def direct_call(op):
    """(args, params) when `op.fn` binds its primitive straight on its arguments (the
    form the SBP signature check needs), else None."""
    import fflow  # noqa: PLC0415  (tests only)

    args = op.draw()
    program = fflow.make_jaxpr(op.fn)(*args)
    for eqn in program.eqns:
        if eqn.primitive.name == op.name and list(eqn.inputs) == list(program.invars):
            return args, dict(eqn.params)
    return None
