"""NumPy code generation: one Python function of NumPy calls per program.

`compile_program(program, donate)` runs the shared passes (DCE, folding, CSE,
fusion grouping, liveness), renders the schedule as Python source and `exec`s it
once. The generated function takes the program's flat input `Array`s and returns
its output `Array`s; it is what a jitted function calls on a cache hit.

Rules of the rendering:

* an equation with a row in `ROWS` (lowering/numpy_rows.py) is rendered by it, an
  elementwise one as the NumPy ufunc that is its implementation; every other primitive
  calls its own `impl` (the reference), so every primitive works and gives the
  eager numbers;
* a value is written in place (`out=`, in-place scatter) only when the buffer
  was allocated by this function (or donated and not shared, checked at run time
  by reference count), has the right shape/dtype and — counting every view of
  it — is dead afterwards; input buffers are never written otherwise (they may be
  read-only zero-stride views);
* fused elementwise groups reuse their temporaries in place; large ones with
  transcendental functions become one native C loop (lowering/native.py), very large
  NumPy ones run in row blocks of the leading axis.
"""

import collections
import re
import sys
import weakref

import numpy as np
from fflow.lowering import cpu_casts, cpu_gemm, cpu_rows, passes
from fflow.lowering.numpy_rows import ROWS, emit_fallback, row_of
from fflow.lowering.passes import FusionGroup
from fflow.primitives.compare import select_n_p
from fflow.primitives.convert import convert_element_type_p
from fflow.primitives.unary import integer_pow_by_squaring, integer_pow_p

from fflow import threads
from fflow.array import Array
from fflow.core import Literal, Var

CHUNK = 16384  # elements per row block of a chunked fused group (temporaries stay in L2)
# Measured on the 2-core machine: with in-place temporaries, NumPy groups of up to 4M
# float32 run as fast unchunked as in row blocks (the per-block Python cost eats the
# cache gain); only far larger groups are chunked. Large groups with transcendental
# ops become native loops instead (lowering/native.py), which is where the gain is.
CHUNK_MIN_SIZE = 1 << 24


def ufunc_of(prim, dtype=None):
    """The NumPy ufunc that is this elementwise primitive's implementation, or None."""
    if isinstance(prim.impl, np.ufunc):
        return prim.impl
    entry = prim.ufunc  # declared next to the primitive (primitives/unary.py, binary.py)
    if entry is None or dtype is None or np.dtype(dtype).kind not in entry[1]:
        return None
    if np.dtype(dtype).itemsize < 4:  # low precision: the impl's own casting rules
        return None
    return entry[0]


def _ufunc(eqn):
    return ufunc_of(eqn.primitive, eqn.inputs[0].aval.dtype if eqn.inputs else None)


def _supports_out(eqn):
    """Whether the row of this elementwise eqn can write into a given buffer (`out=`)."""
    if eqn.primitive is integer_pow_p:
        return eqn.params["y"] >= 1
    return _ufunc(eqn) is not None


def _sole_refcount_probe():
    # reference count of a buffer held only by its Array and one local variable, as
    # seen from inside a generated function (measured, not assumed)
    ns = {}
    exec("def probe(a0):\n    v0 = a0._value\n    return _rc(v0)\n", {"_rc": sys.getrefcount}, ns)
    return ns["probe"](Array(np.zeros(2)))


_SOLE = None


def _donatable(x):
    """Whether donated input `x` may be overwritten: writeable, not a view, not shared."""
    return type(x) is np.ndarray and x.base is None and x.flags.writeable


_BODY_CACHE = weakref.WeakKeyDictionary()  # body program -> its compiled kernel


def body_kernel(program):
    """A raw (NumPy in, NumPy out) compiled kernel for a closed body program (the rows of
    cond/while/scan/calls reach it as `ctx.body_kernel`, so numpy_rows imports no backend)."""
    hit = _BODY_CACHE.get(program)
    if hit is not None:
        return hit
    if program.constvars:
        consts = [np.asarray(c) for c in program.consts]
        closed = program.replace(
            invars=list(program.constvars) + list(program.invars), constvars=[], consts=[]
        )
        inner = compile_program(closed, name="body", raw=True)

        def kernel(*args):
            return inner(*consts, *args)

        kernel.source = inner.source
    else:
        kernel = compile_program(program, name="body", raw=True)
    _BODY_CACHE[program] = kernel
    return kernel


class _Ctx:
    """State of one rendering: names, globals, lines, ownership of buffers."""

    body_kernel = staticmethod(body_kernel)

    def __init__(self, program, steps, live, donate):
        self.program = program
        self.steps = steps
        self.live = live
        self.names = {}
        # a module name of fflow's: NumPy's inf/nan RuntimeWarnings from kernels are hidden
        self.globals = {"np": np, "Array": Array, "__name__": "fflow.lowering.generated"}
        self.lines = []
        self.fresh = set()  # vars whose buffer this function allocated
        self.donated = {}  # donated invar -> name of its runtime "may overwrite" flag
        self.outset = {v for v in program.outvars if type(v) is Var}
        self._gid = 0
        self.donate = donate
        self.splat = {}  # broadcast-scalar constant -> name of its scalar
        self.native_sources = []  # C sources of fused groups compiled to native loops
        self.native_pending = []  # (function, global name, source, pointers) to build
        self.native_ok = True
        self.skip = set()  # ids of steps another step's kernel already computed
        self.gemm_pool = False  # a GEMM runs on fflow's pool: the step times itself
        self.epilogues = []  # GEMM epilogues (lowering/cpu_epilogue.py)
        self.row_groups = []  # row groups (lowering/cpu_rows.py)
        self.moved = {}  # value -> step index it is computed at, when a kernel moved it up
        self.const_values = {}  # constvar -> its value
        # broadcast_in_dim result -> (its source as NumPy broadcasting reads it, shape)
        self.implicit = {}
        self.reshaped = {}  # reshape result -> its input
        self.pure = []  # values (or flag names) whose line has no effect: dropped unread

    def name(self, v):
        if type(v) is Literal:
            return self.literal(v)
        n = self.names.get(v)
        if n is None:
            n = f"v{len(self.names)}"
            self.names[v] = n
        return n

    def literal(self, lit, as_array=False):
        dtype = lit.aval.dtype
        value = np.asarray(lit.value, dtype)
        if as_array:
            return self.const(value, "L")
        return self.const(dtype.type(value[()]) if value.ndim == 0 else value, "L")

    def const(self, value, prefix="g"):
        name = f"{prefix}{self._gid}"
        self._gid += 1
        self.globals[name] = value
        return name

    def emit(self, line, indent=1):
        self.lines.append("    " * indent + line)

    def arg(self, v, as_array=False):
        """How an input appears in a call (literals as scalars or 0-d arrays)."""
        if type(v) is Literal:
            return self.literal(v, as_array)
        return self.name(v)

    def ew_args(self, eqn, chunk_names=None):
        """Arguments of an elementwise call: scalars where another operand has the shape."""
        shape = eqn.outputs[0].aval.shape
        full = any(
            type(v) is Var and v not in self.splat and v.aval.shape == shape for v in eqn.inputs
        )
        args = []
        for v in eqn.inputs:
            if chunk_names is not None and v in chunk_names:
                args.append(chunk_names[v])
            elif type(v) is Literal:
                args.append(self.literal(v, as_array=not full))
            elif v in self.splat and full:
                args.append(self.splat[v])
            else:
                args.append(self.name(v))
        if self.implicit and _ufunc(eqn) is not None:
            self._read_sources(eqn, args, full)
        return args

    def _read_sources(self, eqn, args, full):
        """Broadcast inputs read as their sources where the ufunc's own broadcasting
        gives the same result shape: the same elements meet in the same inner loops
        (a broadcast axis has stride 0 either way), so the numbers are the same."""
        shape = tuple(eqn.outputs[0].aval.shape)
        shapes = [
            () if (type(v) is Var and v in self.splat and full) else v.aval.shape
            for v in eqn.inputs
        ]
        for k, v in enumerate(eqn.inputs):
            if type(v) is Var and v in self.implicit:
                src, src_shape = self.implicit[v]
                trial = shapes[:k] + [src_shape] + shapes[k + 1 :]
                if np.broadcast_shapes(*trial) == shape:
                    shapes, args[k] = trial, src

    def inplace_target(self, step_index, eqn_out, candidates):
        """An input whose buffer may hold `eqn_out`: (name, condition or None) or None."""
        aval = eqn_out.aval
        if aval.ndim == 0:
            return None
        for v in candidates:
            if type(v) is not Var or v.aval.shape != aval.shape or v.aval.dtype != aval.dtype:
                continue
            if v in self.outset or not self.live.buffer_dead_after(v, step_index):
                continue
            if v in self.fresh:
                return self.name(v), None
            if v in self.donated:
                return self.name(v), self.donated[v]
        return None


# -- rows: eqn -> source -------------------------------------------------------------


def ufunc_expr(ctx, eqn, args, out=None, cond=None):
    """`np.ufunc(args[, out=...])` for an elementwise eqn, or None if it has no row."""
    prim = eqn.primitive
    uf = _ufunc(eqn)
    if uf is None:
        if prim is integer_pow_p:
            target = out if cond is None or out is None else f"{out} if {cond} else None"
            return _integer_pow_expr(ctx, eqn, args, target)
        special = _SPECIAL_ELEMENTWISE.get(prim)
        return special(ctx, eqn, args) if special else None
    name = f"np.{uf.__name__}"
    if out is None:
        return f"{name}({', '.join(args)})"
    target = out if cond is None else f"{out} if {cond} else None"
    return f"{name}({', '.join(args)}, out={target})"


BITSELECT_MIN_SIZE = 4096


def _bitselect(pred, on_true, on_false):
    """`np.where(pred, on_true, on_false)` by bit masks: the same bits, no branches.

    np.where mispredicts a branch per element on irregular masks (ReLU derivatives:
    ~6 ns/element here); selecting through integer masks is several times faster.
    """
    on_true, on_false = np.asarray(on_true), np.asarray(on_false)
    dtype = on_true.dtype
    ui = np.dtype(f"u{dtype.itemsize}")
    mask = pred.astype(ui)
    np.negative(mask, out=mask)  # 1 -> all ones
    out = np.bitwise_and(on_true.view(ui), mask)
    np.invert(mask, out=mask)
    np.bitwise_and(on_false.view(ui), mask, out=mask)
    np.bitwise_or(out, mask, out=out)
    return out.view(dtype)


def _select_expr(ctx, eqn, args):
    which = eqn.inputs[0]
    if len(eqn.inputs) == 3 and which.aval.dtype == np.bool_:
        out = eqn.outputs[0].aval
        if (
            which.aval.shape == out.shape
            and out.size >= BITSELECT_MIN_SIZE
            and out.dtype.kind in "fiu"
            and out.dtype.itemsize in (2, 4, 8)
        ):
            fn = ctx.const(_bitselect, "bitselect")
            return f"{fn}({args[0]}, {args[2]}, {args[1]})"
        return f"np.where({args[0]}, {args[2]}, {args[1]})"
    return None


def _convert_expr(ctx, eqn, args):
    x = eqn.inputs[0]
    new = np.dtype(eqn.params["new_dtype"])
    if x.aval.dtype.kind == "f" and new.kind in "iu":
        return None
    if (x.aval.dtype.name, new.name) in cpu_casts.PAIRS:  # amp's casts: C loops
        return f"{ctx.const(cpu_casts.cast, 'cast')}({args[0]}, {ctx.const(new, 'dt')})"
    return f"{args[0]}.astype({ctx.const(new, 'dt')})"


def _integer_pow_expr(ctx, eqn, args, out=None):
    # the same multiplication tree as the impl (repeated squaring), inline

    y = eqn.params["y"]
    if y < 1:
        return None
    if y == 1:
        return f"np.multiply({args[0]}, 1" + (f", out={out})" if out is not None else ")")
    products = []

    def mul(a, b):
        products.append((a, b))
        return f"np.multiply({a}, {b})"

    expr = integer_pow_by_squaring(args[0], y, mul)
    if out is not None:
        assert expr.endswith(")")
        expr = expr[:-1] + f", out={out})"
    return expr


_SPECIAL_ELEMENTWISE = {
    select_n_p: _select_expr,
    convert_element_type_p: _convert_expr,
    integer_pow_p: _integer_pow_expr,
}


def emit_elementwise(ctx, eqn, i):
    out = eqn.outputs[0]
    if eqn.primitive is convert_element_type_p and (
        eqn.inputs[0].aval.dtype == np.dtype(eqn.params["new_dtype"])
    ):
        ctx.emit(f"{ctx.name(out)} = {ctx.arg(eqn.inputs[0], True)}")
        return
    args = ctx.ew_args(eqn)
    target = None
    if _supports_out(eqn):
        target = ctx.inplace_target(i, out, eqn.inputs)
    if target is None:
        expr = ufunc_expr(ctx, eqn, args)
    else:
        expr = ufunc_expr(ctx, eqn, args, out=target[0], cond=target[1])
    if expr is None:
        return emit_fallback(ctx, eqn, i)
    ctx.emit(f"{ctx.name(out)} = {expr}")
    if out.aval.ndim:
        ctx.fresh.add(out)


def emit_eqn(ctx, eqn, i):
    row = row_of(eqn.primitive)
    if row is not None:
        return row(ctx, eqn, i)
    if passes.is_fusible(eqn):
        return emit_elementwise(ctx, eqn, i)
    return emit_fallback(ctx, eqn, i)


# -- fused groups -------------------------------------------------------------------


def emit_group(ctx, group, i):
    """A fused elementwise group: temporaries reused in place, chunked when large."""
    if group.size >= native_arith_min_size() and ctx.native_ok:
        from fflow.lowering import native  # the C compiler path

        if (
            native.enabled()
            and native.worth_native(group)
            and native.emit_native_group(ctx, group, i)
        ):
            return
    rows = _chunk_rows(group)
    if rows is not None and _chunkable(group):
        return emit_chunked_group(ctx, group, i, rows)
    internal_last = {}
    for k, e in enumerate(group.eqns):
        for v in e.inputs:
            if type(v) is Var:
                internal_last[v] = k
    produced = set()
    for k, e in enumerate(group.eqns):
        out = e.outputs[0]
        target = None
        if _supports_out(e) and out.aval.ndim:
            for v in e.inputs:
                if (
                    v in produced
                    and v in ctx.fresh
                    and internal_last[v] == k
                    and v.aval.dtype == out.aval.dtype
                    and v.aval.shape == out.aval.shape
                ):
                    target = (ctx.name(v), None)
                    break
            if target is None and e is group.root:
                target = ctx.inplace_target(i, out, [v for v in e.inputs if v not in produced])
            elif target is None:
                ext = [v for v in e.inputs if v not in produced]
                # an external input may be overwritten only if no later member reads it
                ext = [v for v in ext if not any(v in f.inputs for f in group.eqns[k + 1 :])]
                target = ctx.inplace_target(i, out, ext)
        emit_one = _emit_member(ctx, e, target)
        if not emit_one:
            emit_fallback(ctx, e, i)
        elif out.aval.ndim:
            ctx.fresh.add(out)
        produced.add(out)


def _emit_member(ctx, e, target):
    args = ctx.ew_args(e)
    if target is None:
        expr = ufunc_expr(ctx, e, args)
    else:
        expr = ufunc_expr(ctx, e, args, out=target[0], cond=target[1])
    if expr is None:
        return False
    ctx.emit(f"{ctx.name(e.outputs[0])} = {expr}")
    return True


def _chunkable(group):
    for e in group.eqns:
        if not _supports_out(e):
            return False
        for v in e.inputs:
            if type(v) is Var and v.aval.shape not in ((), group.shape):
                return False
    return True


def native_arith_min_size():
    from fflow.lowering.native import ARITH_MIN_SIZE  # the C compiler path

    return ARITH_MIN_SIZE


def _chunk_rows(group):
    """Rows of the leading axis per chunk, or None when the group is not worth chunking."""
    shape = group.shape
    if len(shape) == 0 or group.size < CHUNK_MIN_SIZE:
        return None
    inner = int(np.prod(shape[1:], dtype=np.int64))
    rows = max(1, CHUNK // max(inner, 1))
    return rows if rows < shape[0] else None


def emit_chunked_group(ctx, group, i, rows):
    """Run the group over row blocks of the leading axis; temporaries stay in cache.

    Slicing rows works for any memory layout (no flattening copies).
    """
    root = group.outputs[0]
    out = ctx.name(root)
    n0 = group.shape[0]
    target = ctx.inplace_target(i, root, group.inputs)
    if target is not None and target[1] is None:
        ctx.emit(f"{out} = {target[0]}")
    else:
        dt = ctx.const(root.aval.dtype, "dt")
        alloc = f"np.empty({group.shape}, {dt})"
        if target is not None:
            alloc = f"{target[0]} if {target[1]} else {alloc}"
        ctx.emit(f"{out} = {alloc}")
    # temporaries: one row-block buffer per live value, reused once it is dead
    last = {}
    for k, e in enumerate(group.eqns):
        for v in e.inputs:
            last[v] = k
    pool = {}
    bufs = []
    assign = {}
    for k, e in enumerate(group.eqns[:-1]):
        o = e.outputs[0]
        free = pool.setdefault(o.aval.dtype, [])
        if free:
            assign[o] = free.pop()
        else:
            b = f"_t{len(bufs)}_{ctx._gid}"
            bufs.append((b, o.aval.dtype))
            assign[o] = b
        for v in e.inputs:
            if v in assign and last[v] == k and v is not o:
                pool.setdefault(v.aval.dtype, []).append(assign[v])
    block = (rows,) + tuple(group.shape[1:])
    for b, dt in bufs:
        ctx.emit(f"{b} = np.empty({block}, {ctx.const(dt, 'dt')})")
    ctx.emit(f"for _s in range(0, {n0}, {rows}):")
    ctx.emit(f"_e = min(_s + {rows}, {n0})", 2)
    for e in group.eqns:
        args = []
        for v in e.inputs:
            if type(v) is Literal:
                args.append(ctx.literal(v))
            elif v in assign:
                args.append(f"{assign[v]}[:_e - _s]")
            elif v in ctx.splat:
                args.append(ctx.splat[v])
            elif v.aval.shape == ():
                args.append(ctx.name(v))
            else:
                args.append(f"{ctx.name(v)}[_s:_e]")
        dest = f"{out}[_s:_e]" if e is group.root else f"{assign[e.outputs[0]]}[:_e - _s]"
        ctx.emit(f"{ufunc_expr(ctx, e, args, out=dest)}", 2)
    ctx.fresh.add(root)


# -- the compiled function ----------------------------------------------------------


def compile_program(program, donate=(), *, name="fflow_kernel", raw=False, native=True):
    """Compile `program` to a Python function of its input Arrays -> output Arrays.

    With `raw=True` (bodies of control flow) it maps NumPy arrays to NumPy arrays.
    The function carries `.source` (the generated code), `.program` (after the
    passes), `.steps` (the schedule), `.report` (pass times and counts).
    """
    global _SOLE
    if _SOLE is None:
        _SOLE = _sole_refcount_probe()
        threads.tune_malloc()  # freed temporaries' pages stay mapped between calls
    report = passes.PassReport()
    opt, report = passes.optimize(program, report)
    steps = passes.fusion_groups(opt)
    live = passes.liveness(steps, opt.outvars)
    ctx = _Ctx(opt, steps, live, tuple(donate))
    ctx.native_ok = native
    for v, c in zip(opt.constvars, opt.consts):
        value = c._value if type(c) is Array else np.asarray(c)
        ctx.names[v] = ctx.const(value, "c")
        ctx.const_values[v] = value
        if value.ndim and all(s == 0 for s in value.strides) and value.size:
            # a broadcast scalar: ufuncs get the scalar (same dtype, same numbers, cheaper)
            ctx.splat[v] = ctx.const(value.reshape(-1)[0], "s")
    args = [f"a{k}" for k in range(len(opt.invars))]
    used = set()
    for step in steps:
        used.update(passes.step_inputs(step))
    used.update(v for v in opt.outvars if type(v) is Var)
    for k, v in enumerate(opt.invars):
        if v in used:
            ctx.emit(f"{ctx.name(v)} = a{k}" + ("" if raw else "._value"))
    if donate:
        ctx.globals["_rc"] = sys.getrefcount
        ctx.globals["_donatable"] = _donatable
        for k in donate:
            v = opt.invars[k]
            if v in used and v.aval.ndim and v not in ctx.outset:
                flag = f"own{k}"
                ctx.emit(f"{flag} = _rc({ctx.name(v)}) <= {_SOLE} and _donatable({ctx.name(v)})")
                ctx.donated[v] = flag
                ctx.pure.append(flag)
    for i, step in enumerate(steps):
        if id(step) in ctx.skip:
            continue
        if cpu_rows.emit(ctx, i):  # a layernorm-like chain over rows, in C
            continue
        if type(step) is FusionGroup:
            emit_group(ctx, step, i)
        else:
            emit_eqn(ctx, step, i)
    if ctx.gemm_pool:
        ctx.globals["_par"] = cpu_gemm.parallel  # native loops in chunks on the pool
        # the thread count of this call's large GEMMs, adapted from past calls' wall times
        ctx.globals["_steps"] = cpu_gemm.PooledStep()
        ctx.lines.insert(0, "    _nt, _t0 = _steps.begin()")
        ctx.emit("_steps.end(_nt, _t0)")
    outs = []
    for v in opt.outvars:
        if raw:
            dt = ctx.const(v.aval.dtype, "dt")
            if type(v) is Literal:
                outs.append(f"np.array({ctx.literal(v, True)}, {dt})")
            elif v.aval.ndim == 0:
                outs.append(f"np.asarray({ctx.name(v)}, {dt})")
            else:
                outs.append(ctx.name(v))
            continue
        weak = ", True" if v.aval.weak_type else ""
        if type(v) is Literal:
            outs.append(f"Array(np.asarray({ctx.literal(v, True)}).copy(){weak})")
        else:
            src = _array_name(ctx, v)
            if v.aval.ndim == 0:
                src = f"np.asarray({src}, {ctx.const(v.aval.dtype, 'dt')})"
            outs.append(f"Array({src}{weak})")
    ctx.emit(f"return [{', '.join(outs)}]")
    _drop_unread(ctx)
    if ctx.native_pending:
        from fflow.lowering import native as native_mod  # the C compiler path

        if not native_mod.build_library(ctx):  # no working compiler: NumPy groups
            return compile_program(program, donate, name=name, raw=raw, native=False)
    source = f"def {name}({', '.join(args)}):\n" + "\n".join(ctx.lines) + "\n"
    code = compile(source, f"<fflow generated {name}>", "exec")
    exec(code, ctx.globals)
    fn = ctx.globals[name]
    fn.source = source
    fn.program = opt
    fn.steps = steps
    fn.report = report
    fn.liveness = live
    fn.native_sources = ctx.native_sources
    fn.epilogues = ctx.epilogues  # the fused GEMM epilogues, one per product
    fn.row_groups = ctx.row_groups  # the row groups (layernorm-like chains)
    return fn


def _drop_unread(ctx):
    """Remove the lines of `ctx.pure` (views: `np.broadcast_to` read as their sources by
    every ufunc, reshapes, transposes; donation flags) whose name no other line reads,
    the later ones first (they may be all that reads an earlier one)."""
    word = re.compile(r"\b(?:v|own)\d+\b")
    found = [word.findall(line) for line in ctx.lines]
    reads = collections.Counter(n for names in found for n in names)
    at = {
        names[0]: k
        for k, names in enumerate(found)
        if names and ctx.lines[k].startswith(f"    {names[0]} = ")
    }
    drop = set()
    for v in reversed(ctx.pure):
        name = v if type(v) is str else ctx.names[v]
        k = at.get(name)
        if k is not None and reads[name] == 1:  # 1: its own definition
            drop.add(k)
            reads.subtract(found[k])
    ctx.lines[:] = [line for k, line in enumerate(ctx.lines) if k not in drop]


def _array_name(ctx, v):
    return ctx.name(v)


__all__ = ["compile_program", "ROWS", "ufunc_of", "CHUNK"]
