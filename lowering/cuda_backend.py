"""The CUDA backend: a Program becomes a launch plan of generated kernels and cuBLAS calls.

Planning (no GPU needed): after the shared passes (DCE, constant folding, CSE),
every value is either *inlined* (an elementwise or index-arithmetic equation whose
consumers render it at the index they need) or *materialized* by a step:

* `KernelStep`: generated kernels (cuda_kernels.py) — fused elementwise groups
  (multi-output, one per shape), reductions with their producers fused in, row
  kernels where last-axis reductions and the elementwise work on the same rows
  merge (softmax, log_softmax, layernorm...), scans and scatters;
* `BlasStep`: dot_general as one batched GEMM (cuBLAS through CuPy's matmul; the
  elementwise "epilogue" that consumes it — bias, activation — is the next fused
  kernel);
* `AliasStep`: reshape of a materialized buffer (no copy);
* `HostStep`: a primitive without a CUDA lowering (sort, control flow,
  collectives) runs its NumPy implementation on host copies.

Execution runs the plan on a runtime: `CupyRuntime` (RawModule from the NVRTC cubin,
cupy.matmul) or `ShimRuntime` (the same kernels through the host shim, NumPy's
matmul standing in for cuBLAS). `compile_program(...).source` shows the CUDA
source and the plan (grid, block, bytes read and written per kernel).
"""

import numpy as np
from fflow.lowering import cuda_kernels as ck
from fflow.lowering.cuda_render import PREAMBLE

from fflow import core
from fflow.array import Array, root_trace
from fflow.core import Literal, Program, ShapedArray, Var

WIDE_LIMIT = 2**30  # 32-bit indices below (grid-stride loop counters stay under 2^31)
FULL_REDUCE_MIN = 8192


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


CONTROL = ("cond", "while", "scan")
# decompositions: cuSOLVER through CuPy (the NumPy implementation dispatches to
# cupy.linalg for CuPy arrays), NumPy on the host shim
SOLVER = {"linalg_solve", "cholesky", "eigh", "svd", "qr", "slogdet"}


class SolverStep(HostStep):
    """A dense decomposition/solve: cuSOLVER via CuPy on a GPU, else the host."""


class _EwGroup:
    def __init__(self, shape):
        self.shape = shape
        self.outputs = []


class _RowGroup:
    def __init__(self, eqn):
        self.reductions = [eqn]
        self.elem_outputs = []
        self.row_outputs = []
        x_shape = eqn.inputs[0].aval.shape
        self.x_shape = x_shape
        self.rows = x_shape[:-1]


def _renders_inputs(eqn):
    name = eqn.primitive.name
    return (
        ck.is_fusible(eqn) or name in ck.REDUCTIONS or name in ck.CUMULATIVE or name in ck.SCATTERS
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
    name = eqn.primitive.name
    if name in CONTROL and all(
        _supported_aval(v.aval) for v in list(eqn.inputs) + list(eqn.outputs)
    ):
        return "control"
    if not _supported(eqn):
        return "host"
    if ck.is_fusible(eqn):
        return "fuse"
    if name in ck.REDUCTIONS and eqn.params["axes"] and ck.size_of(eqn.outputs[0].aval.shape):
        return "reduce"
    if name in ck.CUMULATIVE and ck.size_of(eqn.inputs[0].aval.shape):
        return "scan"
    if name in ck.SCATTERS:
        return "scatter"
    if name == "dot_general":
        return "blas"
    if name == "sort" and 0 < eqn.inputs[0].aval.shape[eqn.params["dimension"]] <= ck.SORT_MAX:
        return "sort"
    if name in SOLVER or getattr(eqn.primitive.impl, "__module__", "") == "fflow.primitives.linalg":
        return "solver"
    return "host"


class Plan:
    """The launch plan of one program."""

    def __init__(self, program):
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
        pending = []  # _EwGroup / _RowGroup / finished steps, in order
        for e in eqns:
            kind = kinds[id(e)]
            out = e.outputs[0] if e.outputs else None
            if kind == "fuse":
                if out in self.inline:
                    continue
                name = e.primitive.name
                if name in ("reshape", "squeeze") and e.inputs[0] not in self.inline:
                    pending.append(AliasStep(out, e.inputs[0]))
                    continue
                last = pending[-1] if pending else None
                if type(last) is _EwGroup and last.shape == out.aval.shape:
                    last.outputs.append(out)
                else:
                    g = _EwGroup(out.aval.shape)
                    g.outputs.append(out)
                    pending.append(g)
            elif kind == "reduce":
                pending.append(self._reduction(e))
            elif kind == "scan":
                pending.append(KernelStep([ck.cumulative_kernel(e, self._inl(), self.wide)]))
            elif kind == "scatter":
                x = e.inputs[0]
                copy = ck.elementwise_kernel(
                    [out], {**self._inl(), out: _Identity(x, out)}, self.wide
                )
                scat = ck.scatter_kernel(e, self._inl(), out, self.wide)
                pending.append(KernelStep([copy, scat], note=e.primitive.name))
            elif kind == "blas":
                pending.append(BlasStep(e))
            elif kind == "control":
                pending.append(ControlStep(e))
            elif kind == "solver":
                pending.append(SolverStep(e))
            elif kind == "sort":
                pending.append(KernelStep([ck.sort_kernel(e, self.wide)]))
            else:
                pending.append(HostStep(e))
        pending = self._merge_rows(pending)
        for item in pending:
            if type(item) is _EwGroup:
                inline = {**self.inline, **{v: self._producer(v) for v in item.outputs}}
                self.steps.append(
                    KernelStep([ck.elementwise_kernel(item.outputs, inline, self.wide)])
                )
            elif type(item) is _RowGroup:
                inline = {
                    **self.inline,
                    **{v: self._producer(v) for v in item.elem_outputs + item.row_outputs},
                }
                kern = ck.row_kernel(
                    item.reductions, item.elem_outputs, item.row_outputs, inline, self.wide
                )
                names = " ".join(e.primitive.name for e in item.reductions)
                self.steps.append(KernelStep([kern], note=f"row-fused: {names}"))
            else:
                self.steps.append(item)
        self.kernels = [k for s in self.steps if type(s) is KernelStep for k in s.kernels]

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
            if e.primitive.name not in ("argmax", "argmin"):
                red = ck.Reduction(e.primitive.name, x.aval.dtype, e.outputs[0].aval.dtype)
                nblocks = min(1024, (ck.size_of(x.aval.shape) + 1023) // 1024)
                acc_dtype = _acc_dtype(red.acc)
                partial = Var(ShapedArray((nblocks,), acc_dtype))
                return KernelStep(
                    ck.full_reduce_kernels(e, self.inline, partial, self.wide), note="two-pass"
                )
        if axes == tuple(range(nd - len(axes), nd)):
            return _RowGroup(e)
        nsplit = ck.split_count(e)
        if nsplit > 1:
            red = ck.Reduction(e.primitive.name, x.aval.dtype, e.outputs[0].aval.dtype)
            m = ck.size_of(e.outputs[0].aval.shape)
            partial = Var(ShapedArray((nsplit, m), _acc_dtype(red.acc)))
            kernels = [
                ck.strided_reduce_kernel(e, self.inline, self.wide, partial_var=partial),
                ck.combine_partials_kernel(e, partial, self.wide),
            ]
            return KernelStep(kernels, note=f"split in {nsplit}")
        return KernelStep([ck.strided_reduce_kernel(e, self.inline, self.wide)])

    # -- row fusion ---------------------------------------------------------------------
    def _merge_rows(self, pending):
        out = []
        i = 0
        while i < len(pending):
            item = pending[i]
            i += 1
            if type(item) is not _RowGroup:
                out.append(item)
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
            g.row_outputs = [e.outputs[0] for e in g.reductions] + g.row_outputs
            out.append(g)
        return out

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
            elif name == "broadcast_in_dim":
                (x,) = e.inputs
                bd = tuple(e.params["broadcast_dimensions"])
                if x.aval.shape in (rows, rows + (1,)) and bd == tuple(range(x.aval.ndim)):
                    res = ok(x, "R")
            elif name in ("reshape", "squeeze") and f == "R":
                (x,) = e.inputs
                if x.aval.shape in (rows, rows + (1,)):
                    res = ok(x, "R")
            memo[key] = res
            return res

        return ok(root, form)


def _splat_eqn(v, c):
    from fflow.primitives.shape import broadcast_in_dim_p

    from fflow.core import Eqn

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
        from fflow.primitives.unary import copy_p

        self.primitive = copy_p
        self.inputs = [x]
        self.outputs = [out]
        self.params = {}


def _acc_dtype(ctype):
    return {
        "float": np.float32,
        "double": np.float64,
        "int": np.int32,
        "unsigned int": np.uint32,
        "long long": np.int64,
        "unsigned long long": np.uint64,
    }[ctype]


# -- runtimes -------------------------------------------------------------------------------


class ShimRuntime:
    """Runs plans on the CPU: kernels through the host shim, NumPy matmul for cuBLAS."""

    name = "cuda_shim"

    def __init__(self, device=None):
        self.device = device

    def empty(self, aval):
        from fflow.device import _aligned_copy

        return _aligned_copy(np.empty(aval.shape, aval.dtype))

    def load(self, kernels):
        from fflow.lowering import shim

        return shim.build_many([k.source for k in kernels]) if kernels else {}

    def launch(self, fn, kernel, args):
        fn(_tuple(kernel.grid), (kernel.block,), args)

    def to_runtime(self, value, aval):
        from fflow.device import DeviceBuffer, _aligned_copy

        if type(value) is DeviceBuffer:
            value = value.data
        value = np.asarray(value)
        if value.dtype != aval.dtype:
            value = value.astype(aval.dtype)
        if not value.flags.c_contiguous or value.ctypes.data % 16:
            value = _aligned_copy(value)
        return value

    def to_host(self, value, aval):
        return value

    def from_host(self, host, aval):
        return self.to_runtime(np.asarray(host, aval.dtype), aval)

    def matmul(self, eqn, lhs, rhs):
        return self.to_runtime(eqn.primitive.impl(lhs, rhs, **eqn.params), eqn.outputs[0].aval)

    def solver(self, eqn, args):
        outs = eqn.primitive.impl(*args, **eqn.params)
        return list(outs) if eqn.primitive.multiple_results else [outs]

    def reshape(self, value, shape):
        return value.reshape(shape)

    def wrap(self, value, aval):
        if self.device is None:
            return Array(value, aval.weak_type)
        from fflow.device import DeviceBuffer

        return Array(DeviceBuffer(value, aval.dtype, self.device), aval.weak_type)


_cupy_functions = {}  # (kernel name, device id) -> loaded RawModule function


class CupyRuntime:
    """Runs plans on a GPU: RawModule kernels from the NVRTC cubins, cuBLAS via cupy.matmul."""

    name = "cuda"

    def __init__(self, device):
        from fflow.device import _cupy

        self.cp = _cupy()
        self.device = device

    def empty(self, aval):
        from fflow.device import storage_dtype

        return self.cp.empty(aval.shape, storage_dtype(aval.dtype))

    def load(self, kernels):
        import os
        import tempfile

        from fflow.lowering import nvrtc

        out = {}
        for k in kernels:
            fn = _cupy_functions.get((k.name, self.device.id))
            if fn is not None:
                out[k.name] = fn
                continue
            try:
                cubin = nvrtc.compile_cubin(k.source)
                path = os.path.join(tempfile.gettempdir(), f"{k.name}.cubin")
                with open(path, "wb") as f:
                    f.write(cubin)
                mod = self.cp.RawModule(path=path)
            except nvrtc.NVRTCUnavailable:
                mod = self.cp.RawModule(code=k.source, options=("--std=c++17",))
            out[k.name] = mod.get_function(k.name)
            _cupy_functions[(k.name, self.device.id)] = out[k.name]
        return out

    def launch(self, fn, kernel, args):
        fn(_tuple(kernel.grid), (kernel.block,), tuple(args))

    def to_runtime(self, value, aval):
        from fflow.device import DeviceBuffer, to_device

        if type(value) is DeviceBuffer:
            value = value.data
        if isinstance(value, self.cp.ndarray):
            if not value.flags.c_contiguous or value.data.ptr % 16:
                value = value.copy(order="C")
            return value
        return to_device(np.asarray(value, aval.dtype), self.device).data

    def to_host(self, value, aval):
        host = value.get()
        return host.view(aval.dtype) if host.dtype != aval.dtype else host

    def from_host(self, host, aval):
        return self.to_runtime(np.asarray(host, aval.dtype), aval)

    def matmul(self, eqn, lhs, rhs):
        cp = self.cp
        (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
        la, ra = eqn.inputs[0].aval, eqn.inputs[1].aval
        out_aval = eqn.outputs[0].aval
        lhs, rhs = self._compute(lhs, la.dtype), self._compute(rhs, ra.dtype)
        if np.dtype(out_aval.dtype) == np.float32 and lhs.dtype != cp.float32:
            # a wider result (preferred_element_type): multiply in float32, as NumPy does
            lhs, rhs = lhs.astype(cp.float32), rhs.astype(cp.float32)
        lf = [i for i in range(la.ndim) if i not in lc and i not in lb]
        rf = [i for i in range(ra.ndim) if i not in rc and i not in rb]
        nb = int(np.prod([la.shape[i] for i in lb], dtype=np.int64))
        m = int(np.prod([la.shape[i] for i in lf], dtype=np.int64))
        n = int(np.prod([ra.shape[i] for i in rf], dtype=np.int64))
        kk = int(np.prod([la.shape[i] for i in lc], dtype=np.int64))
        # views where possible: cuBLAS takes transposed operands without a copy
        a = cp.transpose(lhs, list(lb) + lf + list(lc)).reshape(nb, m, kk)
        b = cp.transpose(rhs, list(rb) + list(rc) + rf).reshape(nb, kk, n)
        out = cp.matmul(a[0], b[0]) if nb == 1 else cp.matmul(a, b)  # (batched) GEMM
        out = out.reshape(out_aval.shape)
        return self._store(out, out_aval.dtype)

    def solver(self, eqn, args):
        """cuSOLVER through CuPy: NumPy's linalg functions dispatch on CuPy arrays."""
        if any(np.dtype(v.aval.dtype).itemsize < 4 for v in eqn.inputs if type(v) is Var):
            return None  # no half/bf16 solvers: the host does these
        try:
            outs = eqn.primitive.impl(*args, **eqn.params)
        except (TypeError, ValueError, AttributeError, NotImplementedError):
            return None
        outs = list(outs) if eqn.primitive.multiple_results else [outs]
        return outs if all(isinstance(o, self.cp.ndarray) for o in outs) else None

    def _compute(self, x, dtype):
        if np.dtype(dtype).name == "bfloat16":
            return (x.astype(self.cp.uint32) << 16).view(self.cp.float32)
        return x

    def _store(self, x, dtype):
        cp = self.cp
        if np.dtype(dtype).name == "bfloat16":
            bits = x.astype(cp.float32).view(cp.uint32)
            return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(cp.uint16)
        return x.astype(dtype, copy=False)

    def reshape(self, value, shape):
        return value.reshape(shape)

    def wrap(self, value, aval):
        from fflow.device import DeviceBuffer

        return Array(DeviceBuffer(value, aval.dtype, self.device), aval.weak_type)


# -- executable -----------------------------------------------------------------------------


class Executable:
    """A compiled program: call with Arrays, get a list of Arrays."""

    def __init__(self, program, runtime, verify_nvrtc=False):
        self.program = program
        self.runtime = runtime
        self.plan = Plan(program)
        if verify_nvrtc:
            from fflow.lowering import nvrtc

            sources = [k.source for k in _unique(self.plan.kernels)]
            if sources:  # one NVRTC run for the whole program (the preamble is guarded)
                nvrtc.compile_cubin("\n".join(sources))
        self.consts = None
        self.subs = {}
        self.functions = None  # loaded on the first call (so a test can build many at once)
        self.last_use = _last_use(self.plan.steps, program.outvars)

    @property
    def source(self):
        return plan_text(self.plan)

    def __call__(self, *args):
        rt = self.runtime
        prog = self.program
        vals = [rt.to_runtime(_raw(a), v.aval) for v, a in zip(prog.invars, args)]
        return [rt.wrap(value, v.aval) for value, v in zip(self.run_raw(vals), prog.outvars)]

    def run_raw(self, vals):
        """Run on runtime values (device arrays) -> runtime values."""
        rt = self.runtime
        prog = self.program
        if self.functions is None:
            self.functions = rt.load(_unique(self.plan.kernels))
        if self.consts is None:  # device copies of the constants, made once
            self.consts = [
                (v, rt.to_runtime(_raw(c), v.aval))
                for v, c in zip(prog.constvars, prog.consts)
                if v not in self.plan.inline
            ]
        env = dict(self.consts)
        for v, a in zip(prog.invars, vals):
            env[v] = a
        for i, step in enumerate(self.plan.steps):
            t = type(step)
            if t is KernelStep:
                for k in step.kernels:
                    call_args = []
                    for kind, v in k.args:
                        if kind == "out" and v not in env:
                            env[v] = rt.empty(v.aval)
                        call_args.append(env[v])
                    rt.launch(self.functions[k.name], k, call_args)
            elif t is BlasStep:
                lhs, rhs = (_read(env, v, rt) for v in step.eqn.inputs)
                env[step.eqn.outputs[0]] = rt.matmul(step.eqn, lhs, rhs)
            elif t is AliasStep:
                env[step.out] = rt.reshape(env[step.src], step.out.aval.shape)
            elif t is ControlStep:
                self._control(step.eqn, env)
            elif t is SolverStep:
                self._solver(step.eqn, env)
            else:
                self._host(step.eqn, env)
            for v in self.last_use.get(i, ()):
                env.pop(v, None)
        outs = []
        for v in prog.outvars:
            if type(v) is Literal:
                outs.append(rt.from_host(np.asarray(v.value, v.aval.dtype), v.aval))
            else:
                outs.append(env[v])
        return outs

    def _solver(self, eqn, env):
        args = [_read(env, v, self.runtime) for v in eqn.inputs]
        outs = self.runtime.solver(eqn, args)
        if outs is None:
            return self._host(eqn, env)
        for v, o in zip(eqn.outputs, outs):
            env[v] = self.runtime.to_runtime(o, v.aval)

    def _sub(self, program):
        """The executable of a sub-program (cached on this executable)."""
        hit = self.subs.get(id(program))
        if hit is None:
            hit = self.subs[id(program)] = (program, Executable(_optimize(program), self.runtime))
        return hit[1]

    def _control(self, eqn, env):
        rt = self.runtime
        p = eqn.params
        args = [
            rt.from_host(np.asarray(v.value, v.aval.dtype), v.aval)
            if type(v) is Literal
            else env[v]
            for v in eqn.inputs
        ]
        name = eqn.primitive.name
        if name == "cond":
            index = int(rt.to_host(args[0], eqn.inputs[0].aval))
            branch = p["branches"][min(max(index, 0), len(p["branches"]) - 1)]
            outs = self._sub(branch).run_raw(args[1:])
        elif name == "while":
            nc, nb = p["cond_nconsts"], p["body_nconsts"]
            cconsts, bconsts, carry = args[:nc], args[nc : nc + nb], args[nc + nb :]
            cond, body = self._sub(p["cond_jaxpr"]), self._sub(p["body_jaxpr"])
            pred_aval = p["cond_jaxpr"].out_avals[0]
            while bool(rt.to_host(cond.run_raw(cconsts + carry)[0], pred_aval)):
                carry = body.run_raw(bconsts + carry)
            outs = carry
        else:  # scan
            body = self._sub(p["jaxpr"])
            nconst, ncarry, length = p["num_consts"], p["num_carry"], p["length"]
            consts, carry = args[:nconst], args[nconst : nconst + ncarry]
            xs = args[nconst + ncarry :]
            x_avals = p["jaxpr"].in_avals[nconst + ncarry :]
            ys = [rt.empty(v.aval) for v in eqn.outputs[ncarry:]]
            order = range(length - 1, -1, -1) if p.get("reverse") else range(length)
            for i in order:
                step_in = [rt.to_runtime(x[i], a) for x, a in zip(xs, x_avals)]
                out = body.run_raw(consts + carry + step_in)
                carry = out[:ncarry]
                for buf, y in zip(ys, out[ncarry:]):
                    buf[i] = y
            outs = carry + ys
        for v, o in zip(eqn.outputs, outs):
            env[v] = o

    def _host(self, eqn, env):
        rt = self.runtime
        vals = [
            np.asarray(v.value, v.aval.dtype) if type(v) is Literal else rt.to_host(env[v], v.aval)
            for v in eqn.inputs
        ]
        with core.set_current_trace(root_trace):
            outs = eqn.primitive.bind(*[Array(x) for x in vals], **eqn.params)
        outs = outs if eqn.primitive.multiple_results else [outs]
        for v, o in zip(eqn.outputs, outs):
            env[v] = rt.from_host(np.asarray(o), v.aval)


def _tuple(grid):
    return grid if isinstance(grid, tuple) else (grid,)


def _raw(x):
    return x._value if type(x) is Array else x


def _read(env, v, rt):
    if type(v) is Literal:
        return np.asarray(v.value, v.aval.dtype)
    return env[v]


def _unique(kernels):
    seen = {}
    for k in kernels:
        seen.setdefault(k.name, k)
    return list(seen.values())


def _last_use(steps, outvars):
    keep = {v for v in outvars if type(v) is Var}
    last = {}
    for i, s in enumerate(steps):
        for v in list(s.reads) + list(s.writes):
            last[v] = i
    out = {}
    for v, i in last.items():
        if v not in keep:
            out.setdefault(i, []).append(v)
    # an alias shares its source's buffer: keep the source while any alias lives
    return out


def plan_text(plan):
    """The launch plan and the generated CUDA sources, for `jit(f).lower(...).as_text()`."""
    lines = ["# CUDA launch plan"]
    names = {}

    def nm(v):
        if type(v) is Literal:
            return repr(v.value)
        if v not in names:
            names[v] = f"%{len(names)}"
        return f"{names[v]}:{v.aval.str_short()}"

    for v in plan.program.invars:
        nm(v)
    for i, s in enumerate(plan.steps):
        t = type(s)
        if t is KernelStep:
            for k in s.kernels:
                ins = ", ".join(nm(v) for kind, v in k.args if kind == "in")
                outs = ", ".join(nm(v) for kind, v in k.args if kind == "out")
                lines.append(
                    f"{i:3d} kernel {k.name} grid={_tuple(k.grid)} block=({k.block},) "
                    f"read={k.bytes_read}B written={k.bytes_written}B  ({ins}) -> ({outs})"
                    + (f"  [{s.note}]" if s.note else "")
                )
        elif t is BlasStep:
            e = s.eqn
            lines.append(
                f"{i:3d} cublas gemm (batched) {e.params['dimension_numbers']}  "
                f"({', '.join(nm(v) for v in e.inputs)}) -> {nm(e.outputs[0])}"
            )
        elif t is AliasStep:
            lines.append(f"{i:3d} view reshape {nm(s.src)} -> {nm(s.out)}")
        elif t is SolverStep:
            e = s.eqn
            lines.append(
                f"{i:3d} cusolver {e.primitive.name}  ({', '.join(nm(v) for v in e.inputs)}) -> "
                f"({', '.join(nm(v) for v in e.outputs)})"
            )
        else:
            e = s.eqn
            lines.append(
                f"{i:3d} host {e.primitive.name}  ({', '.join(nm(v) for v in e.inputs)}) -> "
                f"({', '.join(nm(v) for v in e.outputs)})"
            )
    lines.append("# outputs: " + ", ".join(nm(v) for v in plan.program.outvars))
    for k in _unique(plan.kernels):
        lines.append(f"\n// ---- {k.name} ----")
        lines.append(k.source[len(PREAMBLE) :] if k.source.startswith(PREAMBLE) else k.source)
    return "\n".join(lines)


def _optimize(program):
    try:
        from fflow.lowering import passes

        program, _ = passes.optimize(program)
    except ImportError:  # pragma: no cover - passes ship with fflow
        pass
    return program


compile_count = 0  # programs compiled by this backend (tests check it was used)


def compile_program(program, donate=(), backend="cuda_shim", device=None, verify_nvrtc=None):
    """Compile `program` for the CUDA backend: "cuda" (CuPy on `device`) or "cuda_shim".

    `verify_nvrtc` (default: on for the shim when libnvrtc loads) also compiles every
    kernel to an sm_90 cubin, so a kernel that runs on the shim also builds for the GPU.
    """
    global compile_count
    compile_count += 1
    program = _optimize(program)
    if backend == "cuda":
        if device is None:
            from fflow.device import devices

            device = devices("gpu")[0]
        runtime = CupyRuntime(device)
        verify = False
    else:
        runtime = ShimRuntime(device)
        if verify_nvrtc is None:
            from fflow.lowering import nvrtc

            verify_nvrtc = nvrtc.available()
        verify = verify_nvrtc
    return Executable(program, runtime, verify_nvrtc=verify)


_eager_cache = {}


def eager(prim, args, params, device):
    """Run one primitive on device arrays (a cached one-equation program)."""
    from fflow.transforms.staging import trace_to_program

    from fflow.device import DeviceBuffer

    avals = []
    for a in args:
        if type(a) is Array:
            avals.append(a.aval)
        else:
            avals.append(core.aval_of_value(a))
    try:
        key = (prim, _freeze(params), tuple(avals), device)
        hash(key)
    except TypeError:
        key = None
    exe = _eager_cache.get(key) if key is not None else None
    if exe is None:

        def fun(*xs):
            out = prim.bind(*xs, **params)
            return list(out) if prim.multiple_results else [out]

        program = trace_to_program(fun, avals, parent=root_trace)
        backend = "cuda" if device.platform == "gpu" else "cuda_shim"
        exe = compile_program(program, backend=backend, device=device, verify_nvrtc=False)
        if key is not None:
            _eager_cache[key] = exe
    vals = []
    for a in args:
        if type(a) is Array and type(a._value) is DeviceBuffer:
            vals.append(a)
        else:
            vals.append(Array(np.asarray(a)) if type(a) is not Array else a)
    outs = exe(*vals)
    return outs if prim.multiple_results else outs[0]


def _freeze(x):
    if isinstance(x, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple)):
        return tuple(_freeze(v) for v in x)
    if isinstance(x, np.ndarray):
        return (x.dtype.str, x.shape, x.tobytes())
    return x
