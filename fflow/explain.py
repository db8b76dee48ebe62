"""`fflow.explain(f)(*args)`: what jit does with `f` for these arguments.

Example:
    >>> import fflow, fflow.numpy as jnp
    >>> report = fflow.explain(lambda x: jnp.tanh(x * 2 + 1))(jnp.ones(1000))
    >>> report.eqns_after <= report.eqns_before
    True
    >>> len(report.groups)
    1
"""

import sys
import time
import types

import numpy as np

from fflow.lowering.passes import FusionGroup, step_inputs
from fflow.transforms.jit import Jitted


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

    def __str__(self):
        lines = [f"trace: {self.trace_time * 1e3:.2f} ms"]
        if self.compile_time is not None:
            lines.append(f"lower + compile: {self.compile_time * 1e3:.2f} ms")
        for name, t in self.pass_times.items():
            count = self.pass_counts.get(name)
            lines.append(f"  pass {name:5s}: {t * 1e3:.3f} ms -> {count} equations")
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


def explain(fun, **jit_kwargs):
    """`explain(f)(*args)` traces and lowers `f` as jit would and reports on it.

    Returns a `Report` (print it): trace time, pass times, equation counts before
    and after the passes, fused groups and estimated bytes moved.
    """
    jitted = fun if isinstance(fun, Jitted) else Jitted(fun, **jit_kwargs)

    def run(*args, **kwargs):
        fresh = Jitted(jitted.fun, jitted.static_argnums, jitted.static_argnames)
        t0 = time.perf_counter()
        lowered = fresh.lower(*args, **kwargs)
        total = time.perf_counter() - t0
        return Report(lowered.entry, compile_time=total - lowered.entry.trace_time)

    return run


__all__ = ["explain", "Report"]


class _CallableModule(types.ModuleType):
    # `import fflow.explain` (e.g. by Lowered.explain) rebinds `fflow.explain` to this
    # module; calling it must still mean `fflow.explain(f)`
    def __call__(self, fun, **jit_kwargs):
        return explain(fun, **jit_kwargs)


sys.modules[__name__].__class__ = _CallableModule
