"""Every docstring example of fflow's modules and every Python block of the docs runs.

Docstring examples are doctests: their printed results are checked. The code blocks
of a Markdown file run in order in one namespace (as a reader would type them); a
file about the GPU runs only where CuPy finds one.
"""

import doctest
import glob
import importlib
import os
import re
import warnings

import pytest
from test_layering import HEAVY, MODULES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Modules whose examples need hardware or processes this test cannot assume (they are
# run by their own tests: tests/test_cuda_*.py, tests/test_shard_mpi.py).
NOT_DOCTESTED = {
    "fflow.launch": "starts MPI processes",
}


def _heavy(name):
    import fnmatch

    return any(fnmatch.fnmatchcase(name, p) for p in HEAVY)


DOCTESTED = sorted(m for m in MODULES if m not in NOT_DOCTESTED and not _heavy(m))


def _examples(module):
    finder = doctest.DocTestFinder(exclude_empty=True)
    return [t for t in finder.find(module, module.__name__) if t.examples]


@pytest.mark.parametrize("name", DOCTESTED)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # examples of overflow and NaN
        for test in _examples(module):
            runner.run(test, out=report.append)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, "".join(report)


def test_public_modules_have_examples():
    # the public API's modules keep at least one runnable example each
    for name in ("fflow", "fflow.numpy", "fflow.lax", "fflow.random", "fflow.nn", "fflow.sbp"):
        assert _examples(importlib.import_module(name)), name


DOCS = ["README.md", "ARCHITECTURE.md"] + sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))
)


def _blocks(path):
    with open(os.path.join(ROOT, path)) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


@pytest.mark.parametrize("path", DOCS)
def test_doc_code_blocks_run(path, capsys):
    blocks = _blocks(path)
    if not blocks:
        pytest.skip(f"{path} has no Python blocks")
    if os.path.basename(path) == "gpu.md":
        cupy = pytest.importorskip("cupy")
        try:
            cupy.cuda.runtime.getDeviceCount()
        except Exception:  # noqa: BLE001 - no driver or no device
            pytest.skip("no GPU")
    namespace = {"__name__": "__docs__"}
    for i, code in enumerate(blocks):
        exec(compile(code, f"{path} block {i + 1}", "exec"), namespace)


@pytest.mark.parametrize("path", DOCS)
def test_docs_cite_files_that_exist(path):
    # `lowering/passes.py`-style paths in the docs name real files of this checkout
    with open(os.path.join(ROOT, path)) as f:
        text = f.read()
    cited = set(
        re.findall(
            r"`((?:fflow|lowering|primitives|transforms|tests|benchmarks|examples|docs)/[\w/]+\.(?:py|md|h))`",
            text,
        )
    )
    missing = sorted(p for p in cited if not os.path.exists(os.path.join(ROOT, p)))
    assert not missing, f"{path} cites files that do not exist: {missing}"
