"""Runs the JAX-program corpus (tests/jax_corpus/*.py) under JAX or under fflow.

Each corpus file is an ordinary script written for JAX (`import jax`, `import
jax.numpy as jnp`, `import optax`...) that leaves its outputs in `result`. It runs in
this process with `import jax` resolving either to the installed JAX or, through
`fflow.compat.install()`, to fflow: no subprocess, the module is swapped.
Libraries built on JAX (optax) are re-imported after each swap so they bind to the
right `jax`.

    python tests/jax_corpus_util.py --regen [name...]  # record JAX's outputs (needs JAX)
    python tests/jax_corpus_util.py [name...]          # run under fflow, print the table
"""

import contextlib
import io
import json
import os
import sys
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from jax_compat_util import compare, encode  # noqa: E402

CORPUS = os.path.join(HERE, "jax_corpus")
GOLDEN_PATH = os.path.join(HERE, "golden", "jax_corpus.json")
_JAX_LIBRARIES = ("optax", "chex", "equinox", "flax")


def names():
    return sorted(f[:-3] for f in os.listdir(CORPUS) if f.endswith(".py"))


def _forget_libraries():
    for key in [k for k in sys.modules if k.split(".")[0] in _JAX_LIBRARIES]:
        del sys.modules[key]


@contextlib.contextmanager
def backend(which):
    """`import jax` means JAX (`which == "jax"`) or fflow (`"fflow"`) inside."""
    import fflow.compat

    _forget_libraries()
    if which == "fflow":
        fflow.compat.install()
    try:
        yield
    finally:
        if which == "fflow":
            import fflow

            fflow.config.update("jax_enable_x64", False)
            fflow.compat.uninstall()
        _forget_libraries()


def run(name, which):
    """The encoded `result` of corpus program `name` (or {"error": ...})."""
    path = os.path.join(CORPUS, name + ".py")
    with open(path) as f:
        code = compile(f.read(), path, "exec")
    namespace = {"__name__": "__corpus__", "__file__": path}
    with backend(which), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        exec(code, namespace)
        return encode(namespace["result"])


def check(name, golden):
    """None when fflow gives JAX's record for `name`, else why not (one line)."""
    try:
        got = run(name, "fflow")
    except Exception as e:  # noqa: BLE001 - the corpus report counts every failure
        frame = traceback.extract_tb(e.__traceback__)[-1]
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} ({os.path.basename(frame.filename)}:{frame.lineno})"
    try:
        compare(got, golden[name])
    except AssertionError as e:
        return "differs: " + " ".join(str(e).split())[:200]
    return None


def load_golden():
    with open(GOLDEN_PATH) as f:
        return json.load(f)


def _regen(only):
    golden = load_golden() if os.path.exists(GOLDEN_PATH) else {}
    for name in only or names():
        try:
            golden[name] = run(name, "jax")
        except Exception as e:  # noqa: BLE001
            print(f"JAX fails {name}: {type(e).__name__}: {e}")
    golden = {k: golden[k] for k in names() if k in golden}
    with open(GOLDEN_PATH + ".tmp", "w") as f:
        json.dump(golden, f, separators=(",", ":"))
        f.write("\n")
    os.replace(GOLDEN_PATH + ".tmp", GOLDEN_PATH)
    print(f"wrote {len(golden)} programs to {GOLDEN_PATH}")


def _report(only):
    golden = load_golden()
    failures = {n: check(n, golden) for n in only or names()}
    bad = {n: why for n, why in failures.items() if why}
    for n, why in sorted(bad.items()):
        print(f"FAIL {n}: {why}")
    ok = len(failures) - len(bad)
    print(f"{ok}/{len(failures)} programs give JAX's numbers ({100 * ok / len(failures):.0f}%)")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    _regen(args) if "--regen" in sys.argv else _report(args)
