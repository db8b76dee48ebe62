"""Random programs through the CUDA backend: hypothesis builds chains of elementwise,
index-arithmetic (transpose, reshape, slice, pad, concatenate, rev, broadcast,
gather, dynamic_slice), reduction and scan ops, so fused kernels compose many index
maps; the shim's results must equal eager NumPy evaluation."""

import numpy as np
from cuda_harness import collect, run_cases
from hypothesis import strategies as st

import fflow.numpy as jnp
from fflow import lax

UNARY = [jnp.sin, jnp.tanh, jnp.exp, lambda x: jnp.abs(x) + 1.0, lambda x: x * x, jnp.negative]
BINARY = [jnp.add, jnp.subtract, jnp.multiply, jnp.maximum, lambda a, b: a / (jnp.abs(b) + 1.0)]


def _step(data, x):
    """One random op on `x` (a traced fflow array); returns the new value."""
    nd = x.ndim
    op = data.draw(
        st.sampled_from(
            [
                "unary",
                "binary_bcast",
                "transpose",
                "reshape",
                "slice",
                "pad",
                "concat",
                "rev",
                "reduce",
                "cumsum",
                "dyn_slice",
                "gather",
                "softmax",
            ]  # fmt: skip
        )
    )
    if op == "unary":
        return data.draw(st.sampled_from(UNARY))(x)
    if op == "binary_bcast":
        # broadcast against a reduced-then-expanded version of itself
        if nd == 0:
            return data.draw(st.sampled_from(BINARY))(x, x)
        ax = data.draw(st.integers(0, nd - 1))
        return data.draw(st.sampled_from(BINARY))(x, jnp.mean(x, axis=ax, keepdims=True))
    if nd == 0:
        return jnp.cos(x)
    if op == "transpose":
        return jnp.transpose(x, data.draw(st.permutations(range(nd))))
    if op == "reshape":
        return x.reshape(-1) if nd > 1 else x.reshape(1, -1)
    if op == "slice":
        ax = data.draw(st.integers(0, nd - 1))
        n = x.shape[ax]
        start = data.draw(st.integers(0, n - 1))
        step = data.draw(st.integers(1, 2))
        return lax.slice_in_dim(x, start, n, step, ax)
    if op == "pad":
        cfg = [(data.draw(st.integers(0, 2)), data.draw(st.integers(0, 1)), data.draw(st.integers(0, 1)))
               for _ in range(nd)]  # fmt: skip
        return lax.pad(x, np.float32(-0.5), cfg)
    if op == "concat":
        ax = data.draw(st.integers(0, nd - 1))
        return jnp.concatenate([x, jnp.sin(x)], axis=ax)
    if op == "rev":
        return lax.rev(x, (data.draw(st.integers(0, nd - 1)),))
    if op == "reduce":
        ax = data.draw(st.integers(0, nd - 1))
        fn = data.draw(st.sampled_from([jnp.sum, jnp.max, jnp.min]))
        return fn(x, axis=ax)
    if op == "cumsum":
        return jnp.cumsum(x, axis=data.draw(st.integers(0, nd - 1)))
    if op == "dyn_slice":
        sizes = [max(1, d // 2) for d in x.shape]
        return lax.dynamic_slice(x, [jnp.int32(1)] * nd, sizes)
    if op == "gather":
        idx = jnp.asarray(np.array([x.shape[0] - 1, 0, x.shape[0] // 2], np.int32))
        return jnp.take(x, idx, axis=0)
    from fflow import nn

    return nn.softmax(x, axis=-1)


def test_random_fused_programs():
    def make(data):
        shape = data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple))
        nsteps = data.draw(st.integers(2, 6))
        seed = data.draw(st.integers(0, 10**6))
        choices = []

        def fn(x):
            # replay the same draws at trace time and at reference time
            it = iter(choices)

            class Replay:
                def draw(self, strategy):
                    return next(it)

            outs = []
            y = x
            for _ in range(nsteps):
                y = _step(Replay(), y)
                outs.append(y)
            return outs[-1], outs[len(outs) // 2]

        class Recorder:
            def draw(self, strategy):
                value = data.draw(strategy)
                choices.append(value)
                return value

        # record the random choices once on a concrete value
        y = jnp.asarray(np.zeros(shape, np.float32))
        for _ in range(nsteps):
            y = _step(Recorder(), y)
        x = np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)
        return f"random program {shape} {len(choices)} choices", fn, [x]

    with np.errstate(all="ignore"):
        run_cases(collect(make, 40))
