"""GEMM epilogues on the CPU: the elementwise steps after a matrix product, in one
pass over its output while it is in cache.

A 2-D `dot_general` (any operand layout; leading dims of the output merge into M)
is followed in the schedule by the steps that read its output: the bias add, the
activation (ReLU, GELU, tanh...), in the backward pass the ReLU mask times the
cotangent and the bias gradient (a sum over every axis but the last), and the SGD
update of a weight from its gradient. Unfused, each is a NumPy or native pass over
the M x N output. Here they become one native loop (`epi(args, r0, r1, c0, c1,
acc)`, rendered into the program's C library), which fflow's GEMM pool (lowering/cpu_gemm.c)
runs on each chunk of the product right after computing it, on the same thread:
several outputs (the pre-activation kept for the backward pass and the activation;
the masked gradient and its column sums) in one pass, the first of them in the
product's own buffer when nothing else reads the product.

A step joins the epilogue ("member") when it is elementwise over the output's shape
and each of its other inputs is a literal, a scalar, a value that exists before the
product, or a broadcast of such a value along rows (a bias) or columns; a
`reduce_sum` over every axis but the last of a member's value joins as a column sum
(accumulated in double per chunk; the pool adds the chunks' sums in chunk order and
`fname_sums` writes them). Steps up to `WINDOW` after the product are searched (SGD
updates sit at the end of a step); a product computed transposed (a weight gradient
of a 3-D activation) takes the steps after its transpose. Members run at the
product's position; their original steps are skipped, and the values they make are
recorded in `ctx.moved` (later fusions treat them as available from there).
Arithmetic is the same IEEE operations as NumPy's (no FMA contraction, as in
lowering/native.py); transcendental members need `native.NATIVE_MIN_SIZE` elements,
as native groups do.
"""

import ctypes

import numpy as np
from fflow.lowering.schedule import FusionGroup, is_fusible
from fflow.primitives.reduction import reduce_sum_p
from fflow.primitives.shape import broadcast_in_dim_p, reshape_p

from fflow.core import Literal, Var

WINDOW = 64  # steps after the product searched for members (SGD updates are at the end)


class Epilogue:
    """One compiled epilogue: its C functions (bound by `native.build_library`: the
    loop over a chunk and, with column sums, the one writing them), the product's
    shape (M, N) and its number of column sums."""

    __slots__ = ("fname", "addr", "fn", "fin", "fin_addr", "m", "n", "nsum", "members")
    __slots__ += ("outputs",)

    def __init__(self, fname, m, n, nsum, members, outputs):
        self.fname, self.m, self.n, self.nsum = fname, m, n, nsum
        self.members, self.outputs = members, outputs
        self.addr = self.fn = self.fin = self.fin_addr = None

    def bind(self, lib):
        fn = getattr(lib, self.fname)
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p] + [ctypes.c_long] * 4 + [ctypes.c_void_p]
        self.fn, self.addr = fn, ctypes.cast(fn, ctypes.c_void_p).value
        if self.nsum:
            fin = getattr(lib, self.fname + "_sums")
            fin.restype = None
            fin.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
            self.fin, self.fin_addr = fin, ctypes.cast(fin, ctypes.c_void_p).value

    def run(self, ptrs):
        """The epilogue over the whole product (the product was computed elsewhere)."""
        args = (ctypes.c_long * len(ptrs))(*ptrs)
        acc = np.zeros(self.nsum * self.n) if self.nsum else None
        self.fn(args, 0, self.m, 0, self.n, None if acc is None else acc.ctypes.data)
        if self.nsum:
            self.fin(args, acc.ctypes.data)

    def __repr__(self):
        return f"Epilogue[{' '.join(self.members)}] {self.m}x{self.n}"


def step_index(ctx, attr):
    """value -> step index of its producer, and value -> step indices that read it,
    cached on `ctx` under `attr` (each pass its own: a pass may change ctx.steps)."""
    found = getattr(ctx, attr, None)
    if found is None:
        made, uses = {}, {}
        for k, step in enumerate(ctx.steps):
            for e in step.eqns if type(step) is FusionGroup else [step]:
                for o in e.outputs:
                    made[o] = k
                for v in e.inputs:
                    if type(v) is Var:
                        uses.setdefault(v, set()).add(k)
        found = (made, uses)
        setattr(ctx, attr, found)
    return found


def _index(ctx):
    return step_index(ctx, "_epi_index")


def _member_eqns(step, shape):
    """The equations of `step` when it is elementwise over `shape`, else None."""
    if type(step) is FusionGroup:
        return step.eqns if tuple(step.shape) == shape else None
    if is_fusible(step) and tuple(step.outputs[0].aval.shape) == shape:
        return [step]
    return None


def _is_colsum(step, chain, shape):
    if type(step) is FusionGroup or step.primitive is not reduce_sum_p:
        return False
    (x,) = step.inputs
    return (
        x in chain
        and tuple(x.aval.shape) == shape
        and tuple(step.params["axes"]) == tuple(range(len(shape) - 1))
        and step.outputs[0].aval.dtype == x.aval.dtype
    )


def _broadcast(ctx, v, shape, m, n):
    """("row" | "col", source) when `v` broadcasts a vector along the rows (index c
    of the M x N product: a bias) or the columns (index r), ("scalar", x) when it
    spreads a 0-d value, else None. Reshapes of the source are looked through (same
    elements in the same order)."""
    from fflow.lowering import native  # the C compiler path

    prod = native._producers(ctx)
    e = prod.get(v)
    u = native.scalar_source(e)
    if u is not None:
        return "scalar", u  # a traced scalar (a learning rate) spread out
    src = native.broadcast_source(e, shape)
    if src is None or src[2] != (n if src[0] == "row" else m):
        return None
    u = src[1]
    while type(u) is Var and prod.get(u) is not None and prod[u].primitive is reshape_p:
        u = prod[u].inputs[0]
    return src[0], u


def find(ctx, eqn, i, m, n, at=None):
    """The epilogue of the product `eqn` (step `i`, output M x N, computed at step
    `at`, default i): a dict for `render`, or None."""
    from fflow.lowering import native  # the C compiler path

    at = i if at is None else at
    out = eqn.outputs[0]
    shape = tuple(out.aval.shape)
    if (
        not ctx.native_ok
        or not native.enabled()
        or out.aval.dtype not in (np.dtype(np.float32), np.dtype(np.float64))
        or not shape
        or shape[-1] != n
        or m * n < native.ARITH_MIN_SIZE
    ):
        return None
    made, uses = _index(ctx)

    def available(v):
        return type(v) is Literal or ctx.moved.get(v, made.get(v, -1)) < at

    chain = {out}
    members, sums, steps = [], [], set()
    for j in range(i + 1, min(len(ctx.steps), i + 1 + WINDOW)):
        step = ctx.steps[j]
        if id(step) in ctx.skip:
            continue
        eqns = step.eqns if type(step) is FusionGroup else [step]
        if not any(v in chain for e in eqns for v in e.inputs):
            continue
        if _is_colsum(step, chain, shape):
            sums.append(step)
            steps.add(j)
            continue
        body = _member_eqns(step, shape)
        if body is None:
            continue
        inner = {o for e in body for o in e.outputs}
        ok = True
        for e in body:
            if "transcendental" in e.primitive.traits and m * n < native.NATIVE_MIN_SIZE:
                ok = False
            for v in e.inputs:
                if type(v) is Literal or v in chain or v in inner:
                    continue
                src = _broadcast(ctx, v, shape, m, n)
                if src is not None:
                    ok = ok and available(src[1])
                elif v.aval.shape in ((), shape):
                    ok = ok and available(v)
                else:
                    ok = False
        if ok:
            members.append((step, body))
            steps.add(j)
            chain.update(e.outputs[0] for e in body)
    if not members and not sums:
        return None
    # values the epilogue writes out: read by a step that is not a member, or outputs
    member_ids = {id(s) for s, _ in members} | {id(s) for s in sums}

    def needed(v):
        return v in ctx.outset or any(
            id(ctx.steps[k]) not in member_ids for k in uses.get(v, ()) if k > i
        )

    outs = [e.outputs[0] for _, body in members for e in body if needed(e.outputs[0])]
    return {
        "product": out,
        "members": members,
        "sums": sums,
        "outputs": outs,
        "keep_product": needed(out),
        "shape": shape,
        "m": m,
        "n": n,
    }


def render(ctx, found, fname):
    """(C source, pointers, Epilogue) of an epilogue, or None when a member has no C
    form. Pointers, in order, as (kind, value): the product ("full"), then inputs
    ("full", "row" and "col" broadcasts' sources, "scalar"), then outputs ("out") and
    column sums ("sum")."""
    from fflow.lowering import native  # the C compiler path

    m, n, shape = found["m"], found["n"], found["shape"]
    product = found["product"]
    names = {product: "p0[i]"}
    ptrs = [("full", product)]
    decls = [f"  {native._CTYPES[product.aval.dtype]}* p0 = (void*)a[0];"]
    body, used_math = [], set()

    def pointer(kind, v):
        k, ct = len(ptrs), native._CTYPES.get(v.aval.dtype)
        ptrs.append((kind, v))
        if ct is None:
            return None
        if kind == "scalar":
            decls.append(f"  const {ct} p{k} = *(const {ct}*)a[{k}];")
            return f"p{k}"
        const = "" if kind in ("out", "sum") else "const "
        decls.append(f"  {const}{ct}* p{k} = (void*)a[{k}];")
        return f"p{k}" + {"full": "[i]", "row": "[c]", "col": "[r]", "out": "[i]"}.get(kind, "")

    for _, eqns in found["members"]:
        for e in eqns:
            args = []
            for v in e.inputs:
                if type(v) is Literal:
                    ct = native._CTYPES.get(v.aval.dtype)
                    if ct is None:
                        return None
                    args.append(native._literal(np.asarray(v.value, v.aval.dtype), ct))
                    continue
                if v not in names:
                    src = _broadcast(ctx, v, shape, m, n)
                    if v.aval.shape == () or v in ctx.splat:
                        names[v] = pointer("scalar", v)
                    elif src is not None:
                        names[v] = pointer(*src)
                    else:
                        names[v] = pointer("full", v)
                    if names[v] is None:
                        return None
                args.append(names[v])
            expr = native._render_eqn(e, args, used_math)
            if expr is None:
                return None
            ct = native._CTYPES[e.outputs[0].aval.dtype]
            body.append(f"{ct} t{len(body)} = {expr};")
            names[e.outputs[0]] = f"t{len(body) - 1}"
    stores = [f"{pointer('out', v)} = {names[v]};" for v in found["outputs"]]
    sums = [(pointer("sum", s.outputs[0]), names[s.inputs[0]]) for s in found["sums"]]
    math = "".join(
        f"#pragma omp declare simd notinbranch\n{ct} {native._fn(f, ct)}({', '.join([ct] * ar)});\n"
        for f, ct, ar in sorted(used_math)
    )
    t = native._CTYPES[product.aval.dtype]
    # column sums: added into this chunk's accumulators (doubles, nsum x N), written
    # by fname_sums once the pool has added up the chunks' accumulators
    adds = [f"acc[{k * n}L + c] += (double){val};" for k, (_, val) in enumerate(sums)]
    fin = ""
    if sums:
        fin = f"void {fname}_sums(const long *a, const double *acc) {{\n" + "\n".join(decls)
        fin += "\n" + "".join(
            f"  for (long c = 0; c < {n}L; c++) {p}[c] = ({t})acc[{k * n}L + c];\n"
            for k, (p, _) in enumerate(sums)
        )
        fin += "}\n"
    inner = "\n".join("      " + line for line in body + stores + adds)
    source = (
        "#include <math.h>\n#include <stdlib.h>\n"
        + math
        + f"void {fname}(const long *a, long r0, long r1, long c0, long c1, double *acc) {{\n"
        + "\n".join(decls)
        + "\n"
        + "  for (long r = r0; r < r1; r++) {\n    #pragma omp simd\n"
        + f"    for (long c = c0; c < c1; c++) {{\n      long i = r * {n}L + c;\n"
        + inner
        + "\n    }\n  }\n}\n"
        + fin
    )
    what = [e.primitive.name for _, eqns in found["members"] for e in eqns]
    what += ["column_sum"] * len(sums)
    return source, ptrs, Epilogue(fname, m, n, len(sums), what, list(found["outputs"]))


def _skip_dead_views(ctx, i, found):
    """Skip the broadcasts and reshapes (of biases) between the product and its last
    member that only the epilogue's steps read: it reads their sources."""
    made, uses = _index(ctx)
    mine = {id(s) for s, _ in found["members"]} | {id(s) for s in found["sums"]}
    last = max(made[s.outputs[0]] for s, _ in found["members"] + [(t, 0) for t in found["sums"]])
    for k in range(last, i, -1):
        step = ctx.steps[k]
        if (
            type(step) is FusionGroup
            or id(step) in ctx.skip
            or step.primitive not in (broadcast_in_dim_p, reshape_p)
        ):
            continue
        out = step.outputs[0]
        if out not in ctx.outset and all(id(ctx.steps[j]) in mine for j in uses.get(out, ())):
            ctx.skip.add(id(step))
            mine.add(id(step))  # a reshape read only by this broadcast goes too


def emit(ctx, found, i, c_name, c_alias=None):
    """Render the epilogue `found` of the product held in `c_name` (a fresh M x N
    buffer; `c_alias`: how to name it, as the product, after the product's lines)
    into the program: allocate its outputs (the first in the product's buffer
    when nothing else reads the product), mark its steps done. Returns (global name of
    the Epilogue, pointer expressions, lines to emit after the product), or None."""
    from fflow.lowering import native  # the C compiler path

    fname = f"fflow_epi_{len(ctx.native_pending)}"
    rendered = render(ctx, found, fname)
    if rendered is None:
        return None
    source, ptrs, epi = rendered
    product = found["product"]
    ctx.globals["_contig"] = native._contiguous
    in_c = None
    if not found["keep_product"]:
        in_c = next((v for v in found["outputs"] if v.aval.dtype == product.aval.dtype), None)
    exprs, after = [f"_ad({c_name})"], []
    ctx.globals["_ad"] = native.address
    for kind, v in ptrs[1:]:
        dt = ctx.const(v.aval.dtype, "dt")
        if kind in ("out", "sum"):
            if v is in_c:
                after.append(f"{ctx.name(v)} = {c_alias or ctx.name(product)}")
                exprs.append(f"_ad({c_name})")
                continue
            ctx.emit(f"{ctx.name(v)} = np.empty({tuple(v.aval.shape)}, {dt})")
            ctx.fresh.add(v)
        elif kind == "scalar" and v in ctx.splat:
            # a constant: one buffer for the kernel's life, its address a literal
            buf = np.array([ctx.globals[ctx.splat[v]]], dtype=v.aval.dtype)
            ctx.const(buf, "sbuf")
            exprs.append(str(buf.ctypes.data))
            continue
        else:
            ctx.emit(f"{ctx.name(v)}_e = _contig({ctx.arg(v, True)}, {dt})")
            exprs.append(f"_ad({ctx.name(v)}_e)")
            continue
        exprs.append(f"_ad({ctx.name(v)})")
    if in_c is not None:
        ctx.fresh.add(in_c)
    for step, eqns in found["members"]:
        ctx.skip.add(id(step))
        ctx.moved.update((e.outputs[0], i) for e in eqns)
    for step in found["sums"]:
        ctx.skip.add(id(step))
        ctx.moved[step.outputs[0]] = i
    _skip_dead_views(ctx, i, found)
    ctx.native_pending.append((fname, None, source, None))
    ctx.native_sources.append(source)
    ctx.epilogues.append(epi)
    return ctx.const(epi, "epi"), f"({', '.join(exprs)},)", after
