"""Helpers for the JAX-compatibility programs (tests/test_jax_compat_*.py).

Each program is a function `prog(jax, jnp, lax)` written against JAX's API. It runs
under fflow with `fflow`, `fflow.numpy`, `fflow.lax` in place of the JAX modules, and
its outputs are compared with golden values recorded from JAX 0.10.2 (CPU) in
tests/golden/jax_compat.json (regenerate with `python tests/jax_compat_regen.py`).
"""

import json
import math
import os

import numpy as np

GOLDEN_PATH = os.path.join(os.path.dirname(__file__), "golden", "jax_compat.json")


def flatten_outputs(out):
    """Leaves of `out` in a fixed order (dict keys sorted), framework independent."""
    if isinstance(out, dict):
        return [leaf for k in sorted(out, key=str) for leaf in flatten_outputs(out[k])]
    if isinstance(out, (list, tuple)):
        return [leaf for x in out for leaf in flatten_outputs(x)]
    if hasattr(out, "__dataclass_fields__"):
        return [leaf for k in out.__dataclass_fields__ for leaf in flatten_outputs(getattr(out, k))]
    return [out]


def _plain(v):
    if isinstance(v, float) and not math.isfinite(v):
        return repr(v)
    return v


def encode_leaf(x):
    """A JSON-able record of one output leaf: arrays keep dtype, shape and values."""
    if isinstance(x, (bool, int, float, complex, str, type(None))) and not hasattr(x, "dtype"):
        if isinstance(x, complex):
            return {"py": "complex", "value": [x.real, x.imag]}
        return {"py": type(x).__name__, "value": _plain(x)}
    a = np.asarray(x)
    rec = {"dtype": str(a.dtype), "shape": list(a.shape)}
    if a.dtype.kind == "c":
        rec["value"] = [np.real(a).tolist(), np.imag(a).tolist()]
    elif a.dtype.kind == "f" or a.dtype.kind == "V" or str(a.dtype) == "bfloat16":
        rec["value"] = np.vectorize(_plain, otypes=[object])(a.astype(np.float64)).tolist()
    else:
        rec["value"] = a.tolist()
    if hasattr(x, "weak_type"):
        rec["weak"] = bool(x.weak_type)
    return rec


def encode(out):
    return [encode_leaf(x) for x in flatten_outputs(out)]


def _num(v):
    return float(v) if isinstance(v, str) else v


def compare(got, want, rtol=2e-5, atol=2e-6, check_weak=True):
    """Raises AssertionError naming the first leaf that differs."""
    assert len(got) == len(want), f"{len(got)} outputs, JAX gives {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        where = f"output {i}"
        if "py" in w:
            assert g.get("py") == w["py"], f"{where}: got {g}, JAX gives Python {w['py']} {w}"
            if w["py"] == "float":
                np.testing.assert_allclose(_num(g["value"]), _num(w["value"]), rtol, atol)
            else:
                assert g["value"] == w["value"], f"{where}: {g['value']!r} != {w['value']!r}"
            continue
        assert "dtype" in g, f"{where}: got Python {g}, JAX gives an array {w}"
        assert g["dtype"] == w["dtype"], f"{where}: dtype {g['dtype']}, JAX gives {w['dtype']}"
        assert g["shape"] == w["shape"], f"{where}: shape {g['shape']}, JAX gives {w['shape']}"
        if check_weak and "weak" in w and "weak" in g:
            assert g["weak"] == w["weak"], f"{where}: weak_type {g['weak']}, JAX {w['weak']}"
        if w["dtype"].startswith(("float", "complex", "bfloat")):
            gv = np.vectorize(_num, otypes=[float])(np.asarray(g["value"], dtype=object))
            wv = np.vectorize(_num, otypes=[float])(np.asarray(w["value"], dtype=object))
            if w["dtype"] in ("float16", "bfloat16"):
                rtol, atol = max(rtol, 1e-2), max(atol, 1e-2)
            np.testing.assert_allclose(gv, wv, rtol=rtol, atol=atol, err_msg=where)
        else:
            assert g["value"] == w["value"], f"{where}: {g['value']} != {w['value']}"


def load_golden():
    with open(GOLDEN_PATH) as f:
        return json.load(f)


def fflow_modules():
    import fflow
    import fflow.numpy as jnp
    from fflow import lax

    return fflow, jnp, lax


def jax_modules():
    import jax
    import jax.numpy as jnp
    from jax import lax

    return jax, jnp, lax
