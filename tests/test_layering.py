"""The import graph of fflow follows the layer table in ARCHITECTURE.md.

Every `import` of an fflow module inside fflow is an edge (function-level imports
included, counted separately). The test fails on a cycle, on an import of a higher
layer, and on a function-level import that is not of an optional heavy part (HEAVY)
or of a module kept off the `import fflow` path (LAZY) with a one-line reason.
"""

import ast
import fnmatch
import os
import re
import subprocess
import sys

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

# Kept off the `import fflow` path on purpose (loaded on first use; checked by
# test_lazy_modules_stay_off_the_import_path): a function-level import of one of these is
# allowed too, with a one-line reason.
LAZY = (
    "fflow.lowering.numpy_backend",
    "fflow.transforms.lowered",
    "fflow.debug",
    "fflow.numpy.linalg",  # jnp.linalg, as jnp.fft (fflow.numpy's __getattr__)
    "fflow.numpy.fft",
)


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
    for pattern, level in TABLE:  # a module named in the table before a pattern
        if pattern == mod:
            return level
    for pattern, level in TABLE:
        if fnmatch.fnmatchcase(mod, pattern):
            return level
    return TOP - 1  # unnamed modules: global arrays, runtimes, public APIs


def _heavy(mod):
    return any(fnmatch.fnmatchcase(mod, p) for p in HEAVY)


def _lazy(mod):
    return mod in LAZY


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
    cycles = _cycles({(i.importer, i.target) for i in IMPORTS})
    assert not cycles, "import cycles (function-level imports included):\n" + "\n".join(
        " -> ".join(c) for c in cycles
    )


def test_no_upward_import():
    bad = {
        (i.importer, i.target)
        for i in IMPORTS
        if layer(i.target) > layer(i.importer) and not (i.in_function and _heavy(i.target))
    }
    new = sorted(bad)
    assert not new, "imports of a higher layer (see ARCHITECTURE.md, Import layers):\n" + (
        "\n".join(f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)})" for a, b in new)
    )


def test_function_level_imports_are_heavy_or_lazy_parts_with_a_reason():
    for i in IMPORTS:
        if not i.in_function:
            continue
        assert _heavy(i.target) or _lazy(i.target), (
            f"{i}: a function-level import of an fflow module that is no optional heavy "
            "(HEAVY) or lazy (LAZY) part; import it at module level"
        )
        # inside the heavy part itself no reason is needed
        assert i.reason or (_heavy(i.target) and _heavy(i.importer)), (
            f"{i}: say in a one-line comment why it is imported late"
        )


@pytest.mark.parametrize("mod", ["fflow.dtypes", "fflow.core", "fflow.lax_ops"])
def test_low_layers_import_nothing_above(mod):
    # a direct check of the table's reading
    for i in IMPORTS:
        if i.importer == mod:
            assert layer(i.target) <= layer(mod), i


def test_lazy_modules_stay_off_the_import_path():
    # LAZY is true: a plain `import fflow` loads none of them
    code = "import sys, fflow; print(sorted(m for m in sys.modules if m.startswith('fflow')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(ast.literal_eval(out.stdout.strip()))
    assert not loaded & set(LAZY), sorted(loaded & set(LAZY))
