"""Device-wide scans for long lines (cumsum / cumprod / cummax / cummin).

A block per line (cuda_reduce.cumulative_kernel) walks a 16M-element line in
16,000 sequential chunks on one SM. Long lines are cut into chunks of CHUNK
elements scanned by all the GPU's blocks at once, in three kernels:

1. `scan_a`: each block reduces its chunk to one partial (grid: chunks x lines);
2. `scan_b`: one block per line scans the partials into each chunk's exclusive
   prefix (the combination of all chunks before it);
3. `scan_c`: each block scans its chunk (every thread ITEMS consecutive elements
   in registers, then a block-wide scan of the thread totals in shared memory)
   and combines the chunk's prefix into every output.

The line is read twice and written once; the producers of the input are inlined
into kernels 1 and 3. Partials use the accumulator type (fp32 for half/bf16).
"""

from fflow.lowering.cuda_kernels import (
    CUMULATIVE,
    Builder,
    KernelSource,
    _indent,
    delinearize,
    linear,
    size_of,
)
from fflow.lowering.cuda_reduce import ACC_DTYPES, Reduction

from fflow.core import ShapedArray, Var

BLOCK = 1024
ITEMS = 4  # consecutive elements per thread
CHUNK = BLOCK * ITEMS
MIN_LENGTH = 2 * CHUNK  # shorter lines keep one block per line
MAX_LINES = 256  # with more lines, one block per line already fills the GPU


def wanted(eqn):
    shape = eqn.inputs[0].aval.shape
    length = shape[eqn.params["axis"]]
    return length >= MIN_LENGTH and size_of(shape) // length <= MAX_LINES


def _block_scan(red, tag):
    """Exclusive scan of `tot` over the block's threads into `pre` (Hillis-Steele)."""
    return [
        f"__shared__ {red.acc} sb_{tag}[2][{BLOCK}];",
        f"sb_{tag}[0][threadIdx.x] = tot;",
        "__syncthreads();",
        "int s = 0;",
        f"for (int off = 1; off < {BLOCK}; off <<= 1) {{",
        f"  {red.acc} t = sb_{tag}[s][threadIdx.x];",
        f"  if ((int)threadIdx.x >= off) t = {red.comb(f'sb_{tag}[s][threadIdx.x - off]', 't')};",
        f"  sb_{tag}[1 - s][threadIdx.x] = t;",
        "  s = 1 - s;",
        "  __syncthreads();",
        "}",
        f"{red.acc} pre = threadIdx.x ? sb_{tag}[s][threadIdx.x - 1] : {red.init};",
    ]


def scan_kernels(eqn, inline, wide=False):
    """The three kernels of a chunked scan along eqn's axis (see the module docstring)."""
    src = eqn.inputs[0]
    axis, reverse = eqn.params["axis"], eqn.params.get("reverse", False)
    shape = src.aval.shape
    length = shape[axis]
    lines_shape = shape[:axis] + shape[axis + 1 :]
    nlines = size_of(lines_shape)
    nchunks = -(-length // CHUNK)
    red = Reduction(CUMULATIVE[eqn.primitive], src.aval.dtype, src.aval.dtype)
    partial = Var(ShapedArray((nlines, nchunks), ACC_DTYPES[red.acc]))
    prefix = Var(ShapedArray((nlines, nchunks), ACC_DTYPES[red.acc]))

    def chunk_values(k):
        """Lines loading this thread's ITEMS values into v[] (identity past the end)."""
        b0 = Builder(k)
        lidx = [b0.index_tmp(e) for e in delinearize("line", lines_shape, k.lit)]
        lines = b0.lines + [
            f"{red.acc} v[{ITEMS}];",
            f"const {k.idx_t} k0 = ({k.idx_t})blockIdx.x * {CHUNK} + threadIdx.x * {ITEMS};",
            "#pragma unroll",
            f"for (int q = 0; q < {ITEMS}; ++q) {{",
            f"  const {k.idx_t} kk = k0 + q;",
            f"  v[q] = {red.init};",
            f"  if (kk < {length}{k.lit}) {{",
        ]
        b = Builder(k)
        pos = f"({length - 1} - kk)" if reverse else "kk"
        full = lidx[:axis] + [pos] + lidx[axis:]
        val = b.value(src, full)
        lines += _indent(b.lines + [f"v[q] = {red.to_acc(val)};"], 2) + ["  }", "}"]
        return lines, full

    # 1. a partial per chunk
    ka = KernelSource("scana", inline, wide)
    part = ka.output(partial)
    head = [f"const {ka.idx_t} line = blockIdx.y;"]
    vals, _ = chunk_values(ka)
    body = head + vals + [f"{red.acc} tot = v[0];"]
    body += [f"for (int q = 1; q < {ITEMS}; ++q) tot = {red.comb('tot', 'v[q]')};"]
    body += _block_scan(red, "a")
    body += [
        f"if (threadIdx.x == {BLOCK - 1}) "
        f"{part}[line * {nchunks}{ka.lit} + blockIdx.x] = {red.comb('pre', 'tot')};"
    ]
    kern_a = ka.finish(body, (nchunks, nlines), BLOCK)

    # 2. exclusive prefixes of the partials, one block per line
    kb = KernelSource("scanb", {}, wide)
    pin, pout = kb.input(partial), kb.output(prefix)
    body = [
        f"const {kb.idx_t} line = blockIdx.x;",
        f"{red.acc} carry = {red.init};",
        f"for (int c0 = 0; c0 < {nchunks}; c0 += {BLOCK}) {{",
        "  const int c = c0 + threadIdx.x;",
        f"  {red.acc} tot = c < {nchunks} ? {pin}[line * {nchunks}{kb.lit} + c] : {red.init};",
    ]
    inner = _block_scan(red, "b") + [
        f"if (c < {nchunks}) {pout}[line * {nchunks}{kb.lit} + c] = {red.comb('carry', 'pre')};",
        f"carry = {red.comb('carry', f'sb_b[s][{BLOCK - 1}]')};",
        "__syncthreads();",
    ]
    body += _indent(inner) + ["}"]
    kern_b = kb.finish(body, nlines, BLOCK)

    # 3. scan each chunk and combine its prefix
    kc = KernelSource("scanc", inline, wide)
    out = kc.output(eqn.outputs[0])
    pre_in = kc.input(prefix)
    head = [f"const {kc.idx_t} line = blockIdx.y;"]
    vals, full = chunk_values(kc)
    body = head + vals
    body += [f"for (int q = 1; q < {ITEMS}; ++q) v[q] = {red.comb('v[q - 1]', 'v[q]')};"]
    body += [f"const {red.acc} tot = v[{ITEMS - 1}];"]
    body += _block_scan(red, "c")
    result = red.out_r.store(red.result(red.comb("pre", "v[q]")))
    body += [
        f"pre = {red.comb(f'{pre_in}[line * {nchunks}{kc.lit} + blockIdx.x]', 'pre')};",
        "#pragma unroll",
        f"for (int q = 0; q < {ITEMS}; ++q) {{",
        f"  const {kc.idx_t} kk = k0 + q;",
        f"  if (kk < {length}{kc.lit}) {out}[{linear(full, shape, kc.lit)}] = {result};",
        "}",
    ]
    kern_c = kc.finish(body, (nchunks, nlines), BLOCK)
    return [kern_a, kern_b, kern_c]
