"""CUDA reduction and scan kernels: row kernels (warp or block per row, with the
row-fused softmax / layernorm patterns), strided reductions (split over the reduced
axes when outputs are few), two-pass full reductions and block-wide inclusive scans.
Accumulators are float32 for half/bf16 inputs."""

import numpy as np
from fflow.lowering.cuda_kernels import (
    BLOCK,
    CUMULATIVE,
    MAX_GRID,
    Builder,
    KernelSource,
    _grid,
    _grid_loop,
    _indent,
    _vector_type,
    delinearize,
    linear,
    size_of,
)
from fflow.lowering.cuda_render import renderer_for, storage_ctype
from fflow.primitives.reduction import argmax_p, argmin_p
from fflow.primitives.sbp_constraint import sbp_constraint_p
from fflow.primitives.shape import broadcast_in_dim_p, reshape_p, squeeze_p
from fflow.primitives.unary import copy_p, exp_p, stop_gradient_p

from fflow.core import Literal, ShapedArray, Var

# -- reductions -----------------------------------------------------------------------------


class Reduction:
    """Accumulator type, identity and combine of one reduction primitive on one dtype."""

    def __init__(self, prim_name, in_dtype, out_dtype):
        self.name = prim_name
        self.in_r = renderer_for(in_dtype)
        self.out_r = renderer_for(out_dtype)
        kind = np.dtype(in_dtype).kind
        self.is_arg = prim_name in ("argmax", "argmin")
        size = np.dtype(in_dtype).itemsize
        if kind == "b":
            self.acc = "int"
        elif kind in "iu" and size < 4:
            self.acc = "int" if kind == "i" else "unsigned int"
        else:
            self.acc = self.in_r.compute
        inf_hi = {
            "float": "__int_as_float(0x7f800000)",
            "double": "__longlong_as_double(0x7ff0000000000000LL)",
        }
        inf_lo = {
            "float": "__int_as_float(0xff800000)",
            "double": "__longlong_as_double(0xfff0000000000000LL)",
        }
        if kind == "f" or np.dtype(in_dtype).name == "bfloat16":
            hi, lo = inf_hi[self.acc], inf_lo[self.acc]
        elif kind == "b":
            hi, lo = "1", "0"
        else:
            info = np.iinfo(in_dtype)
            hi = renderer_for(in_dtype).lit(info.max)
            lo = renderer_for(in_dtype).lit(info.min)
        op = prim_name.replace("arg", "reduce_")
        self.init = {
            "reduce_sum": "0",
            "reduce_prod": "1",
            "reduce_max": lo,
            "reduce_min": hi,
            "reduce_or": "0",
            "reduce_and": "1",
        }[op]
        self.init = f"({self.acc})({self.init})"
        self._comb = {
            "reduce_sum": "({a} + {b})",
            "reduce_prod": "({a} * {b})",
            "reduce_max": "fflow_max<" + self.acc + ">({a}, {b})",
            "reduce_min": "fflow_min<" + self.acc + ">({a}, {b})",
            "reduce_or": "({a} | {b})",
            "reduce_and": "({a} & {b})",
        }[op]
        if kind == "b" and op in ("reduce_sum", "reduce_prod"):
            self._comb = "({a} | {b})" if op == "reduce_sum" else "({a} & {b})"

    def comb(self, a, b):
        return self._comb.format(a=a, b=b)

    def to_acc(self, expr):
        return f"({self.acc})({expr})"

    def result(self, acc):
        """The reduction's value (compute type of the output dtype) from the accumulator."""
        if self.is_arg:
            return f"({self.out_r.compute})({acc})"
        return self.out_r.cast_from(
            acc, self.in_r if self.in_r.kind != "b" else renderer_for(np.int32)
        )

    def arg_helper(self, k):
        guard = f"FFLOW_ARGCOMB_{self.name.upper()}_{self.acc.replace(' ', '_').upper()}"
        better = "v2 > v" if self.name == "argmax" else "v2 < v"
        k.helper(
            guard,
            f"__device__ __forceinline__ void {guard.lower()}({self.acc}& v, long long& i, "
            f"{self.acc} v2, long long i2) {{\n"
            "  bool take;\n"
            "  if (i2 < 0) take = false;\n  else if (i < 0) take = true;\n"
            "  else { bool n1 = v != v, n2 = v2 != v2;\n"
            "    if (n1 || n2) take = n2 && (!n1 || i2 < i);\n"
            f"    else if (v2 != v) take = {better};\n"
            "    else take = i2 < i; }\n"
            "  if (take) { v = v2; i = i2; }\n}",
        )
        return guard.lower()


def _warp_allreduce(red, acc, ids=None, comb_fn=None, width=32):
    if red.is_arg:
        return [
            f"for (int o = {width // 2}; o > 0; o >>= 1) {{",
            f"  {red.acc} ov = __shfl_xor_sync(0xffffffffu, {acc}, o);",
            f"  long long oi = __shfl_xor_sync(0xffffffffu, {ids}, o);",
            f"  {comb_fn}({acc}, {ids}, ov, oi);",
            "}",
        ]
    return [
        f"for (int o = {width // 2}; o > 0; o >>= 1)",
        f"  {acc} = {red.comb(acc, f'__shfl_xor_sync(0xffffffffu, {acc}, o)')};",
    ]


def _block_allreduce(red, acc, tag, ids=None, comb_fn=None):
    lines = _warp_allreduce(red, acc, ids, comb_fn)
    lines.append(f"__shared__ {red.acc} sv_{tag}[32];")
    if red.is_arg:
        lines.append(f"__shared__ long long si_{tag}[32];")
        lines += [
            f"if ((threadIdx.x & 31) == 0) {{ sv_{tag}[threadIdx.x >> 5] = {acc}; "
            f"si_{tag}[threadIdx.x >> 5] = {ids}; }}",
            "__syncthreads();",
            f"{acc} = sv_{tag}[0]; {ids} = si_{tag}[0];",
            "for (int w = 1; w < (int)(blockDim.x >> 5); ++w) "
            f"{comb_fn}({acc}, {ids}, sv_{tag}[w], si_{tag}[w]);",
            "__syncthreads();",
        ]
    else:
        lines += [
            f"if ((threadIdx.x & 31) == 0) sv_{tag}[threadIdx.x >> 5] = {acc};",
            "__syncthreads();",
            f"{acc} = sv_{tag}[0];",
            "for (int w = 1; w < (int)(blockDim.x >> 5); ++w)",
            f"  {acc} = {red.comb(acc, f'sv_{tag}[w]')};",
            "__syncthreads();",
        ]
    return lines


def _accumulate(k, red, b, val, acc, ids, jexpr, comb_fn):
    if red.is_arg:
        return [f"{comb_fn}({acc}, {ids}, {red.to_acc(val)}, (long long)({jexpr}));"]
    return [f"{acc} = {red.comb(acc, red.to_acc(val))};"]


# the NumPy dtype of an accumulator's C type (partial results in memory)
ACC_DTYPES = {
    "float": np.float32,
    "double": np.float64,
    "int": np.int32,
    "unsigned int": np.uint32,
    "long long": np.int64,
    "unsigned long long": np.uint64,
}

# registers per thread a row kernel may spend on its row cache (32-bit words)
ROW_CACHE_WORDS = {"warp": 64, "block": 32}


def row_kernel(reductions, elem_outputs, row_outputs, inline, wide=False, cols=(), x_shape=None):
    """The kernels of one row group: reductions over the trailing dims, then outputs of
    the row, plus column reductions of the same rows (`cols`).

    `reductions` are equations reducing the trailing axes of inputs of one shape
    R + N (R: rows, N: reduced dims); their results stay in registers and feed the
    later reductions and the outputs (shape R + N or R / R + (1,)), which is how
    softmax, log_softmax and layernorm become one kernel. Rows of up to 1024
    elements take one warp each (shuffles only); longer rows take a block.

    The row is read from memory once: every input read at the current element (and
    every per-column operand such as layernorm's gamma, once per thread) is loaded
    into registers with 16-byte vector loads when the row length allows, and every
    pass (max, sum, output) reads the registers; outputs are stored 16 bytes at a
    time. Rows too long for the register budget keep one load per pass.

    `cols` reduce the rows R of an expression of the row (layernorm's gamma and beta
    gradients, a bias gradient): each thread owns the same columns in every row it
    visits, so it accumulates them in registers across its rows; a block combines
    its warps in shared memory (in warp order: deterministic) and writes one partial
    row, and a second kernel per column reduction sums the partials of the blocks.
    Returns [row kernel] + one combining kernel per column reduction. Without
    reductions (`x_shape` given: an elementwise group and the column sums of its
    rows) the rows are the leading axes and the last axis is the row.
    """
    x_shape = x_shape or reductions[0].inputs[0].aval.shape
    args = (reductions, elem_outputs, row_outputs, inline, wide, x_shape)
    probe, k = _row_kernel(*args, cols=cols)
    nred = len(reductions[0].params["axes"]) if reductions else 1
    n = size_of(x_shape[len(x_shape) - nred :])
    floats = [
        v
        for v in k.canonical_reads
        if renderer_for(v.aval.dtype).compute in ("float", "double")
        and np.dtype(v.aval.dtype).itemsize in (2, 4, 8)
    ]
    if not floats and not cols:
        return [probe]
    sizes = [np.dtype(v.aval.dtype).itemsize for v in floats + list(elem_outputs)]
    nt = _lanes(n, cols) if n <= 1024 else _row_block(n)
    vec = 16 // max(sizes) if sizes else 1
    while vec > 1 and (n % vec or n < nt * vec):  # every thread keeps a full vector
        vec //= 2
    slots = -(-n // (nt * vec)) * vec
    budget = ROW_CACHE_WORDS["warp" if n <= 1024 else "block"]
    for c in cols:  # the column accumulators come first
        budget -= slots * (2 if _col_reduction(c).acc in ("double", "long long") else 1)
    cached = []
    # inputs read by the most passes first (each of them saves a pass over memory)
    for v in sorted(floats, key=lambda v: -len(k.canonical_reads[v])):
        words = slots * (2 if renderer_for(v.aval.dtype).compute == "double" else 1)
        if words <= budget:
            cached.append(v)
            budget -= words
    if not cached and not cols:
        return [probe]
    kern, k = _row_kernel(*args, cached=cached, vec=vec, cols=cols)
    return [kern] + [combine_partials_kernel(c, p, wide) for c, p in zip(cols, k.partials)]


def _col_reduction(eqn):
    return Reduction(eqn.primitive.name, eqn.inputs[0].aval.dtype, eqn.outputs[0].aval.dtype)


# blocks of a row kernel with column reductions: each writes one partial row
COL_GRID = 512


def _lanes(n, cols):
    """Threads per row in warp mode: a warp, or for rows under 32 elements the next
    power of two, several rows per warp (not with column reductions: their block
    combine assumes one row per warp)."""
    if n >= 32 or cols:
        return 32
    lanes = 1
    while lanes < n:
        lanes *= 2
    return lanes


def _row_block(n):
    return 1024 if n >= 16384 else 512 if n >= 4096 else 256


def _row_kernel(
    reductions, elem_outputs, row_outputs, inline, wide, x_shape, cached=(), vec=1, cols=()
):
    axes = reductions[0].params["axes"] if reductions else (len(x_shape) - 1,)
    nrows_dims = x_shape[: len(x_shape) - len(axes)]
    red_shape = x_shape[len(nrows_dims) :]
    rows, n = size_of(nrows_dims), size_of(red_shape)
    k = KernelSource("row", inline, wide)
    k.row_shapes = {"row": x_shape}
    if nrows_dims:
        k.row_shapes["col"] = red_shape
    warp_mode = n <= 1024
    # a grid-stride loop over rows: the grid is capped (MAX_GRID blocks), so rows past
    # grid * rows-per-block are taken by the same warps / blocks on later iterations
    it, lit = k.idx_t, k.lit
    per_warp, row_head = 1, []
    if warp_mode:
        block = 256 if cols else 128
        nt = _lanes(n, cols)
        per_warp = 32 // nt  # rows per warp: sub-groups of nt lanes, one row each
        grid = _grid(rows, block // 32 * per_warp)
        head = [f"const int tid = threadIdx.x & {nt - 1};", f"const int nt = {nt};"]
        row_loop = (
            f"for ({it} row = ({it})blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);"
            f" row < {rows}{lit}; row += ({it})gridDim.x * (blockDim.x >> 5)) {{"
        )
        if per_warp > 1:  # the loop stays uniform across the warp (its shuffles need all
            # 32 lanes); a sub-group past the last row computes nothing
            head.append(f"const int sub = (threadIdx.x & 31) / {nt};")
            row_loop = (
                f"for ({it} row0 = (({it})blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5))"
                f" * {per_warp}; row0 < {rows}{lit};"
                f" row0 += ({it})gridDim.x * (blockDim.x >> 5) * {per_warp}) {{"
            )
            row_head = [f"const {it} row = row0 + sub;", f"const bool valid = row < {rows}{lit};"]
    else:
        block = nt = _row_block(n)
        grid = _grid(rows, 1)
        # the block size is a constant of the kernel, so loops over a row unroll
        head = ["const int tid = threadIdx.x;", f"const int nt = {block};"]
        row_loop = f"for ({k.idx_t} row = blockIdx.x; row < {rows}{k.lit}; row += gridDim.x) {{"
    if cols:  # two rows per warp (block) at least, so fewer partial rows to combine
        grid = min(-(-rows // (2 * (block // 32 if warp_mode else 1))), COL_GRID)
    chunks = -(-n // (nt * vec))
    chunked = bool(cached or cols)  # loops over this thread's chunks of the row
    guard = "valid && " if per_warp > 1 else ""
    body = list(head)
    inner = list(row_head)
    reg_lines = []  # (line after the register's definition, register, renderer)
    rb = Builder(k)
    row_idx = [rb.index_tmp(e) for e in delinearize("row", nrows_dims, k.lit)] if nrows_dims else []
    inner += rb.lines

    def chunk_loop(lines, guard=guard):
        """`lines` for each chunk of `vec` elements this thread owns (first: `jv`)."""
        return [
            "#pragma unroll",
            f"for (int c = 0; c < {chunks}; ++c) {{",
            f"  const {it} jv = ({it})(tid + c * nt) * {vec};",
            f"  if ({guard}jv < {n}{lit}) {{",
        ] + _indent(lines, 2) + ["  }", "}"]  # fmt: skip

    def cache_loads(kind):
        lines = []
        for v in cached:
            if v.aval.shape != k.row_shapes[kind] or kind == "col" and v.aval.shape == x_shape:
                continue
            name, r = k.row_cache[v], renderer_for(v.aval.dtype)
            src = k.input(v)
            base = f"({src} + row * {n}{lit})" if kind == "row" else src
            lines.append(f"{r.compute} {name}[{chunks * vec}];")
            if vec == 1:
                load = [f"{name}[c] = {r.load(f'{base}[jv]')};"]
            else:
                vt = _vector_type(np.dtype(v.aval.dtype).itemsize * vec)
                st = storage_ctype(v.aval.dtype)
                load = [
                    f"const {vt} raw = ((const {vt}*){base})[tid + c * nt];",
                    f"const {st}* rv = (const {st}*)&raw;",
                    "#pragma unroll",
                    f"for (int l = 0; l < {vec}; ++l) {name}[c * {vec} + l] = {r.load('rv[l]')};",
                ]
            lines += chunk_loop(load, guard if kind == "row" else "")
        return lines

    def elem_loop(fill, stores=()):
        b = Builder(k)
        jdx = delinearize("j", red_shape, k.lit) if red_shape else []
        if len(red_shape) > 1:
            jdx = [b.index_tmp(e) for e in jdx]
        b.canon = {tuple(row_idx + jdx): "row"}
        if nrows_dims:
            b.canon[tuple(jdx)] = "col"
        if not chunked:
            lines = fill(b, row_idx + jdx)
            return (
                ["#pragma unroll 4", f"for ({it} j = tid; {guard}j < {n}{lit}; j += nt) {{"]
                + _indent(b.lines + lines)
                + ["}"]
            )
        b.slot = slot
        lines = fill(b, row_idx + jdx)
        pre, post = [], []
        for v, name in stores:  # vector stores of the outputs
            vt = _vector_type(np.dtype(v.aval.dtype).itemsize * vec)
            st = storage_ctype(v.aval.dtype)
            pre += [f"{vt} {name}_raw;", f"{st}* {name}_v = ({st}*)&{name}_raw;"]
            post.append(f"(({vt}*)({name} + row * {n}{lit}))[tid + c * nt] = {name}_raw;")
        if vec == 1:
            return chunk_loop([f"const {it} j = jv;"] + b.lines + lines)
        per = ["#pragma unroll", f"for (int l = 0; l < {vec}; ++l) {{"]
        per += _indent([f"const {it} j = jv + l;"] + b.lines + lines) + ["}"]
        return chunk_loop(pre + per + post)

    for i, v in enumerate(cached):
        k.row_cache[v] = f"xc{i}"
    slot = f"(c * {vec} + l)" if vec > 1 else "c"
    col_reds = [_col_reduction(c) for c in cols]
    for i, red in enumerate(col_reds):  # per-thread column accumulators, across rows
        body += [f"{red.acc} ca{i}[{chunks * vec}];", "#pragma unroll",
                 f"for (int s = 0; s < {chunks * vec}; ++s) ca{i}[s] = {red.init};"]  # fmt: skip
    body += cache_loads("col") if nrows_dims else []
    inner += cache_loads("row")

    online = {} if cached else _online_pairs(reductions, inline)
    if not chunked:
        slot = None
    for group in _passes(reductions, online, inline):
        r_i = group[0]
        eqn = reductions[r_i]
        if r_i in online:
            inner += _online_max_sum(
                k, eqn, reductions[r_i + 1], elem_loop, warp_mode, r_i, online[r_i], nt
            )
            for i in (r_i, r_i + 1):
                reg_lines.append((len(inner), f"red{i}", renderer_for(eqn.inputs[0].aval.dtype)))
                k.special[reductions[i].outputs[0]] = f"red{i}"
            continue
        # reductions that do not read each other share one loop over the row
        # (layernorm's sum(x) and sum(x*x); the backward's two sums)
        parts = []
        for r_i in group:
            eqn = reductions[r_i]
            src = eqn.inputs[0]
            red = Reduction(eqn.primitive.name, src.aval.dtype, eqn.outputs[0].aval.dtype)
            acc, ids = f"acc{r_i}", f"ids{r_i}"
            comb_fn = red.arg_helper(k) if red.is_arg else None
            inner.append(f"{red.acc} {acc} = {red.init};")
            if red.is_arg:
                inner.append(f"long long {ids} = -1;")
            parts.append((r_i, eqn, src, red, acc, ids, comb_fn))

        def fill(b, idx, parts=parts):
            lines = []
            for _, _, src, red, acc, ids, fn in parts:
                lines += _accumulate(k, red, b, b.value(src, idx), acc, ids, "j", fn)
            return lines

        inner += elem_loop(fill)
        for r_i, eqn, _, red, acc, ids, comb_fn in parts:
            if warp_mode:
                inner += _warp_allreduce(red, acc, ids, comb_fn, width=nt)
            else:
                inner += _block_allreduce(red, acc, str(r_i), ids, comb_fn)
            result = red.result(ids if red.is_arg else acc)
            reg = f"red{r_i}"
            inner.append(f"const {red.out_r.compute} {reg} = {result};")
            reg_lines.append((len(inner), reg, red.out_r))
            k.special[eqn.outputs[0]] = reg
    out_names = [(v, k.output(v)) for v in elem_outputs + row_outputs]
    if row_outputs:
        b = Builder(k)
        stores = []
        for v, name in out_names[len(elem_outputs) :]:
            idx = row_idx + ["0"] * (v.aval.ndim - len(row_idx))
            val = b.value(v, idx)
            stores.append(f"{name}[row] = {renderer_for(v.aval.dtype).store(val)};")
        valid = " && valid" if per_warp > 1 else ""
        inner += [f"if (tid == 0{valid}) {{"] + _indent(b.lines + stores) + ["}"]
    if elem_outputs or cols:
        vec_out = chunked and vec > 1 and bool(elem_outputs)

        def fill(b, idx):
            out = []
            for i, (c, red) in enumerate(zip(cols, col_reds)):
                val = red.to_acc(b.value(c.inputs[0], idx))
                out.append(f"ca{i}[{slot}] = {red.comb(f'ca{i}[{slot}]', val)};")
            for v, name in out_names[: len(elem_outputs)]:
                val = renderer_for(v.aval.dtype).store(b.value(v, idx))
                out.append(
                    f"{name}_v[l] = {val};" if vec_out else f"{name}[row * {n}{lit} + j] = {val};"
                )
            return out

        inner += elem_loop(fill, out_names[: len(elem_outputs)] if vec_out else ())
    for at, reg, out_r in reversed(reg_lines):
        if reg in k.reciprocals:
            inner.insert(at, f"const {out_r.compute} {reg}_inv = {out_r.lit(1)} / {reg};")
    body += [row_loop] + _indent(inner) + ["}"]
    k.partials = []
    for i, red in enumerate(col_reds):
        part = Var(ShapedArray((grid, n), ACC_DTYPES[red.acc]))
        k.partials.append(part)
        pname = k.output(part)
        each = [
            "#pragma unroll",
            f"for (int l = 0; l < {vec}; ++l) {{",
            f"  const {it} j = jv + l;",
        ]
        if warp_mode:  # the block's warps in order through shared memory, then one row
            add = red.comb(f"cp{i}[j]", f"ca{i}[{slot}]")
            body += [f"__shared__ {red.acc} cp{i}[{n}];",
                     f"for (int w = 0; w < {block // 32}; ++w) {{",
                     "  if ((int)(threadIdx.x >> 5) == w) {"]  # fmt: skip
            body += _indent(
                chunk_loop(each + [f"  cp{i}[j] = w == 0 ? ca{i}[{slot}] : {add};", "}"]), 2
            )
            body += ["  }", "  __syncthreads();", "}",
                     f"for (int j = threadIdx.x; j < {n}; j += blockDim.x)",
                     f"  {pname}[({it})blockIdx.x * {n}{lit} + j] = cp{i}[j];"]  # fmt: skip
        else:
            store = f"  {pname}[({it})blockIdx.x * {n}{lit} + j] = ca{i}[{slot}];"
            body += chunk_loop(each + [store, "}"])
    return k.finish(body, grid, block), k


# ops that pass a row value through unchanged (to the broadcast over the row)
_ROW_VIEWS = (broadcast_in_dim_p, reshape_p, squeeze_p, stop_gradient_p, copy_p, sbp_constraint_p)


def _passes(reductions, online, inline):
    """The reductions grouped into passes over the row: a reduction joins the current
    pass unless its input reads a result of that pass (or it is an online pair)."""
    passes = []
    for i, e in enumerate(reductions):
        if i - 1 in online:
            continue
        if i in online or not passes or passes[-1][0] in online:
            passes.append([i])
            continue
        current = {reductions[j].outputs[0] for j in passes[-1]}
        if _reads(e.inputs[0], current, inline):
            passes.append([i])
        else:
            passes[-1].append(i)
    return passes


def _reads(root, targets, inline):
    seen, stack = set(), [root]
    while stack:
        v = stack.pop()
        if type(v) is Literal or v in seen:
            continue
        seen.add(v)
        if v in targets:
            return True
        e = inline.get(v)
        if e is not None:
            stack.extend(e.inputs)
    return False


def _online_pairs(reductions, inline):
    """Indices i where reductions i, i+1 are max(a) and sum(exp(a - max(a))) in f32/f64.

    Such a pair needs one pass over the row instead of two: each thread keeps a
    running max m and the sum s of exp(a - m), rescaling s when m grows.
    """
    pairs = {}
    for i in range(len(reductions) - 1):
        mx, sm = reductions[i], reductions[i + 1]
        if i - 1 in pairs or mx.primitive.name != "reduce_max":
            continue
        a = mx.inputs[0]
        if sm.primitive.name != "reduce_sum" or np.dtype(a.aval.dtype) not in (
            np.float32,
            np.float64,
        ):
            continue
        e = inline.get(sm.inputs[0])
        d = inline.get(e.inputs[0]) if e is not None and e.primitive is exp_p else None
        if d is None or d.primitive.name != "sub" or d.inputs[0] is not a:
            continue
        mode = _shift_of(d.inputs[1], mx.outputs[0], inline)
        if mode and sm.outputs[0].aval.dtype == a.aval.dtype:
            pairs[i] = mode
    return pairs


def _shift_of(r, m, inline):
    """How the subtracted row value `r` is made of the max `m`: "max" (m itself, through
    broadcasts / reshapes), "finite" (logsumexp's `where(isfinite(m), m, 0)`) or None."""
    mode = "max"
    while r is not m and type(r) is not Literal:
        pe = inline.get(r)
        if pe is None:
            return None
        if pe.primitive in _ROW_VIEWS:
            r = pe.inputs[0]
            continue
        if mode != "max" or pe.primitive.name != "select_n" or len(pe.inputs) != 3:
            return None
        w, zero, val = pe.inputs
        we = inline.get(w) if type(w) is not Literal else None
        if we is None or we.primitive.name != "is_finite" or we.inputs[0] is not val:
            return None
        while type(zero) is not Literal and zero in inline:
            ze = inline[zero]
            if ze.primitive not in _ROW_VIEWS:
                return None
            zero = ze.inputs[0]
        if type(zero) is not Literal or np.asarray(zero.value) != 0:
            return None
        mode, r = "finite", val
    return mode if r is m else None


def _online_max_sum(k, mx, sm, elem_loop, warp_mode, r_i, mode, width=32):
    """Lines computing `red{r_i}` = max(a) and `red{r_i+1}` = sum(exp(a - max)) in one pass."""
    r = renderer_for(mx.inputs[0].aval.dtype)
    t, ex = r.compute, r.code_for_op["exp"]
    m, s = f"m{r_i}", f"s{r_i}"

    def merge(m2, s2):  # (m, s) += (m2, s2); exact rescaling skipped when a max is unchanged
        return [
            f"{{ const {t} mn = fflow_max<{t}>({m}, {m2});",
            f"  {s} = ({m} == mn ? {s} : {s} * {ex(f'{m} - mn')})"
            f" + ({m2} == mn ? {s2} : {s2} * {ex(f'{m2} - mn')});",
            f"  {m} = mn; }}",
        ]

    lines = [f"{t} {m} = {r.lit(-np.inf)};", f"{t} {s} = {r.lit(0)};"]
    lines += elem_loop(lambda b, idx: merge(b.value(mx.inputs[0], idx), r.lit(1)))
    shfl = "__shfl_xor_sync(0xffffffffu, {}, o)"
    lines += [f"for (int o = {min(width, 32) // 2}; o > 0; o >>= 1) {{"]
    lines += _indent(
        [f"const {t} om = {shfl.format(m)}, os = {shfl.format(s)};"] + merge("om", "os")
    )
    lines += ["}"]
    if not warp_mode:
        tag = f"o{r_i}"
        lines += [
            f"__shared__ {t} sm_{tag}[32], ss_{tag}[32];",
            f"if ((threadIdx.x & 31) == 0) {{ sm_{tag}[threadIdx.x >> 5] = {m}; "
            f"ss_{tag}[threadIdx.x >> 5] = {s}; }}",
            "__syncthreads();",
            f"{m} = sm_{tag}[0]; {s} = ss_{tag}[0];",
            "for (int w = 1; w < (int)(blockDim.x >> 5); ++w)",
        ]
        lines += _indent(merge(f"sm_{tag}[w]", f"ss_{tag}[w]")) + ["__syncthreads();"]
    inf, ninf = r.lit(np.inf), r.lit(-np.inf)
    if mode == "max":  # an infinite max makes some exp(a - max) NaN (inf - inf)
        total = f"({m} == {inf} || {m} == {ninf}) ? {r.lit(np.nan)} : {s}"
    else:  # the shift is 0 when the max is not finite: sum(exp(a)) is 0 or inf
        total = f"{m} == {ninf} ? {r.lit(0)} : {m} == {inf} ? {inf} : {s}"
    return lines + [f"const {t} red{r_i} = {m};", f"const {t} red{r_i + 1} = {total};"]


def split_count(eqn):
    """How many slices of the reduced axes a strided reduction is split into (1: none).

    Few outputs over a long reduction (a bias gradient: sum over the batch) would
    leave most of a GPU idle with one thread per output; slices run in parallel and
    a second small kernel combines them.
    """
    if eqn.primitive in (argmax_p, argmin_p):
        return 1
    shape = eqn.inputs[0].aval.shape
    axes = eqn.params["axes"]
    m = size_of([d for i, d in enumerate(shape) if i not in axes])
    kn = size_of([shape[i] for i in axes])
    if m >= 32768 or kn < 256:
        return 1
    return int(min(kn // 64, max(1, 65536 // max(m, 1)), 512))


def strided_reduce_kernel(eqn, inline, wide=False, partial_var=None):
    """Reduce any axes: one thread per output element loops over the reduced ones.

    With `partial_var` (shape (S, outputs), the accumulator dtype) the reduced axes
    are cut in S slices, one per blockIdx.y, each writing its partial result.
    """
    src = eqn.inputs[0]
    axes = tuple(eqn.params["axes"])
    shape = src.aval.shape
    kept = [i for i in range(len(shape)) if i not in axes]
    out_shape = tuple(shape[i] for i in kept)
    red_shape = tuple(shape[i] for i in axes)
    m, kn = size_of(out_shape), size_of(red_shape)
    red = Reduction(eqn.primitive.name, src.aval.dtype, eqn.outputs[0].aval.dtype)
    k = KernelSource("red", inline, wide)
    comb_fn = red.arg_helper(k) if red.is_arg else None
    out = k.output(partial_var if partial_var is not None else eqn.outputs[0])
    b = Builder(k)
    oidx = [b.index_tmp(e) for e in delinearize("o", out_shape, k.lit)]
    head = list(b.lines)
    b2 = Builder(k)
    ridx = [b2.index_tmp(e) for e in delinearize("r", red_shape, k.lit)]
    full = [None] * len(shape)
    for i, e in zip(kept, oidx):
        full[i] = e
    for i, e in zip(axes, ridx):
        full[i] = e
    val = b2.value(src, full)
    acc_line = _accumulate(k, red, b2, val, "acc", "ids", "r", comb_fn)
    body = [_grid_loop("o", "", f"{m}{k.lit}", k.idx_t)]
    inner = head + [f"{red.acc} acc = {red.init};"]
    if red.is_arg:
        inner.append("long long ids = -1;")
    if partial_var is None:
        grid = _grid(m)
        r0, r1 = "0", f"{kn}{k.lit}"
    else:
        nsplit = partial_var.aval.shape[0]
        chunk = -(-kn // nsplit)
        grid = (_grid(m), nsplit)
        r0 = f"({k.idx_t})blockIdx.y * {chunk}{k.lit}"
        r1 = f"({r0} + {chunk}{k.lit} < {kn}{k.lit} ? {r0} + {chunk}{k.lit} : {kn}{k.lit})"
    loop = f"for ({k.idx_t} r = {r0}; r < {r1}; ++r) {{"
    inner += [loop] + _indent(b2.lines + acc_line) + ["}"]
    if partial_var is None:
        res = red.result("ids" if red.is_arg else "acc")
        inner.append(f"{out}[o] = {red.out_r.store(res)};")
    else:
        inner.append(f"{out}[({k.idx_t})blockIdx.y * {m}{k.lit} + o] = acc;")
    body += _indent(inner) + ["}"]
    return k.finish(body, grid, BLOCK)


def combine_partials_kernel(eqn, partial_var, wide=False):
    """The second pass of a split reduction: combine the S partials of every output."""
    src = eqn.inputs[0]
    red = Reduction(eqn.primitive.name, src.aval.dtype, eqn.outputs[0].aval.dtype)
    nsplit, m = partial_var.aval.shape
    k = KernelSource("red2", {}, wide)
    pin = k.input(partial_var)
    out = k.output(eqn.outputs[0])
    body = [_grid_loop("o", "", f"{m}{k.lit}", k.idx_t)]
    inner = [f"{red.acc} acc = {red.init};"]
    inner.append(
        f"for (int s = 0; s < {nsplit}; ++s) acc = {red.comb('acc', f'{pin}[s * {m}{k.lit} + o]')};"
    )
    inner.append(f"{out}[o] = {red.out_r.store(red.result('acc'))};")
    body += _indent(inner) + ["}"]
    return k.finish(body, _grid(m), BLOCK)


def full_reduce_kernels(eqn, inline, partial_var, wide=False):
    """Two passes for a reduction to one value: per-block partials, then one block."""
    src = eqn.inputs[0]
    n = size_of(src.aval.shape)
    red = Reduction(eqn.primitive.name, src.aval.dtype, eqn.outputs[0].aval.dtype)
    nblocks = partial_var.aval.shape[0]
    k = KernelSource("sum1", inline, wide)
    part = k.output(partial_var)
    b = Builder(k)
    idx = delinearize("i", src.aval.shape, k.lit)
    if len(idx) > 1:
        idx = [b.index_tmp(e) for e in idx]
    val = b.value(src, idx)
    body = [f"{red.acc} acc = {red.init};", _grid_loop("i", "", f"{n}{k.lit}", k.idx_t)]
    body += _indent(b.lines + [f"acc = {red.comb('acc', red.to_acc(val))};"]) + ["}"]
    body += _block_allreduce(red, "acc", "p")
    body.append(f"if (threadIdx.x == 0) {part}[blockIdx.x] = acc;")
    pass1 = k.finish(body, nblocks, 1024)
    k2 = KernelSource("sum2", {})
    pin = k2.input(partial_var)
    out = k2.output(eqn.outputs[0])
    body = [f"{red.acc} acc = {red.init};",
            f"for (int i = threadIdx.x; i < {nblocks}; i += blockDim.x)",
            f"  acc = {red.comb('acc', f'{pin}[i]')};"]  # fmt: skip
    body += _block_allreduce(red, "acc", "q")
    body.append(f"if (threadIdx.x == 0) {out}[0] = {red.out_r.store(red.result('acc'))};")
    pass2 = k2.finish(body, 1, 1024)
    return [pass1, pass2]


def cumulative_kernel(eqn, inline, wide=False):
    """Inclusive scan along one axis: a block per line, Hillis-Steele in shared memory."""
    src = eqn.inputs[0]
    axis, reverse = eqn.params["axis"], eqn.params.get("reverse", False)
    shape = src.aval.shape
    length = shape[axis]
    lines_shape = shape[:axis] + shape[axis + 1 :]
    nlines = size_of(lines_shape)
    red = Reduction(CUMULATIVE[eqn.primitive], src.aval.dtype, src.aval.dtype)
    block = 32
    while block < min(length, 1024):
        block *= 2
    k = KernelSource("scan", inline, wide)
    out = k.output(eqn.outputs[0])
    b0 = Builder(k)
    lidx = [b0.index_tmp(e) for e in delinearize("line", lines_shape, k.lit)]
    b = Builder(k)
    pos = f"({length - 1} - kk)" if reverse else "kk"
    full = lidx[:axis] + [pos] + lidx[axis:]
    val = b.value(src, full, guard=True)
    lin = linear(full, shape, k.lit)
    body = [
        f"__shared__ {red.acc} buf[2][{block}];",
        f"for ({k.idx_t} line = blockIdx.x; line < {nlines}{k.lit}; line += gridDim.x) {{",
    ]
    inner = b0.lines + [f"{red.acc} carry = {red.init};"]
    inner += [f"for ({k.idx_t} c0 = 0; c0 < {length}{k.lit}; c0 += blockDim.x) {{"]
    chunk = [
        f"const {k.idx_t} kk = c0 + threadIdx.x;",
        f"{red.acc} v = {red.init};",
        f"if (kk < {length}{k.lit}) v = {red.to_acc(val)};",
        "int s = 0;",
        "buf[0][threadIdx.x] = v;",
        "__syncthreads();",
        "for (int off = 1; off < (int)blockDim.x; off <<= 1) {",
        f"  {red.acc} t = buf[s][threadIdx.x];",
        f"  if ((int)threadIdx.x >= off) t = {red.comb('buf[s][threadIdx.x - off]', 't')};",
        "  buf[1 - s][threadIdx.x] = t;",
        "  s = 1 - s;",
        "  __syncthreads();",
        "}",
        f"v = {red.comb('carry', 'buf[s][threadIdx.x]')};",
        f"if (kk < {length}{k.lit}) {out}[{lin}] = {red.out_r.store(red.result('v'))};",
        f"carry = {red.comb('carry', 'buf[s][blockDim.x - 1]')};",
        "__syncthreads();",
    ]
    inner += _indent(chunk) + ["}"]
    body += _indent(inner) + ["}"]
    return k.finish(body, max(1, min(nlines, MAX_GRID)), block)
