"""fp32 vs bf16 vs fp16 on hypothesis-drawn programs mixing the three AMP classes.

Each drawn program is a chain of blocks over an (n, d) state, each block built from
primitives of several classes (matmul: low; exp/log/sum/pow: fp32; tanh, reshape,
transpose, select, scalar arithmetic: follow). The reference is the same function
without AMP, in fp32. Every block keeps values O(1) so the error stays a few units
of roundoff of the compute dtype per block:

    |amp(f)(x) - f(x)| <= TOL[dtype] * n_blocks * (1 + |f(x)|)   elementwise,

with TOL = 2^-6 for bf16 (unit roundoff 2^-9) and 2^-9 for fp16 (2^-12).
"""

import ml_dtypes
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import fflow
import fflow.numpy as jnp

N, D = 6, 8
TOL = {"bf16": 2.0**-6, "fp16": 2.0**-9}
LOW = {"bf16": np.dtype(ml_dtypes.bfloat16), "fp16": np.dtype(np.float16)}


def softmax(h):
    e = jnp.exp(h - jnp.max(h, axis=-1, keepdims=True))
    return e / jnp.sum(e, axis=-1, keepdims=True)


def block(kind, h, w):
    if kind == "matmul_tanh":  # low + follow
        return jnp.tanh(h @ w)
    if kind == "softmax":  # fp32 (exp, sum) + follow (max, sub, div)
        return softmax(h) * D - 1.0
    if kind == "log1p_square":  # fp32 (log, integer_pow) + follow
        return jnp.log(1.0 + h**2) - 0.5
    if kind == "rms_norm":  # fp32 (sum of squares, rsqrt-ish) + follow
        return h / jnp.sqrt(jnp.mean(h * h, axis=-1, keepdims=True) + 1e-3)
    if kind == "leaky_select":  # follow: compare + select
        return jnp.where(h > 0, h, 0.1 * h)
    if kind == "transpose_reshape":  # follow: layout only
        return jnp.reshape(jnp.transpose(jnp.reshape(h, (D, N))), (N, D)) * 0.5
    if kind == "sin_affine":  # follow
        return jnp.sin(h) * 0.75 + 0.1
    if kind == "logsumexp_center":  # fp32 (exp, sum, log) + follow
        m = jnp.max(h, axis=-1, keepdims=True)
        lse = m + jnp.log(jnp.sum(jnp.exp(h - m), axis=-1, keepdims=True))
        return jnp.tanh(h - lse + 2.0)
    raise ValueError(kind)


KINDS = [
    "matmul_tanh",
    "softmax",
    "log1p_square",
    "rms_norm",
    "leaky_select",
    "transpose_reshape",
    "sin_affine",
    "logsumexp_center",
]


def make_program(kinds):
    def f(ws, x):
        h = x
        for kind, w in zip(kinds, ws):
            h = block(kind, h, w)
        return h, jnp.sum(h * h) / h.size

    return f


def draw_inputs(seed, n_blocks):
    rng = np.random.default_rng(seed)
    ws = [
        jnp.asarray((rng.normal(size=(D, D)) * 1.5 / np.sqrt(D)).astype(np.float32))
        for _ in range(n_blocks)
    ]
    x = jnp.asarray(rng.normal(size=(N, D)).astype(np.float32))
    return ws, x


programs = st.lists(st.sampled_from(KINDS), min_size=2, max_size=6).filter(
    lambda ks: "matmul_tanh" in ks
)


@settings(max_examples=25, deadline=None)
@given(kinds=programs, seed=st.integers(0, 2**31 - 1), policy=st.sampled_from(["bf16", "fp16"]))
def test_drawn_programs_match_fp32_within_tolerance(kinds, seed, policy):
    f = make_program(kinds)
    ws, x = draw_inputs(seed, len(kinds))
    ref_h, ref_s = f(ws, x)
    h, s = fflow.amp(f, policy)(ws, x)
    assert h.dtype == np.float32 and s.dtype == np.float32
    tol = TOL[policy] * len(kinds)
    ref_h = np.asarray(ref_h, np.float64)
    err = np.abs(np.asarray(h, np.float64) - ref_h)
    assert np.all(err <= tol * (1 + np.abs(ref_h))), (kinds, err.max())
    assert abs(float(s) - float(ref_s)) <= tol * (1 + abs(float(ref_s)))


@settings(max_examples=10, deadline=None)
@given(kinds=programs, policy=st.sampled_from(["bf16", "fp16"]))
def test_drawn_programs_place_each_class_in_its_dtype(kinds, policy):
    f = make_program(kinds)
    ws, x = draw_inputs(0, len(kinds))
    prog = fflow.make_jaxpr(fflow.amp(f, policy))(ws, x)
    low = LOW[policy]
    f32 = np.dtype(np.float32)
    seen = set()
    for e in prog.eqns:
        name = e.primitive.name
        in_dtypes = {v.aval.dtype for v in e.inputs if v.aval.dtype.kind in "fV"}
        if name == "dot_general":
            assert in_dtypes == {low}
        elif name in ("exp", "log", "reduce_sum", "integer_pow", "rsqrt"):
            assert in_dtypes <= {f32}, (name, in_dtypes)
            assert e.outputs[0].aval.dtype == f32
        elif name != "convert_element_type":
            # follow: all floating inputs share one dtype, the output has it too
            assert len(in_dtypes) <= 1, (name, in_dtypes)
            out = e.outputs[0].aval.dtype
            if in_dtypes and out.kind in "fV":
                assert {out} == in_dtypes, (name, in_dtypes, out)
        seen.add(name)
    assert "dot_general" in seen
    # and the un-rewritten program has no float casts at all
    plain = fflow.make_jaxpr(f)(ws, x)
    assert not [e for e in plain.eqns if e.primitive.name == "convert_element_type"]


GRAD_TOL = {"bf16": 2.0**-3, "fp16": 2.0**-6}  # relative norm, per block
# leaky_select's kink makes the derivative jump (1 vs 0.1) when rounding moves an input
# across 0: a legitimate difference of the rounded program, not a rewrite error
smooth_programs = programs.filter(lambda ks: "leaky_select" not in ks)


@settings(max_examples=12, deadline=None)
@given(
    kinds=smooth_programs, seed=st.integers(0, 2**31 - 1), policy=st.sampled_from(["bf16", "fp16"])
)
def test_drawn_program_gradients_match_fp32(kinds, seed, policy):
    """grad(amp(f)) against grad(f): the mixed-precision backward pass (low-precision
    matmul transposes, cast transposes) stays within a few roundoffs per block; the
    tolerance is looser than for values since a normalization of a small-norm row
    amplifies rounding of its input."""
    f = make_program(kinds)
    ws, x = draw_inputs(seed, len(kinds))
    coef = jnp.asarray(np.linspace(-1, 1, N * D).reshape(N, D).astype(np.float32))

    def loss(ws, x):
        return jnp.sum(f(ws, x)[0] * coef) / (N * D)

    ref = fflow.grad(loss)(ws, x)
    got = fflow.grad(fflow.amp(loss, policy))(ws, x)
    diff = sum(
        np.sum((np.asarray(g, np.float64) - np.asarray(r, np.float64)) ** 2)
        for g, r in zip(got, ref)
    )
    norm = sum(np.sum(np.asarray(r, np.float64) ** 2) for r in ref)
    assert all(g.dtype == np.float32 for g in got)
    assert np.sqrt(diff) <= GRAD_TOL[policy] * len(kinds) * np.sqrt(norm), kinds
