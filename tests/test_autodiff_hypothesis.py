"""Property test: derivatives of randomly drawn compositions of primitives (through
fflow.numpy, with broadcasting, reductions and indexing) pass check_grads, eagerly
and under jit, to second order."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fflow
import fflow.numpy as jnp
from fflow.test_util import check_grads

pytestmark = pytest.mark.usefixtures("x64")  # float64 references on purpose

# smooth, everywhere-defined steps on (3, 4) arrays, with what makes them safe
UNARY = {
    "sin": jnp.sin,
    "tanh": jnp.tanh,
    "exp_small": lambda x: jnp.exp(0.3 * x),
    "square": lambda x: x * x,
    "logistic": lambda x: 1.0 / (1.0 + jnp.exp(-x)),
    "softplus": lambda x: jnp.log1p(jnp.exp(x)),
    "sqrt_pos": lambda x: jnp.sqrt(x * x + 1.0),
    "cumsum": lambda x: jnp.cumsum(x, axis=1) * 0.5,
    "transpose_back": lambda x: (x.T * 1.5).T,
    "row_mean": lambda x: x - jnp.mean(x, axis=1, keepdims=True),
    "flip": lambda x: x[::-1, ::-1],
    "roll_slices": lambda x: jnp.concatenate([x[:, 1:], x[:, :1]], axis=1),
}
BINARY = {
    "add": lambda x, y: x + y,
    "mul": lambda x, y: x * y,
    "div_safe": lambda x, y: x / (1.5 + jnp.sin(y)),
    "matmul_square": lambda x, y: (x @ y.T) @ x * 0.1,
    "where": lambda x, y: jnp.where(jnp.sin(y * 7.0) > 2.0, y, x * y),  # one branch used
    "broadcast_row": lambda x, y: x * y[:1, :],
}

ops = st.lists(
    st.one_of(
        st.tuples(st.just("u"), st.sampled_from(sorted(UNARY))),
        st.tuples(st.just("b"), st.sampled_from(sorted(BINARY))),
    ),
    min_size=1,
    max_size=4,
)


def _build(program):
    def f(x, y):
        h = x
        for kind, name in program:
            h = UNARY[name](h) if kind == "u" else BINARY[name](h, y)
        return jnp.sum(h * jnp.cos(y))

    return f


@settings(max_examples=30, deadline=None)
@given(program=ops, seed=st.integers(0, 2**16), use_jit=st.booleans())
def test_random_compositions(program, seed, use_jit):
    rng = np.random.RandomState(seed)
    x = rng.uniform(-1, 1, (3, 4))
    y = rng.uniform(-1, 1, (3, 4))
    f = _build(program)
    if use_jit:
        f = fflow.jit(f)
    # eps 1e-5: chains like square(square(square(x))) have large third derivatives, so the
    # default step's truncation error (~eps**2 * f3) alone exceeded rtol (seed 2103)
    check_grads(f, (x, y), order=2, modes=("fwd", "rev"), eps=1e-5)
