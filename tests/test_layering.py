"""The import graph of fflow follows the layer table in ARCHITECTURE.md.

Every `import` of an fflow module inside fflow is an edge (function-level imports
included, counted separately). The test fails on a cycle, on an import of a higher
layer, and on a function-level import that is not of an optional heavy part with a
one-line reason. `KNOWN_*` list what is not fixed yet; they may only shrink (an entry
that no longer occurs fails too, so the list stays true).
"""

import ast
import fnmatch
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = {
    "fflow": "fflow",
    "transforms": "fflow.transforms",
    "primitives": "fflow.primitives",
    "lowering": "fflow.lowering",
}

# Optional heavy parts: a function-level import of one of these is allowed (with a reason).
HEAVY = (
    "fflow.lowering.cuda_*",
    "fflow.lowering.nvrtc",
    "fflow.lowering.shim",
    "fflow.lowering.native",
    "fflow.lowering.native_rows",
    "fflow.runtime_mpi",
)

# Edges (importer, imported) that break the layering today; may only shrink.
KNOWN_BAD_EDGES = {
    ("fflow.lowering.cuda_nccl", "fflow.runtime_mpi"),
}

# Cycles among modules of one layer (beyond KNOWN_BAD_EDGES) not broken yet; may only shrink.
KNOWN_CYCLES = []

# Function-level imports of fflow modules that are not heavy parts, per importer; may
# only shrink.
KNOWN_FUNCTION_LEVEL = {
    "fflow.transforms.jit": 3,
    "fflow.transforms.shard_exec": 1,
}


def _modules():
    mods = {}
    for folder, prefix in PACKAGES.items():
        for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
            for fn in files:
                if fn.endswith(".py"):
                    path = os.path.join(dirpath, fn)
                    rel = os.path.relpath(path, os.path.join(ROOT, folder))[:-3]
                    rel = rel.replace(os.sep, ".")
                    if rel == "__init__":
                        name = prefix
                    else:
                        name = prefix + "." + rel.removesuffix(".__init__")
                    mods[name] = path
    return mods


MODULES = _modules()


def _resolve(name):
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


class Import:
    def __init__(self, importer, target, line, in_function, reason):
        self.importer, self.target, self.line = importer, target, line
        self.in_function, self.reason = in_function, reason

    def __repr__(self):
        where = "function-level" if self.in_function else "module-level"
        return f"{self.importer}:{self.line} imports {self.target} ({where})"


def _imports():
    found = []
    for mod, path in MODULES.items():
        with open(path) as f:
            source = f.read()
        lines = source.splitlines()
        is_pkg = path.endswith("__init__.py")

        def reason(lineno, lines=lines):
            here = lines[lineno - 1]
            above = lines[lineno - 2].strip() if lineno > 1 else ""
            return "#" in here or above.startswith("#")

        def visit(node, in_function, mod=mod, is_pkg=is_pkg):
            for child in ast.iter_child_nodes(node):
                fn = in_function or isinstance(
                    child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
                )
                targets = []
                if isinstance(child, ast.Import):
                    targets = [_resolve(a.name) for a in child.names]
                elif isinstance(child, ast.ImportFrom):
                    if child.level:
                        base = mod if is_pkg else mod.rpartition(".")[0]
                        for _ in range(child.level - 1):
                            base = base.rpartition(".")[0]
                        src = base + ("." + child.module if child.module else "")
                    else:
                        src = child.module or ""
                    targets = [
                        src + "." + a.name if src + "." + a.name in MODULES else _resolve(src)
                        for a in child.names
                    ]
                for t in targets:
                    if t and t != mod:
                        found.append(
                            Import(mod, t, child.lineno, in_function, reason(child.lineno))
                        )
                visit(child, fn)

        visit(ast.parse(source), False)
    return found


def _layer_table():
    with open(os.path.join(ROOT, "ARCHITECTURE.md")) as f:
        text = f.read()
    block = re.search(r"```layers\n(.*?)```", text, re.S)
    assert block, "ARCHITECTURE.md lost its ```layers table"
    table, top = [], 0
    for row in block.group(1).splitlines():
        parts = row.split()
        if not parts:
            continue
        level = int(parts[0])
        top = max(top, level)
        for pattern in parts[1:]:
            if pattern.startswith("("):
                break
            table.append((pattern, level))
    return table, top


TABLE, TOP = _layer_table()
IMPORTS = _imports()


def layer(mod):
    if mod == "fflow":
        return TOP
    for pattern, level in TABLE:
        if fnmatch.fnmatchcase(mod, pattern):
            return level
    return TOP - 1  # unnamed modules: global arrays, runtimes, public APIs


def _heavy(mod):
    return any(fnmatch.fnmatchcase(mod, p) for p in HEAVY)


def _cycles(edges):
    """Strongly connected components of more than one module (Tarjan)."""
    graph = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index, low, stack, on, out = {}, {}, [], set(), []

    def strong(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_every_layer_pattern_names_a_module():
    for pattern, _ in TABLE:
        assert any(fnmatch.fnmatchcase(m, pattern) for m in MODULES), pattern


def test_no_import_cycle():
    edges = {(i.importer, i.target) for i in IMPORTS} - KNOWN_BAD_EDGES
    cycles = [c for c in _cycles(edges) if not any(set(c) <= set(k) for k in KNOWN_CYCLES)]
    assert not cycles, "import cycles (function-level imports included):\n" + "\n".join(
        " -> ".join(c) for c in cycles
    )


def test_no_upward_import():
    bad = {
        (i.importer, i.target)
        for i in IMPORTS
        if layer(i.target) > layer(i.importer) and not (i.in_function and _heavy(i.target))
    }
    new = sorted(bad - KNOWN_BAD_EDGES)
    assert not new, "imports of a higher layer (see ARCHITECTURE.md, Import layers):\n" + (
        "\n".join(f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)})" for a, b in new)
    )


def test_known_bad_edges_still_occur():
    edges = {(i.importer, i.target) for i in IMPORTS}
    stale = sorted(KNOWN_BAD_EDGES - edges)
    assert not stale, f"fixed; remove from KNOWN_BAD_EDGES: {stale}"


def test_function_level_imports_are_heavy_parts_with_a_reason():
    counts = {}
    for i in IMPORTS:
        if not i.in_function:
            continue
        if _heavy(i.target):
            # inside the heavy part itself no reason is needed
            assert i.reason or _heavy(i.importer), (
                f"{i}: say in a one-line comment why it is imported late"
            )
        else:
            counts[i.importer] = counts.get(i.importer, 0) + 1
    over = {
        m: (n, KNOWN_FUNCTION_LEVEL.get(m, 0))
        for m, n in counts.items()
        if n > KNOWN_FUNCTION_LEVEL.get(m, 0)
    }
    assert not over, (
        "function-level imports of fflow modules that are no optional heavy part "
        "(module: (found, allowed)); import them at module level: " + repr(over)
    )
    under = {
        m: (counts.get(m, 0), n) for m, n in KNOWN_FUNCTION_LEVEL.items() if counts.get(m, 0) < n
    }
    assert not under, f"fewer function-level imports now (found, allowed): lower them: {under}"


@pytest.mark.parametrize("mod", ["fflow.dtypes", "fflow.core", "fflow.lax_ops"])
def test_low_layers_import_nothing_above(mod):
    # a direct check of the table's reading, independent of the allow-lists
    for i in IMPORTS:
        if i.importer == mod and (i.importer, i.target) not in KNOWN_BAD_EDGES:
            assert layer(i.target) <= layer(mod), i
