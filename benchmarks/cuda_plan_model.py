"""Static model of the CUDA backend's launch plans at full size (no GPU needed):
kernels, GEMMs and modelled HBM traffic per program, to compare two checkouts.

    python benchmarks/cuda_plan_model.py              # this checkout
    python benchmarks/cuda_plan_model.py OTHER_ROOT   # another checkout (git archive)

`FFLOW_CUBLASLT=0` plans without cuBLASLt epilogues (bias / relu / gelu as the GEMM's
next kernel), for a before/after on one checkout.

"Modelled HBM" counts every kernel input once per pass over it (in row kernels: one
per load site in a loop over the row; the register-cached row is one) plus its
outputs; GEMMs are left out. It measures what the planner generates, not speed.
"""

import importlib.util
import os
import re
import sys

import numpy as np

root = os.path.abspath(
    sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(__file__))
)
spec = importlib.util.spec_from_file_location("gpu_check", f"{root}/benchmarks/gpu_check.py")
gc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gc)  # maps fflow's folders of `root`

from fflow.lowering import cuda_backend  # noqa: E402

import fflow  # noqa: E402
import fflow.numpy as jnp  # noqa: E402
from fflow import nn  # noqa: E402


def model(fn, *args):
    prog = cuda_backend._optimize(fflow.make_jaxpr(fn)(*args))
    plan = cuda_backend.Plan(prog, epilogues=os.environ.get("FFLOW_CUBLASLT", "1") != "0")
    traffic = 0
    for k in plan.kernels:
        body = k.source.split("void fflow_")[1]
        ins = [x for x in k.args if x[0] == "in"]
        for kind, v in k.args:
            nb = int(np.prod(v.aval.shape)) * np.dtype(v.aval.dtype).itemsize
            passes = 1
            if kind == "in" and k.kind == "row" and nb > 16384:
                name = f"in{ins.index((kind, v))}"
                passes = max(1, len(re.findall(rf"\b{name}\[|\({name} \+ row", body)))
            traffic += nb * passes
    gemms = sum(type(s).__name__ in ("BlasStep", "LtStep") for s in plan.steps)
    lt = sum(type(s).__name__ == "LtStep" for s in plan.steps)  # GEMMs with an epilogue
    return len(plan.kernels), gemms, lt, traffic / 1e6


def hand_attention(q, k, v):
    """Causal attention on [b, heads, seq, d] written out (rewritten to the fused primitive
    unless FFLOW_ATTENTION_REWRITE=0: compare the two)."""
    t = q.shape[2]
    s = q @ jnp.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -1e9)
    return nn.softmax(s, axis=-1) @ v


def hand_block_loss(p, x, heads):
    fused, gc.attention = gc.attention, hand_attention
    try:
        return gc.block_loss(p, x, heads)
    finally:
        gc.attention = fused


def stencils(x):
    for _ in range(10):
        x = (x[:-2] + x[1:-1] + x[2:]) / 3
    return x


def main():
    rng = np.random.default_rng(0)
    x = gc.f32(rng, 8192, 4096)
    b8 = gc.f32(rng, 8, 512, 1024)
    d = np.ones(1024, np.float32)
    w = gc.f32(rng, 1024, 1024)

    def ln_step(x, g, b, w):
        return jnp.sum(jnp.tanh(nn.standardize(x, axis=-1) * g + b) @ w)

    params = gc.mlp_init(rng, [784, 512, 512, 10])
    xm, ym = gc.f32(rng, 128, 784), rng.integers(0, 10, 128).astype(np.int32)
    bp = gc.block_init(rng, 1024, 4096)
    bf16 = np.dtype(jnp.bfloat16)
    cases = {
        "softmax [8192,4096] f32": (lambda x: nn.softmax(x, axis=-1), [x]),
        "softmax [64,50257] f32": (lambda x: nn.softmax(x, axis=-1), [gc.f32(rng, 64, 50257)]),
        "layernorm fwd [8192,4096]": (lambda x, g: nn.standardize(x, axis=-1) * g + g,
                                      [x, np.ones(4096, np.float32)]),
        "layernorm train grads b8 s512 d1024": (fflow.grad(ln_step, argnums=(0, 1, 2, 3)),
                                                [b8, d, d, w]),
        "x @ w.T [4096,1024]x[1024,1024]": (lambda x, w: x @ w.T, [b8.reshape(4096, 1024), w]),
        "GEMM+bias+gelu bf16 [4096,1024]x[1024,4096]": (
            lambda x, w, b: nn.gelu(x @ w + b),
            [b8.reshape(4096, 1024).astype(bf16), gc.f32(rng, 1024, 4096).astype(bf16),
             gc.f32(rng, 4096).astype(bf16)],
        ),
        "10 stencils [1M]": (stencils, [gc.f32(rng, 1 << 20)]),
        "MLP step 784-512-512-10 b128": (fflow.value_and_grad(gc.mlp_loss), [params, xm, ym]),
        "same, amp bf16": (fflow.value_and_grad(fflow.amp(gc.mlp_loss, "bf16")), [params, xm, ym]),
        "transformer block step bf16 amp b8 s512 d1024": (
            fflow.value_and_grad(fflow.amp(lambda p, x: gc.block_loss(p, x, 16), "bf16")),
            [bp, b8],
        ),
        "same, attention written by hand": (
            fflow.value_and_grad(fflow.amp(lambda p, x: hand_block_loss(p, x, 16), "bf16")),
            [bp, b8],
        ),
    }  # fmt: skip
    for name, (fn, args) in cases.items():
        k, g, lt, mb = model(fn, *args)
        print(f"{name:48s} kernels {k:3d}  gemms {g:2d} ({lt:2d} cuBLASLt epilogues)  "
              f"modelled HBM {mb:9.1f} MB")  # fmt: skip


if __name__ == "__main__":
    main()
