"""Reductions whose reduced axes include the contiguous (last) one but are not all
trailing — e.g. batch-norm statistics of NCHW activations, sum over (0, 2, 3) —
as a block per output: the block's threads walk the reduced elements in memory
order (coalesced along the last axis) and combine with shuffles + shared memory.
One thread per output (cuda_reduce.strided_reduce_kernel) would read a row apart
per thread. With few outputs the reduced elements are split over blockIdx.y and
cuda_reduce.combine_partials_kernel adds the slices.
"""

from fflow.lowering.cuda_kernels import (
    MAX_GRID,
    Builder,
    KernelSource,
    _indent,
    delinearize,
    size_of,
)
from fflow.lowering.cuda_reduce import (
    ACC_DTYPES,
    Reduction,
    _block_allreduce,
    combine_partials_kernel,
)
from fflow.primitives.reduction import argmax_p, argmin_p

from fflow.core import ShapedArray, Var

BLOCK = 256
MIN_INNER = 32  # contiguous reduced elements (a warp's worth) for this layout to pay off


def wanted(eqn):
    if eqn.primitive in (argmax_p, argmin_p):
        return False
    shape = eqn.inputs[0].aval.shape
    axes = set(eqn.params["axes"])
    nd = len(shape)
    if nd - 1 not in axes or axes == set(range(nd - len(axes), nd)):
        return False  # the last axis is kept (coalesced already) / a row reduction
    inner, d = 1, nd - 1
    while d in axes:
        inner *= shape[d]
        d -= 1
    return inner >= MIN_INNER


def kernels(eqn, inline, wide=False):
    src = eqn.inputs[0]
    axes = tuple(sorted(eqn.params["axes"]))
    shape = src.aval.shape
    kept = [i for i in range(len(shape)) if i not in axes]
    out_shape = [shape[i] for i in kept]
    red_shape = [shape[i] for i in axes]
    m, kn = size_of(out_shape), size_of(red_shape)
    red = Reduction(eqn.primitive.name, src.aval.dtype, eqn.outputs[0].aval.dtype)
    nsplit = max(1, min(-(-512 // max(m, 1)), kn // (4 * BLOCK), 64))
    partial = Var(ShapedArray((nsplit, m), ACC_DTYPES[red.acc])) if nsplit > 1 else None
    k = KernelSource("bred", inline, wide)
    it, lit = k.idx_t, k.lit
    out = k.output(partial if partial is not None else eqn.outputs[0])
    b0 = Builder(k)
    oidx = [b0.index_tmp(e) for e in delinearize("o", out_shape, lit)]
    b = Builder(k)
    ridx = [b.index_tmp(e) for e in delinearize("r", red_shape, lit)]
    full = [None] * len(shape)
    for i, e in zip(kept, oidx):
        full[i] = e
    for i, e in zip(axes, ridx):
        full[i] = e
    val = b.value(src, full)
    chunk = -(-kn // nsplit)
    r0 = f"({it})blockIdx.y * {chunk}{lit}"
    r1 = f"({r0} + {chunk}{lit} < {kn}{lit} ? {r0} + {chunk}{lit} : {kn}{lit})"
    inner = b0.lines + [
        f"{red.acc} acc = {red.init};",
        f"for ({it} r = {r0} + threadIdx.x; r < {r1}; r += {BLOCK}) {{",
    ]
    inner += _indent(b.lines + [f"acc = {red.comb('acc', red.to_acc(val))};"]) + ["}"]
    inner += _block_allreduce(red, "acc", "b")
    if partial is None:
        store = f"{out}[o] = {red.out_r.store(red.result('acc'))};"
    else:
        store = f"{out}[({it})blockIdx.y * {m}{lit} + o] = acc;"
    inner.append(f"if (threadIdx.x == 0) {store}")
    body = [f"for ({it} o = blockIdx.x; o < {m}{lit}; o += gridDim.x) {{"] + _indent(inner) + ["}"]
    first = k.finish(body, (min(m, MAX_GRID), nsplit), BLOCK)
    if partial is None:
        return [first]
    return [first, combine_partials_kernel(eqn, partial, wide)]


# -- column reductions: 2-D blocks ----------------------------------------------------------

COLS, SLICES = 32, 8  # a block: 32 columns x 8 row slices


def column_wanted(eqn):
    """A reduction over leading axes (bias / gamma / beta gradients) of a sum/max/min."""
    if eqn.primitive in (argmax_p, argmin_p):
        return False
    axes = tuple(sorted(eqn.params["axes"]))
    return 0 < len(axes) < eqn.inputs[0].aval.ndim and axes == tuple(range(len(axes)))


def column_kernels(eqn, inline, wide=False):
    """32 x 8 threads per block: 32 adjacent columns (coalesced loads) and 8 slices of the
    rows each; the slices combine in shared memory in order (deterministic). Blocks
    over the columns and, when those are few, over row ranges (blockIdx.y) whose
    partials a second kernel adds."""
    src = eqn.inputs[0]
    shape = src.aval.shape
    nax = len(eqn.params["axes"])
    rows_shape, cols_shape = list(shape[:nax]), list(shape[nax:])
    rows, m = size_of(rows_shape), size_of(cols_shape)
    red = Reduction(eqn.primitive.name, src.aval.dtype, eqn.outputs[0].aval.dtype)
    bx = -(-m // COLS)
    nsplit = max(1, min(256 // bx, rows // (SLICES * 16), 64))
    partial = Var(ShapedArray((nsplit, m), ACC_DTYPES[red.acc])) if nsplit > 1 else None
    k = KernelSource("cred", inline, wide)
    it, lit = k.idx_t, k.lit
    out = k.output(partial if partial is not None else eqn.outputs[0])
    chunk = -(-rows // nsplit)
    b = Builder(k)
    cidx = [b.index_tmp(e) for e in delinearize("col", cols_shape, lit)]
    ridx = [b.index_tmp(e) for e in delinearize("r", rows_shape, lit)]
    val = b.value(src, ridx + cidx)
    body = [
        f"__shared__ {red.acc} part[{SLICES}][{COLS + 1}];",
        "const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;",
        f"const {it} col = ({it})blockIdx.x * {COLS} + tx;",
        f"const {it} r0 = ({it})blockIdx.y * {chunk}{lit};",
        f"const {it} r1 = r0 + {chunk}{lit} < {rows}{lit} ? r0 + {chunk}{lit} : {rows}{lit};",
        f"{red.acc} acc = {red.init};",
        f"if (col < {m}{lit}) {{",
        f"  for ({it} r = r0 + ty; r < r1; r += {SLICES}) {{",
    ]
    body += _indent(b.lines + [f"acc = {red.comb('acc', red.to_acc(val))};"], 2) + ["  }", "}"]
    body += ["part[ty][tx] = acc;", "__syncthreads();", f"if (ty == 0 && col < {m}{lit}) {{"]
    body += [f"  for (int s = 1; s < {SLICES}; ++s) acc = {red.comb('acc', 'part[s][tx]')};"]
    if partial is None:
        body.append(f"  {out}[col] = {red.out_r.store(red.result('acc'))};")
    else:
        body.append(f"  {out}[({it})blockIdx.y * {m}{lit} + col] = acc;")
    body.append("}")
    first = k.finish(body, (bx, nsplit), COLS * SLICES)
    if partial is None:
        return [first]
    return [first, combine_partials_kernel(eqn, partial, wide)]
