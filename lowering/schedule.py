"""Scheduling for the backends: elementwise fusion groups and buffer liveness.

`fusion_groups(program)` turns a program into *steps* (equations and `FusionGroup`s);
`liveness(steps, outvars)` says after which step each value, and each buffer counting
its views, is dead. Both are shared by the NumPy and CUDA backends (re-exported by
`fflow.lowering.passes`).
"""

import numpy as np
from fflow.lowering.effects import has_subprograms, is_effectful

from fflow.core import Literal, Var

# -- fusion ---------------------------------------------------------------------------


def is_fusible(eqn):
    """Elementwise, one output, no sub-programs, no effects."""
    prim = eqn.primitive
    return (
        "elementwise" in prim.traits
        and not prim.multiple_results
        and not is_effectful(eqn)
        and not has_subprograms(eqn)
        and all(
            type(v) is Literal or v.aval.shape in ((), eqn.outputs[0].aval.shape)
            for v in eqn.inputs
        )
    )


class FusionGroup:
    """A connected set of elementwise equations with one output (its `root`).

    `eqns` are in program order; every value they produce except the root's output
    is consumed only inside the group. `inputs` are the external values (Vars and
    Literals) in first-use order. All members have the output's shape.
    """

    __slots__ = ("eqns", "inputs", "outputs", "shape")

    def __init__(self, eqns):
        self.eqns = eqns
        produced = set()
        inputs = []
        seen = set()
        for e in eqns:
            for v in e.inputs:
                if type(v) is Var and v not in produced and v not in seen:
                    seen.add(v)
                    inputs.append(v)
            produced.update(e.outputs)
        self.inputs = inputs
        self.outputs = [eqns[-1].outputs[0]]
        self.shape = eqns[-1].outputs[0].aval.shape

    @property
    def root(self):
        return self.eqns[-1]

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))

    def __repr__(self):
        names = " ".join(e.primitive.name for e in self.eqns)
        return f"FusionGroup[{names}] -> {self.outputs[0].aval.str_short()}"


def step_inputs(step):
    if type(step) is FusionGroup:
        return step.inputs
    return [v for v in step.inputs if type(v) is Var]


def step_outputs(step):
    return step.outputs


def fusion_groups(program, min_size=2):
    """The program as a list of steps: `Eqn`s and `FusionGroup`s (in a valid order).

    A reverse pass puts an elementwise equation into its consumers' group when all
    of its consumers are in that one group (and its value is not a program output).
    A group is emitted at its root's position, which is valid because every member
    and every external input precedes the root.
    """
    eqns = program.eqns
    consumers = {}
    for i, e in enumerate(eqns):
        for v in e.inputs:
            if type(v) is Var:
                consumers.setdefault(v, set()).add(i)
    outset = {v for v in program.outvars if type(v) is Var}
    group_of = [None] * len(eqns)
    for i in range(len(eqns) - 1, -1, -1):
        e = eqns[i]
        if not is_fusible(e):
            continue
        out = e.outputs[0]
        users = consumers.get(out, ())
        gid = None
        if out not in outset and users:
            gids = {group_of[j] for j in users}
            if len(gids) == 1:
                (gid,) = gids
                if gid is not None and eqns[gid].outputs[0].aval.shape != out.aval.shape:
                    gid = None
        group_of[i] = i if gid is None else gid
    members = {}
    for i, g in enumerate(group_of):
        if g is not None:
            members.setdefault(g, []).append(eqns[i])
    steps = []
    for i, e in enumerate(eqns):
        g = group_of[i]
        if g is None:
            steps.append(e)
        elif g == i:
            group = members[g]
            steps.extend(group if len(group) < min_size else [FusionGroup(group)])
    return steps


# -- liveness -------------------------------------------------------------------------


class Liveness:
    """When each value dies, and which values share a buffer.

    `last_use[v]` is the index of the last step reading `v` (len(steps) for program
    outputs). `alias[v]` is the set of values that may share `v`'s memory (views);
    `buffer_dead_after(v, i)` says whether `v`'s memory may be overwritten by step i.
    """

    def __init__(self, steps, outvars, may_alias):
        n = len(steps)
        self.last_use = {}
        for i, step in enumerate(steps):
            for v in step_inputs(step):
                self.last_use[v] = i
        for v in outvars:
            if type(v) is Var:
                self.last_use[v] = n + 1
        # union-find over views
        parent = {}

        def find(v):
            while parent.get(v, v) is not v:
                v = parent[v]
            return v

        for step in steps:
            if type(step) is FusionGroup or not may_alias(step):
                continue
            for a in step.inputs:
                if type(a) is not Var:
                    continue
                for b in step.outputs:
                    ra, rb = find(a), find(b)
                    if ra is not rb:
                        parent[rb] = ra
        groups = {}
        for v in list(parent):
            groups.setdefault(find(v), []).append(v)
        self.alias = {}
        for root, vs in groups.items():
            members = set(vs) | {root}
            for v in members:
                self.alias[v] = members

    def dead_after(self, v, i):
        return self.last_use.get(v, -1) <= i

    def buffer_dead_after(self, v, i):
        group = self.alias.get(v)
        if group is None:
            return self.dead_after(v, i)
        return all(self.last_use.get(w, -1) <= i for w in group)


def default_may_alias(eqn):
    """Whether an output of `eqn` may share memory with an input (conservative)."""
    # trait "view", set next to the primitive: its NumPy result may share the memory of
    # an input (a view, or the input itself)
    if "view" in eqn.primitive.traits:
        return True
    # a new array: trait "fresh_output" (dot_general, sort, gather, pad, scatters...), and
    # every reduction and cumulative primitive
    if {"fresh_output", "reduction", "cumulative"} & eqn.primitive.traits:
        return False
    if "elementwise" in eqn.primitive.traits and not eqn.primitive.multiple_results:
        return False
    return True  # control flow, custom calls, anything unknown: may return an input


def liveness(steps, outvars, may_alias=default_may_alias):
    return Liveness(steps, outvars, may_alias)
