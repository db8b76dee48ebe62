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
EXAMPLES = sorted(glob.glob(os.path.join(ROOT, "examples", "*.py")))
# timings differ between runs; everything else printed must match
_TIME = re.compile(r"\(?[-+]?\d+(\.\d+)?(e[-+]?\d+)?\s*(ms|s)(/step)?\)?|\bin [\d.]+ s\b")
# run-to-run float noise of the last printed digit (e.g. max |diff| of two methods)
_DIFF = re.compile(r"max \|diff\| = \S+")


def _run(path, backend):
    env = dict(os.environ, FFLOW_JIT_BACKEND=backend, PYTHONPATH=ROOT)
    proc = subprocess.run(
        [sys.executable, path, "--tiny"], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"{os.path.basename(path)} ({backend}):\n{proc.stderr[-3000:]}"
    return [_DIFF.sub("", _TIME.sub("", line)).strip() for line in proc.stdout.splitlines()]


@pytest.mark.parametrize("path", EXAMPLES, ids=[os.path.basename(p) for p in EXAMPLES])
def test_example_on_the_cuda_backend(path):
    cuda = _run(path, "cuda_shim")
    ref = _run(path, "numpy")
    assert cuda == ref
