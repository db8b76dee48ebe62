"""Collectives in XLA's compiled HLO text, counted and priced as fflow's plans are
(benchmarks/bench_planner.py's JAX column; tests/test_bench_jax_hlo.py)."""

import re

import numpy as np

HLO_COLLECTIVE = re.compile(
    r"=\s*(\(?[a-z0-9]+\[[^\]]*\][^=]*?)\s+(all-reduce|all-gather|reduce-scatter|all-to-all)"
    r"(?:-start)?\("
)
SHAPE = re.compile(r"([a-z]+[0-9]*)\[([0-9,]*)\]")
ITEM = {"f32": 4, "f16": 2, "bf16": 2, "s32": 4, "f64": 8, "pred": 1}


def hlo_collectives(text, n):
    """({op: [HLO ops, values]}, bytes by our cost convention) of the collectives in
    compiled HLO `text` on `n` devices. XLA combines several values into one op (a
    tuple all-reduce: JAX's three input gradients of q/k/v, the data-parallel
    gradients), so values are counted too: they are what fflow's plans count."""
    # long tuples carry /*index=5*/ markers, whose '=' hid XLA's combined gradient
    # all-reduce from HLO_COLLECTIVE (2x2, 4 layers: 25.17 MB counted without it)
    text = re.sub(r"/\*index=\d+\*/", "", text)
    counts, total = {}, 0
    for m in HLO_COLLECTIVE.finditer(text):
        shapes, op = m.group(1), m.group(2)
        sizes = []
        for dt, dims in SHAPE.findall(shapes):
            size = int(np.prod([int(s) for s in dims.split(",") if s])) if dims else 1
            sizes.append(size * ITEM.get(dt, 4))
        if m.group(0).rstrip("(").endswith("-start"):
            sizes = sizes[len(sizes) // 2 :]  # (async form: (operands, results))
        p = _group_size(text[m.end() : text.find("\n", m.end())], n)
        g = n // p  # groups working side by side
        # this file's convention (transforms/shard_boxing.py): bytes summed over devices
        # (HLO shapes are per device: an all-gather's result is the whole group piece, a
        # reduce-scatter's one of p pieces)
        per = {"all-reduce": 2 * (p - 1), "all-gather": p - 1, "reduce-scatter": (p - 1) * p}
        total += g * per.get(op, p - 1) * sum(sizes)
        c = counts.setdefault(op, [0, 0])
        c[0] += 1
        c[1] += len(sizes)
    return counts, int(total)


def counts_text(counts):
    """'all-reduce:5 (15 values)': HLO ops per collective, and the values they carry."""
    return ",".join(
        f"{k}:{o}" + (f" ({v} values)" if v != o else "") for k, (o, v) in sorted(counts.items())
    )


def _group_size(line, n):
    """Devices per replica group of a collective's HLO line: the explicit form
    {{0,1},{2,3}}, the iota form [2,2]<=[4] (2 groups of 2), or the mesh form
    mesh['axis_0'=2,'axis_1'=2] {'axis_0'}."""
    groups = re.search(r"replica_groups=\{\{([0-9,]*)\}", line)
    if groups:
        return len(groups.group(1).split(","))
    iota = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", line)  # [groups,size]<=[n]...
    if iota:
        return int(iota.group(2))
    mesh = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line)
    if mesh:
        sizes = {a: int(k) for a, k in re.findall(r"'(\w+)'=(\d+)", mesh.group(1))}
        return int(np.prod([sizes[a] for a in re.findall(r"'(\w+)'", mesh.group(2))]))
    return n
