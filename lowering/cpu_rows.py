"""Row groups on the CPU: chains of elementwise steps and sums over the last axis
(layernorm forward and backward, RMS norms, standardisation) as one native loop
over rows.

NumPy runs a layernorm as ~8 passes over the tensor (sum, subtract, square, sum,
divide, ...), each a separate call with its own temporaries; the backward pass as
~12. Here every step of such a chain becomes one statement of a C loop nest over
the rows: a row (the last axis, C elements) stays in L1 while the chain runs over
it, full-row temporaries live in a per-row scratch buffer, row statistics in
registers, and only the values other steps read are written out.

A group starts at a step whose shape is the "full" shape (P..., C) and collects the
following steps (within `WINDOW`) that read a value of the group and are:
elementwise over the full shape or over the row shape (P...) / (P..., 1); a
`reduce_sum` over the last axis; or a reshape / broadcast of a row value (those are
read through: they stay as NumPy views for the steps outside the group). Their
other inputs must exist before the group starts: full or row values, scalars,
vectors broadcast along the last axis (a gain or bias), literals. A group holds at
least one sum. Sums accumulate in double (NumPy's float32 pairwise sum is within a
few ulp of it); every other operation is NumPy's IEEE operation (no FMA contraction,
lowering/native.py's renderer), transcendental ones over full rows only from
`native.NATIVE_MIN_SIZE` elements, as native groups.
"""

import ctypes

import numpy as np
from fflow.lowering.cpu_epilogue import step_index
from fflow.lowering.schedule import FusionGroup, is_fusible
from fflow.primitives.reduction import reduce_sum_p
from fflow.primitives.shape import broadcast_in_dim_p, reshape_p

from fflow.core import Literal, Var

WINDOW = 40  # steps searched after the first one (a layernorm backward is ~20)
MAX_ROW = 1 << 16  # longest row (elements) a group takes: its scratch is per row


class RowGroup:
    """A compiled row group (for tests and `Lowered` text): its steps' primitives."""

    __slots__ = ("members", "rows", "cols")

    def __init__(self, members, rows, cols):
        self.members, self.rows, self.cols = members, rows, cols

    def __repr__(self):
        return f"RowGroup[{' '.join(self.members)}] {self.rows}x{self.cols}"


def _index(ctx):
    return step_index(ctx, "_rows_index")


def _full_shape(step):
    if type(step) is FusionGroup:
        return tuple(step.shape)
    if step.primitive is reduce_sum_p:
        shape = tuple(step.inputs[0].aval.shape)
        return shape if tuple(step.params["axes"]) == (len(shape) - 1,) else None
    if is_fusible(step):
        return tuple(step.outputs[0].aval.shape)
    return None


class _Builder:
    """The statements of one row group, built step by step (None when a step has no
    C form: the step is left out)."""

    def __init__(self, ctx, full, at):
        from fflow.lowering import native  # the C compiler path

        self.native, self.ctx, self.full, self.at = native, ctx, full, at
        self.cols = full[-1]
        self.rows = int(np.prod(full[:-1], dtype=np.int64))
        self.row_shapes = {full[:-1], full[:-1] + (1,)}
        self.names = {}  # value -> ("full", C array name) | ("row", C scalar name)
        self.ptrs = []  # (kind, value): "full", "row", "vec", "scalar", "out", "rowout"
        self.ptr_of = {}
        self.code = []  # statements inside the row loop
        self.used_math = set()
        self.temps = 0  # full-row scratch rows
        self.made, self.uses = _index(ctx)
        self.prod = native._producers(ctx)

    def kind(self, v):
        s = tuple(v.aval.shape)
        if s == self.full:
            return "full"
        if s in self.row_shapes:
            return "row"
        return "scalar" if s == () else None

    def available(self, v):
        made = self.ctx.moved.get(v, self.made.get(v, -1))
        return type(v) is Literal or made < self.at

    def pointer(self, kind, v):
        key = (kind, v)
        if key not in self.ptr_of:
            ct = self.native._CTYPES.get(v.aval.dtype)
            if ct is None:
                return None
            k = len(self.ptrs)
            self.ptrs.append(key)
            self.ptr_of[key] = f"p{k}"
            if kind == "scalar":
                self.code.insert(0, f"const {ct} p{k} = *(const {ct}*)a[{k}];")
                self.ptr_of[key] = f"p{k}"
        return self.ptr_of[key]

    def through(self, v):
        """`v`, or the group's row value it reshapes or broadcasts along the row."""
        seen = v
        while type(v) is Var and v not in self.names:
            e = self.prod.get(v)
            if e is None or not e.inputs or type(e.inputs[0]) is not Var:  # (iota: none)
                break
            if e.primitive is reshape_p and self.kind(v) == self.kind(e.inputs[0]) == "row":
                v = e.inputs[0]
                continue
            src = self.native.broadcast_source(e, self.full)
            if src is not None and src[0] == "col" and src[2] == self.rows:
                v = src[1]
                continue
            break
        return v if v in self.names else seen

    def source(self, u):
        """An available value read through reshapes (same elements, same order)."""
        while type(u) is Var and not self.available(u):
            e = self.prod.get(u)
            if e is None or e.primitive is not reshape_p:
                return None
            u = e.inputs[0]
        return u

    def read(self, v, in_loop):
        """C expression reading `v` inside the row loop (`in_loop`: inside the loop
        over the row's elements, index c), or None."""
        if type(v) is Literal:
            ct = self.native._CTYPES.get(v.aval.dtype)
            value = np.asarray(v.value, v.aval.dtype)
            return None if ct is None else self.native._literal(value, ct)
        v = self.through(v)
        if v in self.names:
            kind, name = self.names[v]
            if kind == "full":
                return f"{name}[c]" if in_loop else None
            return name
        kind = self.kind(v)
        src = self.native.broadcast_source(self.prod.get(v), self.full)
        u = None if src is None else self.source(src[1])
        if u is not None and kind == "full":  # a broadcast made before or in the group
            if src[0] == "row" and src[2] == self.cols:
                p = self.pointer("vec", u)
                return p and (f"{p}[c]" if in_loop else None)
            if src[0] == "col" and src[2] == self.rows:
                p = self.pointer("row", u)
                return p and f"{p}[r]"
        if not self.available(v):
            return None
        if kind == "scalar" or v in self.ctx.splat:
            return self.pointer("scalar", v)
        if kind == "full":
            p = self.pointer("full", v)
            return p and (f"{p}[r * {self.cols}L + c]" if in_loop else None)
        if kind == "row":
            p = self.pointer("row", v)
            return p and f"{p}[r]"
        return None

    def add(self, step):
        """Add `step` to the group: True, or False (left out, nothing changed)."""
        mark = (len(self.ptrs), dict(self.ptr_of), list(self.code), set(self.used_math))
        ok = self._add(step)
        if not ok:
            self.ptrs = self.ptrs[: mark[0]]
            self.ptr_of, self.code, self.used_math = mark[1], mark[2], mark[3]
        return ok

    def _add(self, step):
        n = len(self.code)
        if type(step) is not FusionGroup and step.primitive is reduce_sum_p:
            (x,) = step.inputs
            out = step.outputs[0]
            if _full_shape(step) != self.full or out.aval.dtype.kind != "f":
                return False
            src = self.read(x, True)
            ct = self.native._CTYPES.get(out.aval.dtype)
            if src is None or ct is None:
                return False
            self.code += [
                f"double a{n} = 0;",
                "#pragma omp simd reduction(+:a" + str(n) + ")",
                f"for (long c = 0; c < {self.cols}L; c++) a{n} += (double){src};",
                f"{ct} u{n} = ({ct})a{n};",
            ]
            self.names[out] = ("row", f"u{n}")
            return True
        eqns = step.eqns if type(step) is FusionGroup else [step]
        kind = self.kind(step.outputs[0])
        if kind not in ("full", "row"):
            return False
        full = kind == "full"
        transcendental = any("transcendental" in e.primitive.traits for e in eqns)
        if full and transcendental and self.rows * self.cols < self.native.NATIVE_MIN_SIZE:
            return False
        local, body = {}, []
        for k, e in enumerate(eqns):
            args = []
            for v in e.inputs:
                a = local.get(v) if type(v) is Var else None
                a = a or self.read(v, full)
                if a is None:
                    return False
                args.append(a)
            expr = self.native._render_eqn(e, args, self.used_math)
            ct = self.native._CTYPES.get(e.outputs[0].aval.dtype)
            if expr is None or ct is None:
                return False
            body.append(f"{ct} e{n}_{k} = {expr};")
            local[e.outputs[0]] = f"e{n}_{k}"
        root = step.outputs[0]
        ct = self.native._CTYPES[root.aval.dtype]
        if full:
            name = f"t{n}"
            self.code.append(f"{ct} *{name} = ({ct}*)scr{self.temps};")
            self.temps += 1
            self.code += ["#pragma omp simd", f"for (long c = 0; c < {self.cols}L; c++) {{"]
            self.code += ["  " + line for line in body] + [f"  {name}[c] = {local[root]};", "}"]
            self.names[root] = ("full", name)
        else:
            self.code += body
            self.names[root] = ("row", local[root])
        return True


def find(ctx, i):
    """The row group starting at step `i`: (builder, member steps), or None."""
    from fflow.lowering import native  # the C compiler path

    step = ctx.steps[i]
    full = _full_shape(step)
    if (
        not ctx.native_ok
        or full is None
        or len(full) < 2
        or not 8 <= full[-1] <= MAX_ROW
        or int(np.prod(full, dtype=np.int64)) < native.ARITH_MIN_SIZE
        or not native.enabled()
    ):
        return None
    b = _Builder(ctx, full, i)
    if not b.add(step):
        return None
    members, sums = [step], int(type(step) is not FusionGroup and step.primitive is reduce_sum_p)
    for j in range(i + 1, min(len(ctx.steps), i + 1 + WINDOW)):
        s = ctx.steps[j]
        if id(s) in ctx.skip:
            continue
        eqns = s.eqns if type(s) is FusionGroup else [s]
        independent_sum = (
            type(s) is not FusionGroup
            and s.primitive is reduce_sum_p
            and _full_shape(s) == full
            and b.available(s.inputs[0])
        )  # a row sum of a value made before the group (an epilogue's output)
        reads = any(type(v) is Var and b.through(v) in b.names for e in eqns for v in e.inputs)
        if not reads and not independent_sum:
            continue
        if type(s) is not FusionGroup and s.primitive in (reshape_p, broadcast_in_dim_p):
            continue  # read through (a broadcast of a row value reads the row value)
        if b.add(s):
            members.append(s)
            sums += type(s) is not FusionGroup and s.primitive is reduce_sum_p
    if not sums or len(members) < 3:
        return None
    return b, members


def emit(ctx, i):
    """Emit the row group starting at step `i` into the program; False if none."""
    found = find(ctx, i)
    if found is None:
        return False
    b, members = found
    native = b.native
    mine = {id(s) for s in members}
    # reshapes and broadcasts that only the group read go too (it reads their sources)
    last = max(b.made[s.outputs[0]] for s in members)
    for k in range(last, i, -1):
        s = ctx.steps[k]
        if type(s) is FusionGroup or s.primitive not in (reshape_p, broadcast_in_dim_p):
            continue
        out = s.outputs[0]
        if id(s) not in ctx.skip and out not in ctx.outset and out in b.uses:
            if all(id(ctx.steps[j]) in mine for j in b.uses[out]):
                mine.add(id(s))
                ctx.skip.add(id(s))

    def needed(v):
        return v in ctx.outset or any(id(ctx.steps[k]) not in mine for k in b.uses.get(v, ()))

    # outputs: group values read outside it
    stores = []
    for s in members:
        v = s.outputs[0]
        if not needed(v):
            continue
        kind, name = b.names[v]
        p = b.pointer("out" if kind == "full" else "rowout", v)
        if kind == "full":
            # write the row straight to the output instead of scratch
            head = f"{_ct(b, v)} *{name} ="
            decl = next(k for k, line in enumerate(b.code) if line.startswith(head))
            b.code[decl] = f"{head} {p} + r * {b.cols}L;"
        else:
            stores.append(f"{p}[r] = {name};")
    fname = f"fflow_rows_{len(ctx.native_pending)}"
    decls = []
    for k, (kind, v) in enumerate(b.ptrs):
        ct = native._CTYPES[v.aval.dtype]
        if kind != "scalar":
            const = "" if kind in ("out", "rowout") else "const "
            decls.append(f"  {const}{ct} *p{k} = (void *)a[{k}];")
    scalar_lines = [line for line in b.code if line.startswith("const ") and "*(const" in line]
    body = [line for line in b.code if line not in scalar_lines]
    math = "".join(
        f"#pragma omp declare simd notinbranch\n{ct} {native._fn(f, ct)}({', '.join([ct] * ar)});\n"
        for f, ct, ar in sorted(b.used_math)
    )
    scratch = max(b.temps, 1) * b.cols
    source = (
        "#include <math.h>\n#include <stdlib.h>\n"
        + math
        + f"void {fname}(const long *a, long r0, long r1) {{\n"
        + "\n".join(decls + ["  " + line for line in scalar_lines])
        + f"\n  double *scratch = malloc({scratch}L * sizeof(double));\n  if (!scratch) return;\n"
        + "".join(f"  double *scr{k} = scratch + {k * b.cols}L;\n" for k in range(max(b.temps, 1)))
        + "  for (long r = r0; r < r1; r++) {\n"
        + "\n".join("    " + line for line in body + stores)
        + "\n  }\n  free(scratch);\n}\n"
    )
    ctx.globals["_contig"] = native._contiguous
    ctx.globals["_ad"] = native.address
    exprs = []
    for kind, v in b.ptrs:
        dt = ctx.const(v.aval.dtype, "dt")
        if kind in ("out", "rowout"):
            ctx.emit(f"{ctx.name(v)} = np.empty({tuple(v.aval.shape)}, {dt})")
            ctx.fresh.add(v)
            exprs.append(f"_ad({ctx.name(v)})")
        elif kind == "scalar" and v in ctx.splat:
            buf = np.array([ctx.globals[ctx.splat[v]]], dtype=v.aval.dtype)
            ctx.const(buf, "sbuf")  # kept alive with the kernel
            exprs.append(str(buf.ctypes.data))
        else:
            ctx.emit(f"{ctx.name(v)}_r = _contig({ctx.arg(v, True)}, {dt})")
            exprs.append(f"_ad({ctx.name(v)}_r)")
    kernel = f"native_{fname}"
    argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long]
    ctx.native_pending.append((fname, kernel, source, argtypes))
    ctx.native_sources.append(source)
    ctx.emit(f"{kernel}(_ptrs({', '.join(exprs)},), 0, {b.rows})")
    ctx.globals["_ptrs"] = _ptrs
    for s in members:
        ctx.skip.add(id(s))
        for e in s.eqns if type(s) is FusionGroup else [s]:
            ctx.moved[e.outputs[0]] = i
    what = []
    for s in members:
        what += [e.primitive.name for e in (s.eqns if type(s) is FusionGroup else [s])]
    ctx.row_groups.append(RowGroup(what, b.rows, b.cols))
    return True


def _ct(b, v):
    return b.native._CTYPES[v.aval.dtype]


def _ptrs(*ptrs):
    return (ctypes.c_long * len(ptrs))(*ptrs)
