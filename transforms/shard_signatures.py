"""Signatures that are not in a primitive's own file.

Most primitives register their SBP rules next to their definition (see the
"SBP signatures" block of primitives/dot.py, shape.py, indexing.py, sort.py,
random_bits.py); elementwise, reduction and cumulative primitives use the family
rules of transforms/shard_rules.py. Here: control flow runs replicated, and the
collectives are per-device operations that `shard` inserts but never plans.
"""

from fflow.transforms.shard_rules import def_broadcast_only

from fflow import core


def register():
    for name in ("cond", "while", "scan"):
        prim = core.primitives.get(name)
        if prim is not None:
            def_broadcast_only(
                prim, "control flow runs replicated (all-broadcast) inside a sharded program"
            )
    for prim in core.primitives.values():
        if "collective" in prim.traits:
            def_broadcast_only(prim, "a per-device collective; shard inserts it, never plans it")


register()
