"""CUDA scatter and sort kernels: scatters apply their updates with atomics (or
compare-and-swap loops) onto a copy of the operand; sort is a bitonic sort per line."""

import hashlib

import numpy as np
from fflow.lowering.cuda_kernels import (
    BLOCK,
    MAX_GRID,
    SCATTERS,
    Builder,
    KernelSource,
    _grid,
    _grid_loop,
    _indent,
    delinearize,
    linear,
    size_of,
)
from fflow.lowering.cuda_render import renderer_for, storage_ctype


def scatter_kernel(eqn, inline, out_var, wide=False):
    """Apply the updates of a scatter to `out_var` (already holding the operand)."""
    x, indices, updates = eqn.inputs
    mode = SCATTERS[eqn.primitive]
    k = KernelSource("scat", inline, wide)
    dtype = np.dtype(x.aval.dtype)
    r = renderer_for(dtype)
    # the operand buffer is read and written: pass it as an output
    out = k.output(out_var)
    ushape = updates.aval.shape
    nb = indices.aval.ndim - 1
    b = Builder(k)
    uidx = delinearize("u", ushape, k.lit)
    if len(uidx) > 1:
        uidx = [b.index_tmp(e) for e in uidx]
    batch, rest = uidx[:nb], iter(uidx[nb:])
    conds, tidx = [], []
    axis = eqn.params.get("axis")
    if axis is None:
        axes = eqn.params["axes"]
        for dim, size in enumerate(x.aval.shape):
            if dim in axes:
                t = b.tmp(
                    "long long", f"(long long)({b.value(indices, batch + [str(axes.index(dim))])})"
                )
                conds.append(f"{t} >= 0 && {t} < {size}")
                tidx.append(f"({k.idx_t})({t})")
            else:
                tidx.append(next(rest))
    else:  # scatter_add_along_axis: indices shaped like the updates, clamped into range
        n = x.aval.shape[axis]
        i = f"(long long)({b.value(indices, uidx)})"
        t = b.tmp("long long", f"fflow_clamp({i}, 0LL, {max(n - 1, 0)}LL)")
        tidx = uidx[:axis] + [f"({k.idx_t})({t})"] + uidx[axis + 1 :]
        conds += [] if n else ["false"]
    val = b.value(updates, uidx)
    lin = linear(tidx, x.aval.shape, k.lit)
    if mode == "set":
        op = f"{out}[{lin}] = {r.store(val)};"
    else:
        fn = _atomic_helper(k, mode, dtype)
        op = f"{fn}(&{out}[{lin}], {val});"
    cond = " && ".join(conds) or "true"
    body = [_grid_loop("u", "", f"{size_of(ushape)}{k.lit}", k.idx_t)]
    body += _indent(b.lines + [f"if ({cond}) {op}"]) + ["}"]
    kernel = k.finish(body, _grid(size_of(ushape)), BLOCK)
    return kernel


def _atomic_helper(k, mode, dtype):
    r = renderer_for(dtype)
    st = storage_ctype(dtype)
    tname = dtype.name
    fname = f"fflow_atomic_{mode}_{tname}"
    guard = fname.upper()
    native = {
        ("add", "float32"): "atomicAdd(p, v);",
        ("add", "float64"): "atomicAdd(p, v);",
        ("add", "int32"): "atomicAdd(p, v);",
        ("add", "uint32"): "atomicAdd(p, v);",
        ("add", "int64"): "atomicAdd((unsigned long long*)p, (unsigned long long)v);",
        ("add", "uint64"): "atomicAdd(p, v);",
    }.get((mode, tname))
    if native:
        k.helper(
            guard, f"__device__ __forceinline__ void {fname}({st}* p, {r.compute} v) {{ {native} }}"
        )
        return fname
    row = {"add": "add", "mul": "mul", "min": "min", "max": "max"}[mode]
    combine = r.round(r.code_for_op[row]("cur", "v"))
    size = dtype.itemsize
    if size == 8:
        word = "unsigned long long"
        text = (
            f"__device__ __forceinline__ void {fname}({st}* p, {r.compute} v) {{\n"
            f"  {word}* w = ({word}*)p; {word} old = *w, assumed;\n"
            f"  do {{ assumed = old; union {{ {word} u; {st} s; }} c; c.u = assumed;\n"
            f"    {r.compute} cur = {r.load('c.s')}; c.s = {r.store(combine)};\n"
            f"    old = atomicCAS(w, assumed, c.u); }} while (assumed != old);\n}}"
        )
    elif size == 4:
        text = (
            f"__device__ __forceinline__ void {fname}({st}* p, {r.compute} v) {{\n"
            "  unsigned* w = (unsigned*)p; unsigned old = *w, assumed;\n"
            f"  do {{ assumed = old; union {{ unsigned u; {st} s; }} c; c.u = assumed;\n"
            f"    {r.compute} cur = {r.load('c.s')}; c.s = {r.store(combine)};\n"
            "    old = atomicCAS(w, assumed, c.u); } while (assumed != old);\n}"
        )
    else:
        mask = (1 << (8 * size)) - 1
        small = "unsigned short" if size == 2 else "unsigned char"
        text = (
            f"__device__ __forceinline__ void {fname}({st}* p, {r.compute} v) {{\n"
            "  unsigned long long a = (unsigned long long)p;\n"
            "  unsigned* w = (unsigned*)(a & ~3ULL); int sh = (int)(a & 3ULL) * 8;\n"
            "  unsigned old = *w, assumed;\n"
            f"  do {{ assumed = old; union {{ {small} u; {st} s; }} c;\n"
            f"    c.u = ({small})((assumed >> sh) & {mask}u);\n"
            f"    {r.compute} cur = {r.load('c.s')}; c.s = {r.store(combine)};\n"
            f"    unsigned nw = (assumed & ~({mask}u << sh)) | ((unsigned)c.u << sh);\n"
            "    old = atomicCAS(w, assumed, nw); } while (assumed != old);\n}"
        )
    k.helper(guard, text)
    return fname


SORT_MAX = 2048  # longer lines sort on the host


def sort_kernel(eqn, wide=False):
    """Stable sort of every line along `dimension`: a block per line, bitonic sort of
    the line's indices in shared memory (keys compared lexicographically, NaN last, the
    original index breaking ties, which makes it stable), then a gather of every operand."""
    ops = eqn.inputs
    dim = eqn.params["dimension"]
    shape = ops[0].aval.shape
    length = shape[dim]
    post = size_of(shape[dim + 1 :])
    nlines = size_of(shape) // max(length, 1)
    p2 = 1
    while p2 < length:
        p2 *= 2
    block = min(max(p2 // 2, 32), 1024)
    k = KernelSource("sort", {}, wide)
    names = [k.input(v) for v in ops]
    outs = [k.output(v) for v in eqn.outputs]
    t = k.idx_t
    off = line_offset(k, length, post)
    call = after_helper(k, eqn, names)
    body = [
        f"__shared__ int perm[{p2}];",
        f"for ({t} line = blockIdx.x; line < {nlines}{k.lit}; line += gridDim.x) {{",
        f"  const {t} base = {off};",
        f"  for (int i = threadIdx.x; i < {p2}; i += blockDim.x) perm[i] = i;",
        "  __syncthreads();",
        f"  for (int kk = 2; kk <= {p2}; kk <<= 1) {{",
        "    for (int j = kk >> 1; j > 0; j >>= 1) {",
        f"      for (int i = threadIdx.x; i < {p2}; i += blockDim.x) {{",
        "        int ixj = i ^ j;",
        "        if (ixj > i) {",
        "          int a = perm[i], b = perm[ixj];",
        f"          bool swap = (i & kk) == 0 ? {call}a, b) : {call}b, a);",
        "          if (swap) { perm[i] = b; perm[ixj] = a; }",
        "        }",
        "      }",
        "      __syncthreads();",
        "    }",
        "  }",
        f"  for (int i = threadIdx.x; i < {length}; i += blockDim.x) {{",
        f"    const {t} src = base + ({t})perm[i] * {post}, dst = base + ({t})i * {post};",
    ]
    body += [f"    {o}[dst] = {n}[src];" for o, n in zip(outs, names)]
    body += ["  }", "  __syncthreads();", "}"]
    return k.finish(body, max(1, min(nlines, MAX_GRID)), block)


def line_offset(k, length, post):
    """C expression: the offset of line `line`'s first element (lines along one axis)."""
    t = k.idx_t
    return f"(({t})(line / {post}{k.lit}) * {length * post}{k.lit} + ({t})(line % {post}{k.lit}))"


def after_helper(k, eqn, names):
    """Declare the comparison of a sort: `<call>a, b)` is true when element a of the
    line at `base` goes after element b (keys lexicographic, NaN last, then the index;
    indices past the line's end go last). Returns the call's opening text."""
    ops = eqn.inputs
    dim, num_keys = eqn.params["dimension"], eqn.params.get("num_keys", 1)
    shape = ops[0].aval.shape
    length = shape[dim]
    post = size_of(shape[dim + 1 :])
    t = k.idx_t
    lines = []
    for i in range(num_keys):
        r = renderer_for(ops[i].aval.dtype)
        va = r.load(f"{names[i]}[base + ({t})a * {post}]")
        vb = r.load(f"{names[i]}[base + ({t})b * {post}]")
        lines += [
            f"{{ {r.compute} va = {va}, vb = {vb};",
            "  if ((vb < va) || (va != va && vb == vb)) return true;",
            "  if ((va < vb) || (vb != vb && va == va)) return false; }",
        ]
    params = ", ".join(f"const {storage_ctype(v.aval.dtype)}* {n}" for v, n in zip(ops, names))
    text = (
        f"__device__ __forceinline__ bool HELPER({params}, {t} base, int a, int b) {{\n"
        f"  if (a >= {length} || b >= {length}) return a >= {length} && (b < {length} || a > b);\n"
        + "\n".join("  " + x for x in lines)
        + "\n  return a > b;\n}"
    )
    helper = "fflow_sort_after_" + hashlib.sha256(text.encode()).hexdigest()[:10]
    k.helper(helper.upper(), text.replace("HELPER", helper))
    return f"{helper}({', '.join(names)}, base, "
