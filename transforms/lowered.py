"""JAX's ahead-of-time API shape: `jit(f).lower(*args)` -> `Lowered` -> `.compile()`.

Example:
    >>> import fflow, fflow.numpy as jnp
    >>> lowered = fflow.jit(lambda x: x * 2 + 1).lower(jnp.ones(3))
    >>> "def fflow_kernel" in lowered.as_text()
    True
    >>> lowered.compile()(jnp.ones(3)).tolist()
    [3.0, 3.0, 3.0]
"""

import numpy as np
from fflow.lowering.passes import FusionGroup, step_inputs
from fflow.transforms.attention_rewrite import rewrites_of

from fflow.api_util import as_value
from fflow.tree_util import tree_flatten, tree_unflatten


class Lowered:
    """A traced and lowered program: `.as_text()` is the program and the generated code."""

    def __init__(self, entry, in_tree=None):
        self.entry = entry
        self.in_tree = in_tree

    @property
    def program(self):
        """The traced program (before the lowering passes)."""
        return self.entry.program

    @property
    def optimized_program(self):
        """The program after DCE, constant folding and CSE (what the code implements)."""
        return getattr(self.entry.executable, "program", self.entry.program)

    @property
    def source(self):
        """The generated Python source (None for interpreted programs)."""
        return getattr(self.entry.executable, "source", None)

    def as_text(self):
        text = "# program\n" + str(self.entry.program)
        opt = getattr(self.entry.executable, "program", None)
        if opt is not None and opt is not self.entry.program:
            text += "\n\n# after passes (DCE, constant folding, CSE)\n" + str(opt)
        steps = getattr(self.entry.executable, "steps", None)
        groups = [s for s in steps or () if type(s).__name__ == "FusionGroup"]
        if groups:
            text += "\n\n# fused elementwise groups\n" + "\n".join(f"# {g!r}" for g in groups)
        if self.source:
            text += "\n\n# generated code\n" + self.source
        for k, c_source in enumerate(getattr(self.entry.executable, "native_sources", ())):
            text += f"\n\n# native loop {k} (C, gcc)\n" + c_source
        return text

    def __str__(self):
        return self.as_text()

    def explain(self):
        """The `fflow.explain` report for this program."""
        return Report(self.entry)

    def compile(self):
        """The executable (trace and code generation already happened)."""
        return Compiled(self.entry)


class Compiled:
    """The executable of a Lowered program; call it with the same argument structure."""

    def __init__(self, entry):
        self.entry = entry

    def __call__(self, *args, **kwargs):
        leaves, _ = tree_flatten((args, kwargs))
        leaves = [as_value(x) for x in leaves]
        if self.entry.executable is None:
            raise RuntimeError("this program has no executable (it closes over traced values)")
        outs = self.entry.executable(*leaves)
        return tree_unflatten(self.entry.out_tree, outs)

    def as_text(self):
        return Lowered(self.entry).as_text()

    def __str__(self):
        return self.as_text()


def _nbytes(v):
    aval = v.aval
    return int(np.prod(aval.shape, dtype=np.int64)) * aval.dtype.itemsize


def _bytes_moved(steps):
    """Bytes read and written by the steps (fused groups touch only their boundary)."""
    total = 0
    for s in steps:
        total += sum(_nbytes(v) for v in step_inputs(s))
        total += sum(_nbytes(v) for v in s.outputs)
    return total


def _bytes_unfused(program):
    total = 0
    for e in program.eqns:
        total += sum(_nbytes(v) for v in e.inputs if hasattr(v, "id"))
        total += sum(_nbytes(v) for v in e.outputs)
    return total


class Report:
    """Trace time, pass times, equation counts, fused groups and estimated bytes moved."""

    def __init__(self, entry, compile_time=None):
        ex = entry.executable
        self.program = entry.program
        self.optimized = getattr(ex, "program", entry.program)
        self.trace_time = entry.trace_time
        self.compile_time = compile_time
        report = getattr(ex, "report", None)
        self.pass_times = dict(report.times) if report else {}
        self.pass_counts = dict(report.counts) if report else {}
        self.steps = list(getattr(ex, "steps", None) or self.optimized.eqns)
        self.groups = [s for s in self.steps if type(s) is FusionGroup]
        self.eqns_before = len(self.program.eqns)
        self.eqns_after = len(self.optimized.eqns)
        self.bytes_unfused = _bytes_unfused(self.optimized)
        self.bytes_moved = _bytes_moved(self.steps)
        self.source = getattr(ex, "source", None)
        self.native_sources = list(getattr(ex, "native_sources", ()))
        self.rewrites = rewrites_of(entry.program)  # hand-written attention -> fused

    def __str__(self):
        lines = [f"trace: {self.trace_time * 1e3:.2f} ms"]
        if self.compile_time is not None:
            lines.append(f"lower + compile: {self.compile_time * 1e3:.2f} ms")
        for name, t in self.pass_times.items():
            count = self.pass_counts.get(name)
            lines.append(f"  pass {name:5s}: {t * 1e3:.3f} ms -> {count} equations")
        lines.extend(f"attention: {line}" for line in self.rewrites)
        lines.append(f"equations: {self.eqns_before} traced, {self.eqns_after} after passes")
        lines.append(
            f"steps: {len(self.steps)} ({len(self.groups)} fused elementwise groups, "
            f"{sum(len(g.eqns) for g in self.groups)} equations fused)"
        )
        for g in self.groups:
            lines.append(f"  {g!r}")
        if self.native_sources:
            lines.append(f"native loops (C): {len(self.native_sources)}")
        lines.append(
            f"estimated bytes moved: {self.bytes_moved / 1e6:.3f} MB "
            f"(unfused {self.bytes_unfused / 1e6:.3f} MB)"
        )
        return "\n".join(lines)

    __repr__ = __str__
