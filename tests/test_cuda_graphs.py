"""CUDA graphs (lowering/cuda_graphs.py) through the stand-in CuPy (tests/fake_cupy.py,
whose streams record operations while capturing and whose graphs replay them): a
jitted program's launches are captured on its second call and every later call is
one graph launch plus argument copies, with results equal to the untransformed
function's on the host."""

import os
import re
import subprocess
import sys

import pytest
from cuda_harness import nvrtc_required

SCRIPT = r"""
import sys
sys.path.insert(0, {here!r})
import fake_cupy
fake_cupy.install()
import numpy as np
import fflow, fflow.numpy as jnp
from fflow import nn

gpu = fflow.devices("gpu")[0]
rng = np.random.default_rng(0)
w1 = rng.standard_normal((12, 16)).astype(np.float32) / 4
b1 = np.zeros(16, np.float32)
w2 = rng.standard_normal((16, 5)).astype(np.float32) / 4
b2 = rng.standard_normal(5).astype(np.float32)


def loss(params, x, y):
    w1, b1, w2, b2 = params
    h = jnp.tanh(x @ w1 + b1)
    logp = nn.log_softmax(h @ w2 + b2)
    return -jnp.mean(jnp.sum(logp * y, axis=-1))


step = fflow.value_and_grad(loss)
f = fflow.jit(step)
params = [fflow.device_put(p, gpu) for p in (w1, b1, w2, b2)]
outs, kinds = [], []
for i in range(4):
    x = rng.standard_normal((9, 12)).astype(np.float32)
    y = np.eye(5, dtype=np.float32)[rng.integers(0, 5, 9)]
    before = len(fake_cupy.USED)
    out = f(params, fflow.device_put(x, gpu), fflow.device_put(y, gpu))
    kinds.append([w for w, _ in fake_cupy.USED[before:]])
    want = step([w1, b1, w2, b2], x, y)
    if i == 2:  # new weights (other buffers) are copied in
        w2 = w2 * 0.5
        params[2] = fflow.device_put(w2, gpu)
    outs.append((out, want))
for out, want in outs:  # every call's results stay valid after later replays
    for o, r in zip(fflow.tree_util.tree_leaves(out), fflow.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(o), np.asarray(r), rtol=2e-5, atol=1e-6)
first, capture, replay, replay2 = kinds
assert "graph_launch" not in first and first.count("launch") > 3, first
if {graphs}:
    assert capture.count("graph_launch") == 1, capture
    assert capture.count("memcpy") == 6, capture  # every argument bound once
    for k in (replay, replay2):  # one graph launch; x, y (and new weights) copied in
        assert k.count("graph_launch") == 1 and "launch" not in k and "matmul" not in k, k
        assert k.count("memcpy") == (2 if k is replay else 3), k
else:  # turned off: every call launches its kernels
    assert all("graph_launch" not in k and k.count("launch") > 3 for k in kinds)
print("graph ok", first.count("launch"), len(replay))

# a plan with host work between launches is not captured; nor with graphs turned off
g = fflow.jit(lambda x: jnp.fft.fft(x).real * 2)  # the fft is a host step
x = fflow.device_put(rng.standard_normal(64).astype(np.float32), gpu)
for i in range(3):
    before = len(fake_cupy.USED)
    want = np.fft.fft(np.asarray(x)).real * 2
    np.testing.assert_allclose(np.asarray(g(x)), want, rtol=1e-5, atol=1e-5)
    assert "graph_launch" not in [w for w, _ in fake_cupy.USED[before:]]
print("host ok")

# a capture the driver refuses: that program runs step by step, with the same results
stream_begin = fake_cupy.Stream.begin_capture


def refuse(self, mode=None):
    raise RuntimeError("operation not permitted when stream is capturing")

fake_cupy.Stream.begin_capture = refuse
h = fflow.jit(lambda x: jnp.cumsum(jnp.tanh(x)))  # a chunked scan: 3 launches
x = fflow.device_put(rng.standard_normal(9000).astype(np.float32), gpu)
for i in range(3):
    before = len(fake_cupy.USED)
    want = np.cumsum(np.tanh(np.asarray(x, np.float64)))
    np.testing.assert_allclose(np.asarray(h(x)), want, rtol=1e-4, atol=1e-3)
    used = [w for w, _ in fake_cupy.USED[before:]]
    assert "graph_launch" not in used and used.count("launch") == 3, used

# a program of one launch is not worth a graph (the copies would cost more)
fake_cupy.Stream.begin_capture = stream_begin
one = fflow.jit(lambda x: jnp.tanh(x) * 3)
for i in range(3):
    before = len(fake_cupy.USED)
    np.testing.assert_allclose(np.asarray(one(x)), np.tanh(np.asarray(x)) * 3, rtol=1e-6)
    assert "graph_launch" not in [w for w, _ in fake_cupy.USED[before:]]
print("refused ok")
"""


@pytest.mark.skipif(not nvrtc_required(), reason="NVRTC unavailable")
@pytest.mark.parametrize("graphs", ["1", "0"])
def test_jit_calls_replay_one_captured_graph(graphs):
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, FFLOW_CUDA_GRAPHS=graphs)
    env.pop("FFLOW_JIT_BACKEND", None)
    script = SCRIPT.format(here=here, graphs=graphs == "1")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "graph ok" in proc.stdout and "host ok" in proc.stdout and "refused ok" in proc.stdout


def test_plan_text_says_which_plans_replay_as_a_graph():
    import numpy as np
    from fflow.lowering import cuda_backend

    import fflow
    import fflow.numpy as jnp

    x = np.ones((4, 8), np.float32)
    prog = fflow.make_jaxpr(lambda x: jnp.tanh(jnp.tanh(x @ x.T) @ x).sum(0))(x)
    text = cuda_backend.plan_text(cuda_backend.Plan(cuda_backend._optimize(prog)))
    assert re.search(r"# CUDA graph on a GPU: these \d+ launches are captured", text), text
    prog = fflow.make_jaxpr(lambda x: jnp.tanh(x) * 2)(x)  # 1 launch: not worth a graph
    text = cuda_backend.plan_text(cuda_backend.Plan(cuda_backend._optimize(prog)))
    assert "CUDA graph" not in text
    prog = fflow.make_jaxpr(lambda x: jnp.fft.fft(x).real * 2)(np.ones(64, np.float32))
    text = cuda_backend.plan_text(cuda_backend.Plan(cuda_backend._optimize(prog)))
    assert "host fft" in text and "CUDA graph" not in text
