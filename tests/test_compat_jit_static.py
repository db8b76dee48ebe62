"""jit(static_argnames=) naming a keyword-only parameter (`def f(x, *, k)`), as JAX
allows: traced once per static value, the values equal the un-jitted function."""

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp


def test_keyword_only_static_argnames_retrace_per_value():
    traces = []

    def f(x, *, k, scale=1.0):
        traces.append(k)
        return x * k * scale if k % 2 else -x * k * scale

    jf = fflow.jit(f, static_argnames="k")
    x = jnp.array([1.0, -2.0, 3.0])
    for k in (2, 3, 2, 3):
        for s in (1.0, 2.5):  # a dynamic keyword: no retrace
            np.testing.assert_allclose(jf(x, k=k, scale=s), f(x, k=k, scale=s))
    assert sorted(set(traces)) == [2, 3] and traces.count(2) == 1 + 4  # 1 trace + 4 eager calls
    assert jf.lower(x, k=3, scale=1.0).compile()(x, scale=2.0).tolist() == [6.0, -12.0, 18.0]
    with pytest.raises(TypeError, match="hashable"):
        jf(x, k=[1])
    both = fflow.jit(lambda x, n, *, k: x * n + k, static_argnames=("n", "k"))
    assert both(jnp.ones(2), 3, k=1).tolist() == [4.0, 4.0]
