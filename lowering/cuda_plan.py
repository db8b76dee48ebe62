"""Planning for the CUDA backend: which values are inlined into kernels, which are
materialized, and the steps (kernels, GEMMs, views, control flow, solvers, host
fallbacks) that compute them. See cuda_backend.py for the overview."""

import numpy as np
from fflow.lowering import cuda_attention as ca
from fflow.lowering import (
    cuda_blockreduce,
    cuda_gemm,
    cuda_layout,
    cuda_scan,
    cuda_sort,
    cuda_transpose,
)
from fflow.lowering import cuda_kernels as ck
from fflow.lowering import cuda_reduce as cr
from fflow.lowering import cuda_scatter_sort as css
from fflow.primitives.control_flow import cond_p, while_p
from fflow.primitives.dot import dot_general_p
from fflow.primitives.reduction import (
    argmax_p,
    argmin_p,
    reduce_max_p,
    reduce_min_p,
    reduce_sum_p,
)
from fflow.primitives.scan import scan_p
from fflow.primitives.shape import broadcast_in_dim_p, reshape_p, squeeze_p
from fflow.primitives.sort import sort_p
from fflow.primitives.unary import copy_p

from fflow.array import Array
from fflow.core import Eqn, Literal, Program, ShapedArray, Var

WIDE_LIMIT = 2**30  # 32-bit indices below (grid-stride loop counters stay under 2^31)
FULL_REDUCE_MIN = 8192
_COL_FUSIBLE = (reduce_sum_p, reduce_max_p, reduce_min_p)
RECOMPUTE_LIMIT = 16  # renders of an inlined value per output element before it is stored


# -- plan -----------------------------------------------------------------------------------


class KernelStep:
    def __init__(self, kernels, note=""):
        self.kernels = kernels
        self.note = note

    @property
    def reads(self):
        return [v for kern in self.kernels for kind, v in kern.args if kind == "in"]

    @property
    def writes(self):
        return [v for kern in self.kernels for kind, v in kern.args if kind == "out"]


class BlasStep:
    def __init__(self, eqn):
        self.eqn = eqn
        self.reads = [v for v in eqn.inputs if type(v) is Var]
        self.writes = list(eqn.outputs)


class LtStep:
    """A GEMM with its bias / activation in cuBLASLt's epilogue (cuda_layout.Epilogue).

    `fallback` are the kernels (the fused elementwise epilogue, and a bias gradient's
    column sum) that compute the same values from the plain GEMM's output when cuBLASLt
    is missing, refuses the layout, or (a ReLU backward) the forward step did not write
    the bit mask; `taken` says which path the last run took ("cuBLASLt" or why not).
    """

    def __init__(self, epi, fallback):
        self.epi, self.eqn, self.fallback = epi, epi.dot, fallback
        self.writes = [v for v in (epi.out, epi.aux, epi.bgrad) if v is not None]
        if epi.mask is not None and epi.act == "relu":
            self.writes.append(epi.mask)  # RELU_AUX: the backward's DRELU reads it
        q = epi.dot.outputs[0]
        reads = [v for v in epi.dot.inputs if type(v) is Var]
        if epi.mask is not None and epi.act == "drelu":
            reads.append(epi.mask)
        own = set(self.writes) | {q}
        reads += [v for k in fallback for kind, v in k.args if kind == "in" and v not in own]
        self.reads = list(dict.fromkeys(reads))
        self.taken = None

    def describe(self):
        e = self.epi
        what = (
            cuda_gemm.describe(e.dot)
            .split(" ", 1)[1]
            .replace(np.dtype(e.dot.outputs[0].aval.dtype).name, np.dtype(e.out.aval.dtype).name)
        )
        return f"{e.label} (cuBLASLt epilogue {e.name}) {what}"

    @property
    def status(self):
        names = "kernel" + "s" * (len(self.fallback) > 1) + " "
        names += " + ".join(k.name for k in self.fallback)
        if self.taken is None:
            return f"cuBLASLt on a GPU, else GEMM + {names}"
        if self.taken == "cuBLASLt":
            return "taken: cuBLASLt"
        return f"taken: GEMM + {names} ({self.taken})"


class AliasStep:
    def __init__(self, out, src):
        self.out, self.src = out, src
        self.reads, self.writes = [src], [out]


class HostStep:
    def __init__(self, eqn):
        self.eqn = eqn
        self.reads = [v for v in eqn.inputs if type(v) is Var]
        self.writes = list(eqn.outputs)


class ControlStep:
    """cond / while / scan: a host loop around compiled sub-programs (kernels on the device)."""

    def __init__(self, eqn):
        self.eqn = eqn
        self.reads = [v for v in eqn.inputs if type(v) is Var]
        self.writes = list(eqn.outputs)


CONTROL = (cond_p, while_p, scan_p)


class SolverStep(HostStep):
    """A dense decomposition/solve: cuSOLVER via CuPy on a GPU, else the host."""


class _EwGroup:
    def __init__(self, shape):
        self.shape = shape
        self.outputs = []


class _RowGroup:
    def __init__(self, eqn, x_shape=None):
        self.reductions = [eqn] if eqn is not None else []  # none: elementwise + columns
        self.elem_outputs = []
        self.row_outputs = []
        x_shape = x_shape or eqn.inputs[0].aval.shape
        self.x_shape = x_shape
        self.rows = x_shape[:-1]
        self.cols = []  # reductions over the rows, fused into the row kernel


class _ColCand:
    """A reduction over leading axes: fused into a neighbouring row kernel of the same
    shape when it can be (a bias / gamma / beta gradient), else its own `step`."""

    def __init__(self, eqn, step):
        self.eqn = eqn
        self.step = step


def _renders_inputs(eqn):
    return (
        ck.is_fusible(eqn)
        or eqn.primitive in ck.REDUCTIONS
        or eqn.primitive in ck.CUMULATIVE
        or eqn.primitive in ck.SCATTERS
    )


def _supported_aval(aval):
    from fflow.lowering.cuda_render import supported_dtype

    return supported_dtype(aval.dtype)


def _supported(eqn):
    from fflow.lowering.cuda_render import supported_dtype

    return all(
        supported_dtype(v.aval.dtype) for v in list(eqn.inputs) + list(eqn.outputs)
    ) and not any(isinstance(p, Program) for p in eqn.params.values())


def _kind(eqn):
    prim = eqn.primitive
    if eqn.primitive in CONTROL and all(
        _supported_aval(v.aval) for v in list(eqn.inputs) + list(eqn.outputs)
    ):
        return "control"
    if not _supported(eqn):
        return "host"
    if ck.is_fusible(eqn):
        return "fuse"
    if (
        eqn.primitive in ck.REDUCTIONS
        and eqn.params["axes"]
        and ck.size_of(eqn.outputs[0].aval.shape)
    ):
        return "reduce"
    if eqn.primitive in ck.CUMULATIVE and ck.size_of(eqn.inputs[0].aval.shape):
        return "scan"
    if eqn.primitive in ck.SCATTERS:
        return "scatter"
    if eqn.primitive is dot_general_p:
        return "blas"
    if ca.supported(eqn):
        return "attention"
    if prim is sort_p and 0 < eqn.inputs[0].aval.shape[eqn.params["dimension"]] <= css.SORT_MAX:
        return "sort"
    if prim is sort_p and cuda_sort.supported(eqn):
        return "device sort"
    if "solver" in eqn.primitive.traits:  # primitives/linalg.py: cuSOLVER through CuPy (the
        return "solver"  # NumPy implementation dispatches to cupy.linalg), NumPy on the shim
    return "host"


class Plan:
    """The launch plan of one program. `epilogues`: match GEMM + bias / activation
    chains for cuBLASLt (LtStep); off, they are the GEMM's next fused kernel."""

    def __init__(self, program, epilogues=True):
        self.program = program
        self.steps = []
        eqns = program.eqns
        outset = {v for v in program.outvars if type(v) is Var}
        consumers = {}
        for e in eqns:
            for v in e.inputs:
                if type(v) is Var:
                    consumers.setdefault(v, []).append(e)
        kinds = {id(e): _kind(e) for e in eqns}
        self.wide = any(
            ck.size_of(v.aval.shape) > WIDE_LIMIT for e in eqns for v in e.inputs + e.outputs
            if type(v) is Var
        )  # fmt: skip
        self.inline = {}
        materialized = set(program.invars) | set(program.constvars)
        for v, c in zip(program.constvars, program.consts):
            splat = _splat_eqn(v, c)
            users = consumers.get(v, ())
            if splat is not None and v not in outset and all(_renders_inputs(u) for u in users):
                # a broadcast scalar: a literal in the kernels, no buffer
                self.inline[v] = splat
                materialized.discard(v)
        prod = {o: e for e in eqns for o in e.outputs}
        self.epilogues = (
            cuda_layout.match_epilogues(program, consumers, outset, self._const_value(prod))
            if epilogues
            else {}
        )
        inside = {id(x) for epi in self.epilogues.values() for x in epi.inner}
        inside |= {id(epi.bgrad_eqn) for epi in self.epilogues.values() if epi.bgrad_eqn}
        for e in eqns:
            if kinds[id(e)] == "fuse":
                out = e.outputs[0]
                if out in outset or any(
                    kinds[id(c)] != "fuse"
                    and not _renders_inputs(c)
                    or kinds[id(c)] in ("host", "control", "solver")
                    for c in consumers.get(out, ())
                ):
                    materialized.add(out)
                else:
                    self.inline[out] = e
            else:
                materialized.update(e.outputs)
        materialized |= self._recompute_limit(eqns)
        for epi in self.epilogues.values():  # values the Lt step reads or writes in memory
            for v in (epi.bias, epi.out, epi.aux, epi.bgrad):
                if v is not None and v in self.inline:
                    del self.inline[v]
                    materialized.add(v)
        self.fallback_kernels = []
        pending = []  # _EwGroup / _RowGroup / finished steps, in order
        for e in eqns:
            kind = kinds[id(e)]
            out = e.outputs[0] if e.outputs else None
            if kind == "fuse":
                if out in self.inline or id(e) in inside:
                    continue
                if e.primitive in (reshape_p, squeeze_p) and e.inputs[0] not in self.inline:
                    pending.append(AliasStep(out, e.inputs[0]))
                    continue
                last = pending[-1] if pending else None
                if type(last) is _EwGroup and last.shape == out.aval.shape:
                    last.outputs.append(out)
                else:
                    g = _EwGroup(out.aval.shape)
                    g.outputs.append(out)
                    pending.append(g)
            elif kind == "reduce" and id(e) in inside:
                continue  # a bias gradient in a cuBLASLt epilogue (DRELU_BGRAD)
            elif kind == "reduce":
                pending.append(self._reduction(e))
            elif kind == "scan" and cuda_scan.wanted(e):  # long lines: all blocks at once
                kerns = cuda_scan.scan_kernels(e, self._inl(), self.wide)
                pending.append(KernelStep(kerns, note="chunked scan"))
            elif kind == "scan":
                pending.append(KernelStep([cr.cumulative_kernel(e, self._inl(), self.wide)]))
            elif kind == "scatter":
                x = e.inputs[0]
                copy = ck.elementwise_kernel(
                    [out], {**self._inl(), out: _Identity(x, out)}, self.wide
                )
                scat = css.scatter_kernel(e, self._inl(), out, self.wide)
                pending.append(KernelStep([copy, scat], note=e.primitive.name))
            elif kind == "blas" and id(e) in self.epilogues:
                pending.append(self._lt_step(self.epilogues[id(e)]))
            elif kind == "blas":
                pending.append(BlasStep(e))
            elif kind == "control":
                pending.append(ControlStep(e))
            elif kind == "solver":
                pending.append(SolverStep(e))
            elif kind == "sort":
                pending.append(KernelStep([css.sort_kernel(e, self.wide)]))
            elif kind == "device sort":  # long lines: bitonic passes over global memory
                pending.append(KernelStep(cuda_sort.sort_kernels(e, self.wide), note=kind))
            elif kind == "attention":
                kern = ca.KERNELS[e.primitive](e)
                pending.append(KernelStep([kern], note=ca.describe(e)))
            else:
                pending.append(HostStep(e))
        pending = self._merge_rows(pending)
        for item in pending:
            if type(item) is _EwGroup:
                inline = {**self.inline, **{v: self._producer(v) for v in item.outputs}}
                t = cuda_transpose.candidate(item.outputs, inline)  # through a shared tile
                kern = (
                    cuda_transpose.tiled_kernel(item.outputs, inline, t, self.wide) if t else None
                )
                kern = kern or ck.elementwise_kernel(item.outputs, inline, self.wide)
                self.steps.append(
                    KernelStep([kern], note="tiled transpose" if t and kern.kind == "ewt" else "")
                )
            elif type(item) is _RowGroup:
                self.steps.append(self._row_step(item))
            elif type(item) is _ColCand:
                self.steps.append(item.step)
            else:
                self.steps.append(item)
        # a row reduction's result that no other step reads and no output is (softmax's
        # row max and sum) stays in registers: its row kernel is made again without it
        needed = {v for s in self.steps for v in s.reads} | outset
        groups = [(i, g) for i, g in enumerate(pending) if type(g) is _RowGroup]
        for i, g in groups:
            reds = {e.outputs[0] for e in g.reductions}
            keep = [v for v in g.row_outputs if v not in reds or v in needed]
            if len(keep) < len(g.row_outputs) and (keep or g.elem_outputs or g.cols):
                g.row_outputs = keep
                self.steps[i] = self._row_step(g)
        self.kernels = [k for s in self.steps if type(s) is KernelStep for k in s.kernels]

    def _lt_step(self, epi):
        outs = [epi.out] + ([epi.aux] if epi.aux is not None else [])
        inline = {**self.inline, **{o: x for x in epi.inner for o in x.outputs}}
        kerns = [ck.elementwise_kernel(outs, inline, self.wide)]
        if epi.bgrad_eqn is not None:  # the bias gradient: a column sum of the output
            kerns += self._strided(epi.bgrad_eqn).kernels
        self.fallback_kernels += kerns
        return LtStep(epi, kerns)

    def _const_value(self, prod):
        def value(v):
            if type(v) is Literal:
                x = v.value
            else:
                e = self.inline.get(v) or prod.get(v)
                if e is None or e.primitive is not broadcast_in_dim_p:
                    return None
                if type(e.inputs[0]) is not Literal:
                    return None
                x = e.inputs[0].value
            x = np.asarray(x)
            return float(x.astype(np.float64).reshape(())) if x.size == 1 else None

        return value

    def _row_step(self, g):
        inline = {**self.inline, **{v: self._producer(v) for v in g.elem_outputs + g.row_outputs}}
        kerns = cr.row_kernel(g.reductions, g.elem_outputs, g.row_outputs, inline, self.wide,
                              cols=g.cols, x_shape=g.x_shape)  # fmt: skip
        names = " ".join(e.primitive.name for e in g.reductions) or "elementwise"
        if g.cols:
            names += " + columns: " + " ".join(e.primitive.name for e in g.cols)
        return KernelStep(kerns, note=f"row-fused: {names}")

    def _recompute_limit(self, eqns):
        """Materialize values that inlining would recompute too often.

        Rendering a value at an index recomputes it once per distinct index its
        consumers ask for, so chains of stencils (`x[:-2] + x[1:-1] + x[2:]`, n times)
        multiply: 3^n evaluations per output. Walking back from the materialized
        values, each inlined value's renders per output element are the sum of its
        consumers'; an elementwise value rendered more than RECOMPUTE_LIMIT times is
        written to memory once instead (its consumers load it). Returns those values.
        """
        renders = {}
        out = set()
        for e in reversed(eqns):
            weight = 1
            if len(e.outputs) == 1 and e.outputs[0] in self.inline:
                v = e.outputs[0]
                weight = renders.get(v, 0)
                if weight > RECOMPUTE_LIMIT and e.primitive.name in ck.ELEMENTWISE:
                    del self.inline[v]
                    out.add(v)
                    weight = 1
            for x in {x for x in e.inputs if type(x) is Var}:
                renders[x] = renders.get(x, 0) + weight
        return out

    def _inl(self):
        return self.inline

    def _producer(self, v):
        return self.producers()[v]

    def producers(self):
        if not hasattr(self, "_producers"):
            self._producers = {o: e for e in self.program.eqns for o in e.outputs}
            self._producers.update(
                (v, e) for v, e in self.inline.items() if v not in self._producers
            )
        return self._producers

    def _reduction(self, e):
        x = e.inputs[0]
        axes = tuple(sorted(e.params["axes"]))
        nd = x.aval.ndim
        if ck.size_of(e.outputs[0].aval.shape) == 1 and ck.size_of(x.aval.shape) >= FULL_REDUCE_MIN:
            if e.primitive not in (argmax_p, argmin_p):
                red = cr.Reduction(e.primitive.name, x.aval.dtype, e.outputs[0].aval.dtype)
                nblocks = min(1024, (ck.size_of(x.aval.shape) + 1023) // 1024)
                acc_dtype = _acc_dtype(red.acc)
                partial = Var(ShapedArray((nblocks,), acc_dtype))
                return KernelStep(
                    cr.full_reduce_kernels(e, self.inline, partial, self.wide), note="two-pass"
                )
        if axes == tuple(range(nd - len(axes), nd)):
            return _RowGroup(e)
        if cuda_blockreduce.wanted(e):  # the contiguous axis is reduced: a block per output
            kerns = cuda_blockreduce.kernels(e, self.inline, self.wide)
            return KernelStep(kerns, note="block per output")
        step = self._strided(e)
        if axes == tuple(range(len(axes))) and e.primitive in _COL_FUSIBLE:
            return _ColCand(e, step)
        return step

    def _strided(self, e):
        x = e.inputs[0]
        if cuda_blockreduce.column_wanted(e):  # over leading axes: 32 x 8 thread blocks
            kerns = cuda_blockreduce.column_kernels(e, self.inline, self.wide)
            return KernelStep(kerns, note="columns, 2-D blocks")
        nsplit = cr.split_count(e)
        if nsplit > 1:
            red = cr.Reduction(e.primitive.name, x.aval.dtype, e.outputs[0].aval.dtype)
            m = ck.size_of(e.outputs[0].aval.shape)
            partial = Var(ShapedArray((nsplit, m), _acc_dtype(red.acc)))
            kernels = [
                cr.strided_reduce_kernel(e, self.inline, self.wide, partial_var=partial),
                cr.combine_partials_kernel(e, partial, self.wide),
            ]
            return KernelStep(kernels, note=f"split in {nsplit}")
        return KernelStep([cr.strided_reduce_kernel(e, self.inline, self.wide)])

    # -- row fusion ---------------------------------------------------------------------
    def _merge_rows(self, pending):
        out = []
        i = 0
        while i < len(pending):
            item = pending[i]
            i += 1
            if type(item) is _EwGroup and i < len(pending) and type(pending[i]) is _ColCand:
                # column sums of the rows an elementwise kernel writes (a bias gradient
                # next to the activation gradient): one row-structured kernel for both
                g = _RowGroup(None, item.shape) if len(item.shape) >= 2 else None
                while g and i < len(pending) and type(pending[i]) is _ColCand:
                    g.elem_outputs = list(item.outputs)
                    if not self._col_fusible(g, pending[i].eqn):
                        break
                    g.cols.append(pending[i].eqn)
                    i += 1
                out.append(g if g and g.cols else item)
                continue
            if type(item) is not _RowGroup:
                out.append(item)  # a _ColCand may still join the next row group
                continue
            g = item
            e0 = g.reductions[0]
            mergeable = tuple(e0.params["axes"]) == (len(g.x_shape) - 1,) and g.x_shape[-1] > 1
            while mergeable and i < len(pending):
                nxt = pending[i]
                if (
                    type(nxt) is _RowGroup
                    and nxt.x_shape == g.x_shape
                    and tuple(nxt.reductions[0].params["axes"]) == (len(g.x_shape) - 1,)
                ):
                    if self._row_local(g, nxt.reductions[0].inputs[0], "E"):
                        g.reductions += nxt.reductions
                        i += 1
                        continue
                if type(nxt) is _ColCand and self._col_fusible(g, nxt.eqn):
                    g.cols.append(nxt.eqn)
                    i += 1
                    continue
                if type(nxt) is _EwGroup:
                    form = (
                        "E"
                        if nxt.shape == g.x_shape
                        else "R"
                        if nxt.shape in (g.rows, g.rows + (1,))
                        else None
                    )
                    if form and all(
                        self._row_local(g, v, form, own=nxt.outputs) for v in nxt.outputs
                    ):
                        (g.elem_outputs if form == "E" else g.row_outputs).extend(nxt.outputs)
                        i += 1
                        continue
                break
            # column reductions just before the group join it when the group does not read them
            while mergeable and out and type(out[-1]) is _ColCand:
                if not self._col_fusible(g, out[-1].eqn, before=True):
                    break
                g.cols.insert(0, out.pop().eqn)
            g.row_outputs = [e.outputs[0] for e in g.reductions] + g.row_outputs
            out.append(g)
        return out

    def _col_fusible(self, g, e, before=False):
        """Can reduction `e` over the rows of `g` be accumulated by g's row kernel?"""
        x = e.inputs[0]
        if x.aval.shape != g.x_shape or tuple(sorted(e.params["axes"])) != tuple(
            range(len(g.rows))
        ):
            return False
        if g.reductions and tuple(g.reductions[0].params["axes"]) != (len(g.x_shape) - 1,):
            return False
        own = set(g.elem_outputs) | set(g.row_outputs)
        # it may not read another column result (known only after the kernel) ...
        if self._reaches(x, {c.outputs[0] for c in g.cols}, own):
            return False
        if before:  # ... and the group (its columns too) may not read it (it came first)
            roots = [r.inputs[0] for r in g.reductions + g.cols] + g.elem_outputs + g.row_outputs
            if any(self._reaches(r, {e.outputs[0]}, own) for r in roots):
                return False
        return self._row_local(g, x, "E", own=())

    def _reaches(self, root, targets, own):
        prod = self.producers()
        seen, stack = set(), [root]
        while stack:
            v = stack.pop()
            if type(v) is Literal or v in seen:
                continue
            seen.add(v)
            if v in targets:
                return True
            if v in self.inline or v in own:
                stack.extend(prod[v].inputs)
        return False

    def _row_local(self, g, root, form, own=()):
        """Does `root` (at `form`: "E" element or "R" row) read the group's reductions
        only at the current row? Then those reductions can stay in registers."""
        reds = {e.outputs[0] for e in g.reductions}
        inlinable = set(self.inline) | set(g.elem_outputs) | set(g.row_outputs) | set(own)
        prod = self.producers()
        rows = g.rows
        memo = {}

        def reaches(v):
            if type(v) is Literal:
                return False
            if v in reds:
                return True
            if v not in inlinable:
                return False
            key = (v, "reach")
            if key not in memo:
                memo[key] = any(reaches(x) for x in prod[v].inputs)
            return memo[key]

        def ok(v, f):
            if type(v) is Literal or not reaches(v):
                return True
            if v in reds:
                return f == "R"
            key = (v, f)
            if key in memo:
                return memo[key]
            e = prod[v]
            name = e.primitive.name
            shape = v.aval.shape
            res = False
            if f == "E" and shape != g.x_shape or f == "R" and shape not in (rows, rows + (1,)):
                res = False
            elif name in ck.ELEMENTWISE:
                res = all(
                    ok(x, f) if type(x) is Literal or x.aval.shape == shape else not reaches(x)
                    for x in e.inputs
                )
            elif e.primitive is broadcast_in_dim_p:
                (x,) = e.inputs
                bd = tuple(e.params["broadcast_dimensions"])
                if x.aval.shape in (rows, rows + (1,)) and bd == tuple(range(x.aval.ndim)):
                    res = ok(x, "R")
            elif e.primitive in (reshape_p, squeeze_p) and f == "R":
                (x,) = e.inputs
                if x.aval.shape in (rows, rows + (1,)):
                    res = ok(x, "R")
            memo[key] = res
            return res

        return ok(root, form)


def _splat_eqn(v, c):
    value = np.asarray(c._value if type(c) is Array else c)
    if type(value) is not np.ndarray or not value.size or value.ndim == 0:
        return None
    first = value.reshape(-1)[0]
    if not (all(s == 0 for s in value.strides) or (value.size <= 4096 and (value == first).all())):
        return None
    if value.dtype.kind == "f" and np.isnan(first) != np.isnan(value).all():
        return None
    lit = Literal(np.asarray(first, value.dtype), ShapedArray((), value.dtype))
    params = {"shape": value.shape, "broadcast_dimensions": ()}
    return Eqn(broadcast_in_dim_p, [lit], params, [v])


class _Identity:
    """A pseudo-equation: `out` is `x` (renders as a copy; used by scatters)."""

    def __init__(self, x, out):
        self.primitive = copy_p
        self.inputs = [x]
        self.outputs = [out]
        self.params = {}


def _acc_dtype(ctype):
    return cr.ACC_DTYPES[ctype]
