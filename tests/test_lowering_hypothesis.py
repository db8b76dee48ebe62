"""Hypothesis-drawn programs: the generated kernel equals eager evaluation bit for bit,
also with donated inputs (in-place paths) and large (chunked / native) shapes."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import fflow
import fflow.numpy as jnp

UNARY = [jnp.sin, jnp.tanh, jnp.exp, jnp.abs, jnp.negative, lambda a: a * a, lambda a: a**3]
BINARY = [jnp.add, jnp.subtract, jnp.multiply, jnp.maximum, jnp.minimum]

ieee_op = st.one_of(
    st.tuples(st.just("b"), st.integers(0, len(BINARY) - 1), st.integers(0, 10)),
    st.tuples(st.just("s"), st.floats(-3, 3, allow_nan=False, width=32)),
    st.tuples(st.just("where"), st.integers(0, 10)),
)
op = st.one_of(
    st.tuples(st.just("u"), st.integers(0, len(UNARY) - 1)),
    st.tuples(st.just("b"), st.integers(0, len(BINARY) - 1), st.integers(0, 10)),
    st.tuples(st.just("s"), st.floats(-3, 3, allow_nan=False, width=32)),
    st.tuples(st.just("sum"), st.integers(0, 1)),
    st.tuples(st.just("set"), st.integers(0, 2)),
    st.tuples(st.just("where"), st.integers(0, 10)),
)


def build(ops):
    def f(x, y):
        vals = [x, y]
        for o in ops:
            a = vals[-1]
            if o[0] == "u":
                vals.append(UNARY[o[1]](jnp.clip(a, -3, 3)))
            elif o[0] == "b":
                vals.append(BINARY[o[1]](a, vals[o[2] % len(vals)]))
            elif o[0] == "s":
                vals.append(a * np.float32(o[1]) + 1.0)
            elif o[0] == "sum":
                vals.append(a + jnp.sum(a, axis=o[1], keepdims=True))
            elif o[0] == "set":
                vals.append(a.at[o[1]].set(vals[0][0]))
            else:
                b = vals[o[1] % len(vals)]
                vals.append(jnp.where(a > b, a, b * 0.5))
        return vals[-1], vals[len(vals) // 2]

    return f


def check(f, shape, donate):
    rng = np.random.default_rng(len(shape))
    xn = rng.normal(size=shape).astype(np.float32)
    yn = rng.normal(size=shape).astype(np.float32)
    with np.errstate(all="ignore"):
        expected = f(jnp.asarray(xn), jnp.asarray(yn))
        jf = fflow.jit(f, donate_argnums=(0,) if donate else ())
        got = jf(jnp.asarray(xn.copy()), jnp.asarray(yn))
    for e, g in zip(expected, got):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(e))


@settings(max_examples=40, deadline=None)
@given(st.lists(op, min_size=1, max_size=10), st.booleans())
def test_random_programs_small(ops, donate):
    check(build(ops), (3, 4), donate)


@settings(max_examples=8, deadline=None)
@given(st.lists(ieee_op, min_size=3, max_size=8))
def test_random_programs_large_chunked(ops):
    # row-block chunking (threshold lowered to reach it); IEEE ops only, so native
    # loops match bit for bit too
    from fflow.lowering import numpy_backend

    saved = numpy_backend.CHUNK_MIN_SIZE
    numpy_backend.CHUNK_MIN_SIZE = 1 << 16
    try:
        check(build(ops), (600, 512), True)
    finally:
        numpy_backend.CHUNK_MIN_SIZE = saved
