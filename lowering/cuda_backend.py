"""The CUDA backend: a Program becomes a launch plan of generated kernels and cuBLAS calls.

Planning (no GPU needed): after the shared passes (DCE, constant folding, CSE),
every value is either *inlined* (an elementwise or index-arithmetic equation whose
consumers render it at the index they need) or *materialized* by a step:

* `KernelStep`: generated kernels (cuda_kernels.py) — fused elementwise groups
  (multi-output, one per shape), reductions with their producers fused in, row
  kernels where last-axis reductions and the elementwise work on the same rows
  merge (softmax, log_softmax, layernorm...), scans and scatters;
* `BlasStep`: dot_general as one batched GEMM (cuBLAS through CuPy's matmul);
* `LtStep`: a GEMM whose bias add and relu / gelu (tanh) run in cuBLASLt's epilogue
  (cuda_cublaslt.py); without cuBLASLt, the plain GEMM and a fused epilogue kernel;
* `AliasStep`: reshape of a materialized buffer (no copy);
* `HostStep`: a primitive without a CUDA lowering (sort, control flow,
  collectives) runs its NumPy implementation on host copies.

Execution runs the plan on a runtime: `CupyRuntime` (RawModule from the NVRTC cubin,
cupy.matmul) or `ShimRuntime` (the same kernels through the host shim, NumPy's
matmul standing in for cuBLAS). `compile_program(...).source` shows the CUDA
source and the plan (grid, block, bytes read and written per kernel).
"""

import numpy as np
from fflow.lowering import cuda_cublaslt, cuda_gemm, cuda_graphs, cuda_layout, passes
from fflow.lowering.cuda_plan import (  # noqa: F401  (re-exported)
    CONTROL,
    AliasStep,
    BlasStep,
    ControlStep,
    HostStep,
    KernelStep,
    LtStep,
    Plan,
    SolverStep,
)
from fflow.lowering.cuda_render import PREAMBLE
from fflow.lowering.cuda_runtime import CupyRuntime, ShimRuntime, _tuple  # noqa: F401
from fflow.primitives.control_flow import cond_p, while_p
from fflow.transforms.staging import trace_to_program

from fflow import array as _array
from fflow import core
from fflow.array import Array, root_trace
from fflow.core import Literal, Var
from fflow.device_buffer import DeviceBuffer, devices

# -- executable -----------------------------------------------------------------------------


class Executable:
    """A compiled program: call with Arrays, get a list of Arrays."""

    def __init__(self, program, runtime, verify_nvrtc=False, donate=()):
        self.program = program
        self.runtime = runtime
        self.plan = Plan(program, epilogues=cuda_cublaslt.enabled())
        self.donate = _donatable(self.plan, program, donate)
        if verify_nvrtc:
            from fflow.lowering import nvrtc

            kernels = self.plan.kernels + self.plan.fallback_kernels
            sources = [k.source for k in _unique(kernels)]
            if sources:  # one NVRTC run for the whole program (the preamble is guarded)
                nvrtc.compile_cubin("\n".join(sources))
        self.consts = None
        self.subs = {}
        self.functions = None  # loaded on the first call (so a test can build many at once)
        self.last_use = _last_use(self.plan.steps, program.outvars)
        # CUDA graphs (cuda_graphs.py): None (first call), "warm", then the captured Graph
        self.graph = None
        self.graphs = type(runtime) is CupyRuntime and cuda_graphs.worthwhile(self.plan)

    @property
    def source(self):
        return plan_text(self.plan)

    def __call__(self, *args):
        rt = self.runtime
        prog = self.program
        with rt.scope():
            vals = [rt.to_runtime(_raw(a), v.aval) for v, a in zip(prog.invars, args)]
            # donated device buffers (never a caller's host array) may hold later outputs
            donated = [
                (v, x)
                for i, (v, x, a) in enumerate(zip(prog.invars, vals, args))
                if i in self.donate
                and type(_raw(a)) is DeviceBuffer
                and sum(y is x for y in vals) == 1
            ]
            if self.graphs and not donated and cuda_graphs.enabled():
                outs = cuda_graphs.run(self, vals)  # one graph launch per cache-hit call
            else:
                outs = self._run(vals, donated)
        return [rt.wrap(value, v.aval) for value, v in zip(outs, prog.outvars)]

    def run_raw(self, vals):
        """Run on runtime values (device arrays) -> runtime values."""
        with self.runtime.scope():  # the program's device is current for all of it
            return self._run(vals)

    def _run(self, vals, donated=(), env=None):
        rt = self.runtime
        donated = dict(donated)
        free = {}  # (shape, dtype) -> donated buffers past their last use
        prog = self.program
        if self.functions is None:
            self.functions = rt.load(_unique(self.plan.kernels))
        if self.consts is None:  # device copies of the constants, made once
            self.consts = [
                (v, rt.to_runtime(_raw(c), v.aval))
                for v, c in zip(prog.constvars, prog.consts)
                if v not in self.plan.inline
            ]
        env = {} if env is None else env  # cuda_graphs passes one that keeps every buffer
        env.update(self.consts)
        for v, a in zip(prog.invars, vals):
            env[v] = a
        for i, step in enumerate(self.plan.steps):
            t = type(step)
            if t is KernelStep:
                for j, k in enumerate(step.kernels):
                    call_args = []
                    later = step.kernels[j + 1 :]
                    dying = _dying_donated(k, later, donated, env, self.last_use.get(i, ()))
                    for kind, v in k.args:
                        if kind == "out" and v not in env:
                            key = (v.aval.shape, np.dtype(v.aval.dtype))
                            reuse = free.get(key) or dying.get(key)
                            env[v] = reuse.pop() if reuse else rt.empty(v.aval)
                        call_args.append(env[v])
                    rt.launch(self.functions[k.name], k, call_args)
            elif t is BlasStep:
                lhs, rhs = (_read(env, v, rt) for v in step.eqn.inputs)
                env[step.eqn.outputs[0]] = rt.matmul(step.eqn, lhs, rhs)
            elif t is LtStep:
                self._lt(step, env)
            elif t is AliasStep:
                env[step.out] = rt.reshape(env[step.src], step.out.aval.shape)
            elif t is ControlStep:
                self._control(step.eqn, env)
            elif t is SolverStep:
                self._solver(step.eqn, env)
            else:
                self._host(step.eqn, env)
            for v in self.last_use.get(i, ()):
                buf = env.pop(v, None)
                if v in donated and buf is donated[v]:
                    free.setdefault((v.aval.shape, np.dtype(v.aval.dtype)), []).append(buf)
        outs = []
        for v in prog.outvars:
            if type(v) is Literal:
                outs.append(rt.from_host(np.asarray(v.value, v.aval.dtype), v.aval))
            else:
                outs.append(env[v])
        return outs

    def _lt(self, step, env):
        """GEMM + epilogue in one cuBLASLt call, or the GEMM and the fallback kernels."""
        rt = self.runtime
        lhs, rhs = (_read(env, v, rt) for v in step.eqn.inputs)
        epi = step.epi
        bias = env[epi.bias] if epi.bias is not None else None
        outs = rt.lt_matmul(step, lhs, rhs, bias, env.get(epi.mask) if epi.mask else None)
        if outs is not None:
            env.update(outs)
            return
        q = step.eqn.outputs[0]
        env[q] = rt.matmul(step.eqn, lhs, rhs)
        missing = [k for k in step.fallback if k.name not in self.functions]
        if missing:
            self.functions.update(rt.load(missing))
        for k in step.fallback:
            for kind, v in k.args:
                if kind == "out" and v not in env:
                    env[v] = rt.empty(v.aval)
            rt.launch(self.functions[k.name], k, [env[v] for _, v in k.args])
        for k in step.fallback:
            for kind, v in k.args:
                if kind == "out" and v not in step.writes:
                    env.pop(v, None)  # the partial sums of a split column sum
        del env[q]

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
        prim = eqn.primitive
        if prim is cond_p:
            index = int(rt.to_host(args[0], eqn.inputs[0].aval))
            branch = p["branches"][min(max(index, 0), len(p["branches"]) - 1)]
            outs = self._sub(branch).run_raw(args[1:])
        elif prim is while_p:
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


def _raw(x):
    return x._value if type(x) is Array else x


def _read(env, v, rt):
    if type(v) is Literal:
        return np.asarray(v.value, v.aval.dtype)
    return env[v]


def _dying_donated(kernel, later, donated, env, dying_vars):
    """Donated inputs a pointwise kernel reads for the last time: its outputs may be
    written into them in place (each element is read before the same thread writes it)."""
    if not donated or not kernel.pointwise:
        return {}
    read_later = {v for k in later for _, v in k.args}
    out = {}
    for kind, v in kernel.args:
        if (
            kind == "in"
            and v in donated
            and v in dying_vars
            and v not in read_later
            and env.get(v) is donated[v]
        ):
            out.setdefault((v.aval.shape, np.dtype(v.aval.dtype)), []).append(donated.pop(v))
    return out


def _donatable(plan, program, donate):
    """Indices of donated inputs whose buffers may be reused: not an output, not the
    source of a view (reshape alias) that could outlive it."""
    viewed = {s.src for s in plan.steps if type(s) is AliasStep}
    outs = {v for v in program.outvars if type(v) is Var}
    return {
        i
        for i in donate
        if i < len(program.invars)
        and program.invars[i] not in viewed
        and program.invars[i] not in outs
    }


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
            what = (
                "cublas gemm " + cuda_gemm.describe(e)
                if cuda_gemm.is_16bit(e)
                else f"cublas gemm (batched) {e.params['dimension_numbers']}"
            )
            lines.append(
                f"{i:3d} {what}  ({', '.join(nm(v) for v in e.inputs)}) -> {nm(e.outputs[0])}"
            )
        elif t is LtStep:
            ins = [nm(v) for v in s.eqn.inputs]
            if s.epi.bias is not None:
                ins.append("bias " + nm(s.epi.bias))
            if s.epi.act == "drelu":
                ins.append("relu mask " + nm(s.epi.mask))
            lines.append(
                f"{i:3d} {s.describe()}  ({', '.join(ins)}) -> "
                f"({', '.join(nm(v) for v in s.writes)})  [{s.status}]"
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
    if cuda_graphs.worthwhile(plan):
        n = cuda_graphs.launches(plan)
        lines.append(
            f"# CUDA graph on a GPU: these {n} launch{'es' * (n != 1)} are captured on the "
            "second call; "
            "every later call is one graph launch (cuda_graphs.py)"
        )
    for k in _unique(plan.kernels + plan.fallback_kernels):
        lines.append(f"\n// ---- {k.name} ----" + " (fallback)" * (k not in plan.kernels))
        lines.append(k.source[len(PREAMBLE) :] if k.source.startswith(PREAMBLE) else k.source)
    return "\n".join(lines)


def _optimize(program):
    try:
        program, _ = passes.optimize(program)
    except ImportError:  # pragma: no cover - passes ship with fflow
        pass
    program = cuda_layout.fold_operand_transposes(program)  # cuBLAS reads them as OP_T
    return cuda_layout.relu_masks_from_outputs(program)  # relu(GEMM) fuses into cuBLASLt


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
            device = devices("gpu")[0]
        runtime = CupyRuntime(device)
        verify = False
    else:
        runtime = ShimRuntime(device)
        if verify_nvrtc is None:
            from fflow.lowering import nvrtc

            verify_nvrtc = nvrtc.available()
        verify = verify_nvrtc
    return Executable(program, runtime, verify_nvrtc=verify, donate=donate)


_eager_cache = {}


def eager(prim, args, params, device):
    """Run one primitive on device arrays (a cached one-equation program)."""
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


def _eager_dispatch(prim, args, params):
    """Eager primitives on device arrays: a one-equation program on this backend."""
    for a in args:
        if type(a) is Array and type(a._value) is DeviceBuffer:
            return eager(prim, args, params, a._value.device)
    return NotImplemented


# installed when the backend loads (fflow.device_put of a GPU array loads it)
if _eager_dispatch not in _array.special_dispatch:
    _array.special_dispatch.append(_eager_dispatch)
