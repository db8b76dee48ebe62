"""CUDA graphs for jitted programs on a GPU: the launches of one call are captured
once per compiled signature and replayed, so a cache-hit call costs one graph
launch plus binding the arguments, instead of one Python-driven launch (and its
fflow + CuPy overhead) per kernel and GEMM.

How a call runs (`Executable.__call__` on a `CupyRuntime`):

1. the first call runs the plan step by step (it compiles and loads the kernels,
   makes the constants' device copies and warms cuBLAS and the memory pool);
2. the second call captures: the arguments are copied into buffers owned by the
   graph, the plan runs on a side stream in capture mode (nothing executes), and
   every buffer the run allocates is kept alive with the graph, because the graph
   reads and writes those addresses on every replay;
3. every call from the second on: copy the arguments into the graph's input
   buffers (device-to-device, on the current stream; skipped for an argument that
   is the same buffer as last time), launch the graph there, and return copies of
   its output buffers (a later replay overwrites them).

Only plans made of kernels, GEMMs and views are captured (host steps, host-driven
control flow and cuSOLVER need the host between launches) with more launches than
arguments + outputs (each of those costs a copy per replay), and not when inputs
are donated. `FFLOW_CUDA_GRAPHS=0` turns graphs off; a capture that fails (an
operation the driver refuses while capturing) leaves that program without a graph.

Example (on a GPU):
    >>> import fflow, fflow.numpy as jnp                          # doctest: +SKIP
    >>> f = fflow.jit(lambda x: jnp.tanh(x) * 2)                  # doctest: +SKIP
    >>> x = fflow.device_put(jnp.ones(1024), fflow.devices("gpu")[0])  # doctest: +SKIP
    >>> f(x); f(x)  # the second call captures, later calls replay  # doctest: +SKIP
"""

import os

from fflow.lowering.cuda_plan import AliasStep, BlasStep, KernelStep, LtStep

from fflow.core import Var


def enabled():
    return os.environ.get("FFLOW_CUDA_GRAPHS", "1") not in ("0", "false", "False", "")


def launches(plan):
    """Kernel launches and GEMMs of one call of `plan`."""
    return sum(
        len(s.kernels) if type(s) is KernelStep else type(s) in (BlasStep, LtStep)
        for s in plan.steps
    )


def worthwhile(plan):
    """Capture `plan`? It must be capturable, and its launches must outnumber the copies
    a replay adds (one per argument and output), or the graph saves nothing."""
    program = plan.program
    return capturable(plan) and launches(plan) > len(program.invars) + len(program.outvars)


def capturable(plan):
    """Can every step of `plan` be captured into a graph (no host work in between)?"""
    program = plan.program
    if any(type(v) is not Var for v in program.outvars):
        return False  # literal outputs are made on the host
    for step in plan.steps:
        t = type(step)
        if t in (BlasStep, LtStep):
            if any(type(v) is not Var for v in step.eqn.inputs):
                return False  # a literal operand would be copied from the host
        elif t not in (KernelStep, AliasStep):
            return False
    return True


class _Keep(dict):
    """The run's environment; every buffer stored in it stays alive with the graph."""

    def __init__(self, kept):
        super().__init__()
        self.kept = kept

    def __setitem__(self, key, value):
        self.kept.append(value)
        super().__setitem__(key, value)


class Graph:
    """One captured call of an Executable: its graph and the buffers it owns."""

    def __init__(self, exe, vals):
        rt = exe.runtime
        cp = rt.cp
        self.inputs = [rt.empty(v.aval) for v in exe.program.invars]
        self.sources = [None] * len(self.inputs)
        stream = cp.cuda.get_current_stream()
        self._bind(vals, stream)
        self.kept = []
        side = cp.cuda.Stream(non_blocking=True)
        stream.synchronize()  # the side stream starts after the bound arguments
        with side:
            side.begin_capture()
            try:
                self.outputs = exe._run(list(self.inputs), env=_Keep(self.kept))
            finally:
                self.graph = side.end_capture()
        self.launches = launches(exe.plan)

    def _bind(self, vals, stream):
        # arrays are immutable: an argument that is the very buffer bound last time (the
        # weights between optimizer steps that did not touch them, constants) is not
        # copied again; holding it keeps its address from being reused meanwhile
        for i, (buf, val) in enumerate(zip(self.inputs, vals)):
            if val is not self.sources[i] and buf.nbytes:
                buf.data.copy_from_device_async(val.data, buf.nbytes, stream)
            self.sources[i] = val

    def __call__(self, vals, cp):
        stream = cp.cuda.get_current_stream()
        self._bind(vals, stream)
        self.graph.launch(stream=stream)
        return [o.copy() for o in self.outputs]


def run(exe, vals):
    """Run `exe` on runtime values through its graph (capturing it on the second call)."""
    state = exe.graph
    if state is None:
        exe.graph = "warm"
        return exe._run(vals)
    if state == "warm":
        try:
            exe.graph = Graph(exe, vals)
        except Exception:  # a capture the driver refused: run step by step from now on
            exe.graphs, exe.graph = False, None
            return exe._run(vals)
    return exe.graph(vals, exe.runtime.cp)
