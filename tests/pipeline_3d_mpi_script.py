"""Run by tests/test_pipeline_mpi.py under `python -m fflow.launch -n 8` and on 8
simulated devices: one DP x TP x PP step (2 stages, each on a 2x2 data x tensor mesh);
prints the loss and gradients as JSON (rank 0 only)."""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_pipeline_3d import TP, params, stage0, stage1  # noqa: E402

import fflow  # noqa: E402
from fflow.sharding import B, S, runtime  # noqa: E402


def main():
    meshes = [fflow.placement("cpu", [[0, 1], [2, 3]]), fflow.placement("cpu", [[4, 5], [6, 7]])]
    acts = ((S(0), B), (S(0), B))
    f = fflow.pipeline(
        [stage0, stage1], meshes, 2, in_sbp=[(TP, acts), (dict(TP, head=(B, B)), acts)]
    )
    rng = np.random.default_rng(5)
    batch = (rng.normal(size=(8, 8)).astype(np.float32), rng.normal(size=(8, 1)).astype(np.float32))
    loss, grads = fflow.value_and_grad(f)(params(), batch)
    out = {"loss": float(loss), "runtime": runtime().describe()}
    for s in range(2):
        for k in sorted(grads[s]):
            out[f"grad{s}_{k}"] = np.asarray(grads[s][k]).tolist()
    if runtime().rank == 0:
        print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
