"""Records JAX's outputs of tests/jax_compat_programs.py into tests/golden/jax_compat.json.

Run with JAX installed: `python tests/jax_compat_regen.py [name ...]`.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from jax_compat_programs import PROGRAMS  # noqa: E402
from jax_compat_util import GOLDEN_PATH, encode, jax_modules  # noqa: E402


def main(names):
    mods = jax_modules()
    golden = {}
    if os.path.exists(GOLDEN_PATH):
        with open(GOLDEN_PATH) as f:
            golden = json.load(f)
    for name in names or PROGRAMS:
        try:
            golden[name] = encode(PROGRAMS[name](*mods))
        except Exception as e:  # noqa: BLE001 - report every program JAX rejects
            print(f"{name}: {type(e).__name__}: {e}")
    golden = {k: golden[k] for k in PROGRAMS if k in golden}
    with open(GOLDEN_PATH, "w") as f:
        json.dump(golden, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {len(golden)} programs to {GOLDEN_PATH}")


if __name__ == "__main__":
    main(sys.argv[1:])
