"""Every examples/*.py runs (at a small size, via --tiny), and the main one learns.

Files starting with "_" (examples/_common.py) are shared helpers, not examples.
"""

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.py") if not p.name.startswith("_"))


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs_tiny(name):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), "--tiny"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert proc.stdout.strip(), "an example should print its progress"


def test_mlp_digits_reaches_95_percent():
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import mlp_digits
    finally:
        sys.path.pop(0)
    accuracy = mlp_digits.main(steps=600, batch_size=128, hidden=128, log_every=600)
    assert accuracy >= 0.95
