"""Signatures that are not in a primitive's own file.

Most primitives register their SBP rules next to their definition (see the
"SBP signatures" block of primitives/dot.py, shape.py, indexing.py, sort.py,
random_bits.py); elementwise, reduction and cumulative primitives use the family
rules of transforms/shard_rules.py. Here: control flow runs replicated, the
collectives are per-device operations that `shard` inserts but never plans, and
stacked-matrix linear algebra splits over its leading batch dims.
"""

from fflow.transforms.shard_rules import (
    Sig,
    broadcast_only_names,
    broadcast_only_traits,
    def_broadcast_only,
    def_sbp,
    sbp_rules,
)

from fflow import core
from fflow.sbp import Split

# stacked-matrix primitives (NumPy's convention): every input and output has the same
# leading batch dims, then two matrix dims (or fewer for outputs such as slogdet's)
STACKED_MATRIX = ("linalg_solve", "cholesky", "eigh", "svd", "qr", "slogdet")


def _stacked_matrix_sbp(in_avals, out_avals, **params):
    nb = in_avals[0].ndim - 2
    return [
        Sig((Split(k),) * len(in_avals), (Split(k),) * len(out_avals)) for k in range(max(nb, 0))
    ]


def register():
    broadcast_only_names["debug_callback"] = "a host callback: every device runs it on whole values"
    for name in ("custom_jvp_call", "custom_vjp_call", "checkpoint"):
        broadcast_only_names[name] = (
            "a call: shard plans its body (inlined, see shard_exec.inline_calls); only a call "
            "without a traced body runs whole on every device"
        )
    broadcast_only_names["custom_lin"] = "a custom_vjp's backward (a Python function) runs whole"
    broadcast_only_traits["named_axis"] = (
        "named-axis collectives (psum, ...) belong to vmap, which removes them before shard "
        "plans a program"
    )
    broadcast_only_traits["collective"] = "a per-device collective; shard inserts it, never plans"
    for name in STACKED_MATRIX:
        prim = core.primitives.get(name)
        if prim is not None and prim not in _registered():
            def_sbp(prim, _stacked_matrix_sbp)
    for name in ("cond", "while", "scan"):
        prim = core.primitives.get(name)
        if prim is not None:
            def_broadcast_only(
                prim,
                "control flow runs whole on every device (scans of up to 64 steps are "
                "unrolled before planning, transforms/shard_unroll.py)",
            )
    for prim in core.primitives.values():
        if "collective" in prim.traits:
            def_broadcast_only(prim, "a per-device collective; shard inserts it, never plans it")


def _registered():
    return sbp_rules


register()
