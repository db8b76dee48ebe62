"""Shared-memory tiled transposes for fused elementwise kernels.

A fused kernel computing `f(transpose(x), ...)`, where the transpose moves x's last
(contiguous) axis away from the output's last axis, would read x with a stride of a
whole row per thread: 32 sectors per warp load instead of 4. The tiled kernel
works on 32 x 32 tiles of the two output axes involved (a = the output's last axis,
b = the axis that is x's last): a block of 32 x 8 threads first reads the tile of x
along x's last axis (coalesced) into shared memory, then computes its outputs along
the output's last axis (coalesced stores), taking the transposed value from the tile.
Every other operand is rendered at the output element as in the plain kernel.
"""

from fflow.lowering.cuda_kernels import (
    Builder,
    KernelSource,
    _indent,
    delinearize,
    linear,
    size_of,
)
from fflow.lowering.cuda_render import renderer_for
from fflow.primitives.shape import transpose_p

from fflow.core import Var

TILE, ROWS = 32, 8  # a 32 x 32 tile, 8 rows of threads (4 elements each)
MAX_GRID_YZ = 65535


def candidate(outputs, inline):
    """The transpose equation worth tiling in the group computing `outputs`, or None."""
    shape = outputs[0].aval.shape
    if len(shape) < 2:
        return None
    seen, stack = set(), list(outputs)
    while stack:
        v = stack.pop()
        if v in seen or v not in inline:
            continue
        seen.add(v)
        e = inline[v]
        if e.primitive is transpose_p and e.inputs[0] not in inline:
            perm = tuple(e.params["permutation"])
            if v.aval.shape == shape and perm[-1] != len(perm) - 1:
                return e
        stack.extend(x for x in e.inputs if type(x) is Var)
    return None


def tiled_kernel(outputs, inline, t_eqn, wide=False):
    """The tiled kernel for `outputs` with transpose `t_eqn` read through shared memory,
    or None when the transposed value is also read at other elements (a shifted slice)."""
    shape = outputs[0].aval.shape
    n = len(shape)
    perm = tuple(t_eqn.params["permutation"])
    tv = t_eqn.outputs[0]
    x = t_eqn.inputs[0]
    a, b = n - 1, perm.index(n - 1)
    rest = [d for d in range(n) if d not in (a, b)]
    tiles_a, tiles_b = -(-shape[a] // TILE), -(-shape[b] // TILE)
    nrest = size_of([shape[d] for d in rest])
    if tiles_b > MAX_GRID_YZ or nrest > MAX_GRID_YZ:
        return None
    # probe: is the transposed value read only at the output's own element?
    others = {v: e for v, e in inline.items() if v is not tv}
    probe = KernelSource("ewt", others, wide)
    pb = Builder(probe)
    idx = [pb.index_tmp(e) for e in delinearize("i", shape, probe.lit)]
    probe.row_shapes = {"row": shape}
    pb.canon = {tuple(idx): "row"}
    for v in outputs:
        pb.value(v, idx)
    if tv not in probe.canonical_reads or tv in probe.other_reads:
        return None

    k = KernelSource("ewt", others, wide)
    it, lit = k.idx_t, k.lit
    r = renderer_for(x.aval.dtype)
    xin = k.input(x)
    out_names = [k.output(v) for v in outputs]
    body = [
        f"__shared__ {r.compute} tile[{TILE}][{TILE + 1}];",
        "const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;",
        f"const {it} a0 = ({it})blockIdx.x * {TILE}, b0 = ({it})blockIdx.y * {TILE};",
    ]
    rb = Builder(k)
    rest_idx = [rb.index_tmp(e) for e in delinearize("blockIdx.z", [shape[d] for d in rest], lit)]
    body += rb.lines

    def full(ia, ib):
        idx = [None] * n
        for d, e in zip(rest, rest_idx):
            idx[d] = e
        idx[a], idx[b] = ia, ib
        return idx

    # 1. the tile of x, read along x's last axis (output axis b): coalesced
    oidx = full("oa", "ob")
    xidx = [None] * n
    for i, p in enumerate(perm):
        xidx[p] = oidx[i]
    body += [
        f"for (int r = ty; r < {TILE}; r += {ROWS}) {{",
        f"  const {it} oa = a0 + r, ob = b0 + tx;",
        f"  if (oa < {shape[a]}{lit} && ob < {shape[b]}{lit})",
        f"    tile[r][tx] = {r.load(f'{xin}[{linear(xidx, x.aval.shape, lit)}]')};",
        "}",
        "__syncthreads();",
    ]
    # 2. the outputs along the output's last axis (a): coalesced, x's value from the tile
    k.special[tv] = "tile[tx][r]"
    b2 = Builder(k)
    idx = full("oa", "ob")
    stores = []
    for v, name in zip(outputs, out_names):
        val = b2.value(v, idx)
        stores.append(
            f"{name}[{linear(idx, shape, lit)}] = {renderer_for(v.aval.dtype).store(val)};"
        )
    body += [
        f"for (int r = ty; r < {TILE}; r += {ROWS}) {{",
        f"  const {it} oa = a0 + tx, ob = b0 + r;",
        f"  if (oa < {shape[a]}{lit} && ob < {shape[b]}{lit}) {{",
    ]
    body += _indent(b2.lines + stores, 2) + ["  }", "}"]
    kernel = k.finish(body, (tiles_a, tiles_b, max(nrest, 1)), TILE * ROWS)
    kernel.vector_width = 1
    return kernel
