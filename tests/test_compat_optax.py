"""fflow.compat runs optax unchanged: optax's getting-started loop (adam, then
chain(clip, adamw(warmup-cosine))) under `python -m fflow.compat` gives JAX's numbers.

GOLDEN was recorded by running tests/compat_optax_script.py with JAX 0.10.2 and optax
0.2.8 (CPU). Runs in a subprocess (install() changes what `import jax` means).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(__file__)
GOLDEN = json.loads(
    '{"adam_losses": [5.689767360687256, 3.7908432483673096, 0.17374932765960693, 0.074112169444561], "adam_hidden_sum": 12.049975395202637, "adamw_losses": [5.689767360687256, 4.114412307739258, 0.00412147818133235, 0.002533097518607974], "adamw_output": [[-0.217643141746521, 0.019551170989871025], [-0.48818787932395935, 0.22705203294754028], [0.9249166250228882, 0.4116683304309845]], "dtype": "float32", "jax_is": "jax"}'
)


def _run(*args):
    out = subprocess.run(
        [sys.executable, "-m", "fflow.compat", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=HERE,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_optax_getting_started_and_adamw_give_jax_numbers():
    pytest.importorskip("optax")
    got = json.loads(_run(os.path.join(HERE, "compat_optax_script.py")).strip().splitlines()[-1])
    assert got["jax_is"] == "fflow"  # import jax resolved to fflow
    assert got["dtype"] == GOLDEN["dtype"]
    for key in ("adam_losses", "adam_hidden_sum", "adamw_losses", "adamw_output"):
        np.testing.assert_allclose(got[key], GOLDEN[key], rtol=2e-5, atol=1e-6, err_msg=key)


def test_install_resolves_jax_modules_and_uninstall_restores():
    code = (
        "import fflow.compat, sys\n"
        "fflow.compat.install()\n"
        "import jax, jax.numpy as jnp, jax.scipy.stats.norm, jaxlib\n"
        "from jax import lax, random, tree_util\n"
        "from jax.sharding import PartitionSpec\n"
        "import jax.extend.core, jax.typing, jax.flatten_util, jax.experimental\n"
        "import jax.interpreters.ad, jax.experimental.shard_map\n"
        "print(jax.__name__, jnp.__name__, lax.__name__, jaxlib.__version__)\n"
        "print(float(jax.grad(lambda x: jnp.sin(x) * x)(0.5)))\n"
        "try:\n"
        "    import jax.not_a_module\n"
        "except ImportError as e:\n"
        "    print('ImportError', 'jax.not_a_module' in str(e))\n"
        "fflow.compat.uninstall()\n"
        "print('jax' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "fflow fflow.numpy fflow.lax 0.10.2"
    assert abs(float(lines[1]) - (np.cos(0.5) * 0.5 + np.sin(0.5))) < 1e-6
    assert lines[2] == "ImportError True"
    assert lines[3] == "False"


def test_compat_main_runs_a_script_with_arguments(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text("import sys, jax\nprint(jax.__name__, sys.argv[1:])\n")
    assert _run(str(script), "a", "b").strip() == "fflow ['a', 'b']"
