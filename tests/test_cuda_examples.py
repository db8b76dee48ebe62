"""Every example runs with `jit` on the CUDA backend (kernels executed on the CPU by the
host shim, `FFLOW_JIT_BACKEND=cuda_shim`) at its `--tiny` size, and prints the same
losses and accuracies as with the NumPy backend."""

import glob
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = sorted(glob.glob(os.path.join(ROOT, "examples", "[!_]*.py")))  # _common.py: helpers
# timings differ between runs; everything else printed must match
_TIME = re.compile(r"\(?[-+]?\d+(\.\d+)?(e[-+]?\d+)?\s*(ms|s)(/step)?\)?|\bin [\d.]+ s\b")
# run-to-run float noise of the last printed digit (e.g. max |diff| of two methods)
_DIFF = re.compile(  # rounding gaps, and the load and CPU-clock ratios printed next to timings
    r"max \|diff\| = \S+|difference vs single device: \S+|load average [\d.]+"
    r"|CPU-clock bubble of the busiest device [\d.]+|stage imbalance [\d.]+"
)


# runs the example twice in one process (imports paid once): NumPy backend, then CUDA
RUNNER = """
import contextlib, io, os, runpy, sys
import fflow
path = sys.argv[1]
sys.path.insert(0, os.path.dirname(path))  # as `python examples/x.py` does (for _common)
for backend in ("numpy", "cuda_shim"):
    fflow.config.update("jit_backend", backend)
    sys.argv = [path, "--tiny"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(path, run_name="__main__")
    print("=== " + backend)
    print(out.getvalue(), end="")
from fflow.lowering import cuda_backend
print("=== compiled", cuda_backend.compile_count)
"""


_TMP = re.compile(r"/tmp/\S+")  # temporary folders an example prints (one per run)


def _clean(lines):
    return [_TMP.sub("", _DIFF.sub("", _TIME.sub("", line))).strip() for line in lines]


@pytest.mark.parametrize("path", EXAMPLES, ids=[os.path.basename(p) for p in EXAMPLES])
def test_example_on_the_cuda_backend(path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, path], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"{os.path.basename(path)}:\n{proc.stderr[-3000:]}"
    text = proc.stdout
    ref, cuda = text.split("=== numpy\n", 1)[1].split("=== cuda_shim\n", 1)
    cuda, compiled = cuda.split("=== compiled ", 1)
    assert _clean(cuda.splitlines()) == _clean(ref.splitlines())
    # every example jits something (sharded ones evaluate their local programs eagerly)
    sharded_only = ("tensor_parallel", "pipeline_parallel")
    assert int(compiled) > 0 or os.path.basename(path).startswith(sharded_only)
