"""Tiled transposes (lowering/cuda_transpose.py): a fused elementwise kernel reading a
transposed operand goes through a 32 x 32 shared-memory tile, so both its reads
(along the operand's last axis) and its writes (along the output's last axis) are
coalesced. Checked on the generated source and through the host shim against NumPy."""

import re

import numpy as np
from cuda_harness import BF16, run_cases
from fflow.lowering import cuda_backend

import fflow
import fflow.numpy as jnp

rng = np.random.default_rng(8)


def _kernels(fn, *args):
    return cuda_backend.Plan(cuda_backend._optimize(fflow.make_jaxpr(fn)(*args))).kernels


def test_transposed_operands_go_through_a_shared_tile():
    x = rng.standard_normal((70, 45)).astype(np.float32)
    y = rng.standard_normal((45, 70)).astype(np.float32)
    z = rng.standard_normal((3, 40, 50)).astype(np.float32)
    cases = [
        ("x.T", lambda x: x.T, [x], (3, 2, 1)),
        ("tanh(x.T) + y", lambda x, y: jnp.tanh(x.T) + y, [x, y], (3, 2, 1)),
        ("z.transpose(2, 0, 1)", lambda z: z.transpose(2, 0, 1) * 2, [z], (2, 2, 3)),
        ("batched z.transpose(0, 2, 1)", lambda z: z.transpose(0, 2, 1) + 1, [z], (2, 2, 3)),
        ("bf16 x.T", lambda x: x.T * 2, [x.astype(BF16)], (3, 2, 1)),
    ]
    for label, fn, args, grid in cases:
        (k,) = _kernels(fn, *args)
        assert k.kind == "ewt" and k.grid == grid and k.block == 256, (label, k)
        body = k.source.split("void fflow_")[1]
        # the tile is filled along the operand's last axis (ob follows threadIdx.x) ...
        assert re.search(r"tile\[r\]\[tx\] = .*\(ob\)\]", body), label
        # ... and outputs are written along their last axis (oa follows threadIdx.x)
        assert re.search(r"out0\[[^\]]*\(oa\)\] = ", body), label
    run_cases([(label, fn, args) for label, fn, args, _ in cases])


def test_shifted_reads_of_a_transpose_stay_in_the_plain_kernel():
    x = rng.standard_normal((40, 30)).astype(np.float32)
    fn = lambda x: x.T + jnp.roll(x.T, 1, axis=1)  # noqa: E731  (two elements of x.T per output)
    (k,) = _kernels(fn, x)
    assert k.kind == "ew"
    run_cases([("shifted", fn, [x])])
