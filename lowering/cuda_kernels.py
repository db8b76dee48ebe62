"""CUDA C kernel generation: fused elementwise groups, reductions, row-fused softmax /
layernorm patterns, cumulative scans and scatters.

Values are rendered *at an index*: `Builder.value(var, idx)` returns a C expression
for element `idx` (a list of C index expressions) of `var`. An external buffer is
a load; an equation that may be inlined is rendered from its inputs rendered at the
indices its semantics ask for. Broadcasting, reshape, transpose, slices, pads,
concatenation, gathers, dynamic slices and counter-based random bits are index
arithmetic, so all of them fuse into whatever kernel consumes them. Shapes are
compile-time constants (the divisions by them compile to multiplications).
"""

import hashlib

import numpy as np
from fflow.lowering.cuda_render import PREAMBLE, Renderer, renderer_for, storage_ctype
from fflow.primitives.along_axis import scatter_add_along_axis_p, take_along_axis_p
from fflow.primitives.binary import div_p
from fflow.primitives.compare import select_n_p
from fflow.primitives.convert import bitcast_convert_type_p, convert_element_type_p
from fflow.primitives.cumulative import cummax_p, cummin_p, cumprod_p, cumsum_p
from fflow.primitives.indexing import (
    dynamic_slice_p,
    dynamic_update_slice_p,
    gather_p,
    scatter_add_p,
    scatter_max_p,
    scatter_min_p,
    scatter_mul_p,
    scatter_p,
)
from fflow.primitives.random_bits import random_bits_p, random_fold_in_p
from fflow.primitives.reduction import (
    argmax_p,
    argmin_p,
    reduce_and_p,
    reduce_max_p,
    reduce_min_p,
    reduce_or_p,
    reduce_prod_p,
    reduce_sum_p,
)
from fflow.primitives.sbp_constraint import sbp_constraint_p
from fflow.primitives.shape import (
    broadcast_in_dim_p,
    concatenate_p,
    iota_p,
    pad_p,
    reshape_p,
    rev_p,
    slice_p,
    squeeze_p,
    transpose_p,
)

from fflow.core import Literal

BLOCK = 256
MAX_GRID = 65535 * 16

ELEMENTWISE = set(Renderer(np.float32).code_for_op) | {
    "and",
    "or",
    "xor",
    "not",
    "shift_left",
    "shift_right_logical",
    "shift_right_arithmetic",
    "select_n",
    "convert_element_type",
    "bitcast_convert_type",
    "population_count",
}
REDUCTIONS = {
    reduce_sum_p,
    reduce_prod_p,
    reduce_max_p,
    reduce_min_p,
    reduce_or_p,
    reduce_and_p,
    argmax_p,
    argmin_p,
}
CUMULATIVE = {cumsum_p: "reduce_sum", cumprod_p: "reduce_prod", cummax_p: "reduce_max",
              cummin_p: "reduce_min"}  # fmt: skip
SCATTERS = {scatter_p: "set", scatter_add_p: "add", scatter_mul_p: "mul", scatter_min_p: "min",
            scatter_max_p: "max", scatter_add_along_axis_p: "add"}  # fmt: skip


def size_of(shape):
    return int(np.prod(shape, dtype=np.int64))


def is_fusible(eqn):
    """Can this equation be rendered inline at an index (elementwise or index arithmetic)?"""
    name = eqn.primitive.name
    if name not in ELEMENTWISE and eqn.primitive not in INDEX_OPS:
        return False
    from fflow.lowering.cuda_render import supported_dtype

    return all(supported_dtype(v.aval.dtype) for v in list(eqn.inputs) + list(eqn.outputs))


# -- index arithmetic ----------------------------------------------------------------------


def _mul(a, c, lit):
    if c == 1:
        return a
    if a == "0":
        return "0"
    return f"{a} * {c}{lit}"


def linear(idx, shape, lit=""):
    """Row-major linear offset of multi-index `idx` in `shape`."""
    terms = []
    stride = 1
    for i, d in reversed(list(enumerate(shape))):
        if d != 1 and idx[i] != "0":
            terms.append(_mul(f"({idx[i]})", stride, lit))
        stride *= d
    return " + ".join(reversed(terms)) if terms else "0"


def delinearize(i, shape, lit=""):
    """The multi-index (C expressions) of linear offset `i` in `shape`."""
    out = []
    stride = size_of(shape)
    for d in shape:
        stride //= d if d else 1
        if d == 1:
            out.append("0")
            continue
        e = f"({i})" if stride == 1 else f"(({i}) / {stride}{lit})"
        if stride * d < size_of(shape):
            e = f"({e} % {d}{lit})"
        out.append(e)
    return out


# -- rendering ------------------------------------------------------------------------------


class Builder:
    """Renders values at indices into C statements (one scope: a loop body)."""

    def __init__(self, kernel, flat=None):
        self.k = kernel  # the KernelSource collecting parameters
        self.lines = []
        self.cache = {}
        self.flat = flat  # iteration size when every value is indexed linearly
        self.lane = None  # vector lane: external loads come from per-lane registers
        self.lane_idx = None  # (not flat) the lane's element: vector registers hold it
        self.canon = None  # row kernels: {index tuple: kind} of this loop's element
        self.slot = None  # row kernels: C expression of this element's cache slot

    def row_slot(self, v, idx):
        """The row-cache register holding `v` at `idx`, or None (a load from memory).

        Row kernels read each row (and per-column operands like layernorm's gamma)
        from memory once into registers; every later pass over the row reads those.
        """
        if self.canon is None:
            return None
        kind = self.canon.get(tuple(idx))
        if kind is None or v.aval.shape != self.k.row_shapes.get(kind):
            if kind is None and v.aval.shape in self.k.row_shapes.values():
                self.k.other_reads.add(v)  # read at another element too
            return None
        self.k.canonical_reads.setdefault(v, set()).add(id(self))
        name = self.k.row_cache.get(v)
        return None if name is None else f"{name}[{self.slot}]"

    def tmp(self, ctype, expr):
        name = f"t{self.k.fresh()}"
        self.lines.append(f"{ctype} {name} = {expr};")
        return name

    def lin(self, idx, shape):
        if self.flat is not None and shape and size_of(shape) == self.flat:
            return idx[0]
        return linear(idx, shape, self.k.lit)

    def value(self, v, idx, guard=False):
        """C expression (compute type of v's dtype) for element `idx` of `v`."""
        if type(v) is Literal:
            return renderer_for(v.aval.dtype).lit(np.asarray(v.value).item())
        special = self.k.special.get(v)
        if special is not None:
            return special
        idx = list(idx)
        if self.flat is not None and v.aval.ndim and size_of(v.aval.shape) == self.flat:
            idx = idx[:1]
        key = (v, tuple(idx))
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        r = renderer_for(v.aval.dtype)
        eqn = self.k.inline.get(v)
        if eqn is None:
            slot = self.row_slot(v, idx)
            if slot is not None:
                return slot  # a register of the row cache (row kernels)
            name = self.k.input(v)
            if (
                self.lane is not None
                and v.aval.ndim
                and v in self.k.vector_inputs
                and (self.flat is not None or tuple(idx) == self.lane_idx)
            ):
                expr = r.load(f"{name}_v[{self.lane}]")
            else:
                expr = r.load(f"{name}[{self.lin(idx, v.aval.shape)}]")
        else:
            expr = render_eqn(self, eqn, idx, guard)
        if guard:
            return expr
        name = self.tmp(r.compute, expr)
        self.cache[key] = name
        return name

    def index_tmp(self, expr):
        return self.tmp(self.k.idx_t, expr)


def _at(b, v, idx, guard):
    return b.value(v, idx if v.aval.ndim else [], guard)


def render_eqn(b, eqn, idx, guard):
    name = eqn.primitive.name
    p = eqn.params
    ins = eqn.inputs
    out = eqn.outputs[0].aval
    r = renderer_for(out.dtype)
    prim = eqn.primitive
    if prim is select_n_p:
        which, *cases = ins
        w = _at(b, which, idx, guard)
        vals = [_at(b, c, idx, guard) for c in cases]
        if len(cases) == 1:
            return vals[0]
        if which.aval.dtype == np.bool_:
            return f"({w} ? {vals[1]} : {vals[0]})"
        expr = vals[-1]
        for k in range(len(cases) - 2, -1, -1):
            expr = f"({w} <= {k} ? {vals[k]} : {expr})"
        return expr
    if prim is convert_element_type_p:
        x = ins[0]
        return r.cast_from(_at(b, x, idx, guard), renderer_for(x.aval.dtype))
    if prim is bitcast_convert_type_p:  # stored bits of one width reread as the other dtype
        src = renderer_for(ins[0].aval.dtype)
        bits = src.store(_at(b, ins[0], idx, guard))
        return r.load(f"fflow_bitcast<{r.ctype}>(({src.ctype})({bits}))")
    if prim is div_p and out.dtype in (np.float32, np.float64):
        # dividing by a per-row register (softmax's sum, a norm): multiply by its
        # reciprocal, computed once per row (<= 1.5 ulp from the quotient)
        reg = _row_register(b, ins[1])
        if reg is not None:
            b.k.reciprocals.add(reg)
            return f"({_at(b, ins[0], idx, guard)} * {reg}_inv)"
    if name in ELEMENTWISE:
        in_r = renderer_for(ins[0].aval.dtype)
        args = [_at(b, x, idx, guard) for x in ins]
        return r.round(in_r.code_for_op[name](*args, **p))
    return INDEX_RULES[eqn.primitive](b, eqn, idx, guard)


def _row_register(b, v):
    """The row register `v` is (through broadcasts / reshapes), or None."""
    while True:
        if type(v) is Literal:
            return None
        reg = b.k.special.get(v)
        if reg is not None:
            return reg
        eqn = b.k.inline.get(v)
        if eqn is None or eqn.primitive not in (broadcast_in_dim_p, reshape_p):
            return None
        v = eqn.inputs[0]


def _broadcast(b, eqn, idx, guard):
    (x,) = eqn.inputs
    in_idx = [
        "0" if x.aval.shape[src] == 1 else idx[dst]
        for src, dst in enumerate(eqn.params["broadcast_dimensions"])
    ]
    return _at(b, x, in_idx, guard)


def _reshape(b, eqn, idx, guard):
    (x,) = eqn.inputs
    in_shape = x.aval.shape
    out_shape = eqn.outputs[0].aval.shape
    if [d for d in in_shape if d != 1] == [d for d in out_shape if d != 1]:
        # only unit dims move: map the non-unit dims one to one
        it = iter(i for i, d in zip(idx, out_shape) if d != 1)
        return _at(b, x, ["0" if d == 1 else next(it) for d in in_shape], guard)
    flat = linear(idx, out_shape, b.k.lit)
    if not guard:
        flat = b.index_tmp(flat)
    return _at(b, x, delinearize(flat, in_shape, b.k.lit), guard)


def _squeeze(b, eqn, idx, guard):
    (x,) = eqn.inputs
    dims = set(eqn.params["dimensions"])
    it = iter(idx)
    return _at(b, x, ["0" if i in dims else next(it) for i in range(x.aval.ndim)], guard)


def _transpose(b, eqn, idx, guard):
    (x,) = eqn.inputs
    in_idx = [None] * x.aval.ndim
    for i, pdim in enumerate(eqn.params["permutation"]):
        in_idx[pdim] = idx[i]
    return _at(b, x, in_idx, guard)


def _rev(b, eqn, idx, guard):
    (x,) = eqn.inputs
    dims = set(eqn.params["dimensions"])
    shape = x.aval.shape
    return _at(
        b, x, [f"({shape[i] - 1} - {e})" if i in dims else e for i, e in enumerate(idx)], guard
    )


def _slice(b, eqn, idx, guard):
    (x,) = eqn.inputs
    starts = eqn.params["start_indices"]
    strides = eqn.params["strides"] or (1,) * x.aval.ndim
    in_idx = []
    for e, s, st in zip(idx, starts, strides):
        e2 = e if st == 1 else f"{e} * {st}"
        in_idx.append(e2 if s == 0 else f"({s} + {e2})")
    return _at(b, x, in_idx, guard)


def _pad(b, eqn, idx, guard):
    x, pv = eqn.inputs
    conds, in_idx = [], []
    for e, n, (lo, _, it) in zip(idx, x.aval.shape, eqn.params["padding_config"]):
        t = e if lo == 0 else f"(({e}) - ({lo}))"
        if it:
            conds.append(f"{t} >= 0 && {t} % {it + 1} == 0 && {t} / {it + 1} < {n}")
            in_idx.append(f"{t} / {it + 1}")
        else:
            conds.append(f"{t} >= 0 && {t} < {n}")
            in_idx.append(t)
    pad_value = _at(b, pv, [], guard)
    if size_of(x.aval.shape) == 0:
        return pad_value
    inner = _at(b, x, in_idx, True)
    return f"(({' && '.join(conds)}) ? {inner} : {pad_value})"


def _concatenate(b, eqn, idx, guard):
    d = eqn.params["dimension"]
    parts = [(x, x.aval.shape[d]) for x in eqn.inputs if x.aval.shape[d] > 0]
    offsets = np.cumsum([0] + [n for _, n in parts])
    expr = None
    for k in range(len(parts) - 1, -1, -1):
        x, _ = parts[k]
        sub = list(idx)
        if offsets[k]:
            sub[d] = f"({idx[d]} - {offsets[k]})"
        val = _at(b, x, sub, True)
        expr = val if expr is None else f"({idx[d]} < {offsets[k + 1]} ? {val} : {expr})"
    return expr


def _iota(b, eqn, idx, guard):
    r = renderer_for(eqn.params["dtype"])
    return f"({r.compute})({idx[eqn.params['dimension']]})"


def _clamped_starts(b, starts, shape, sizes, guard):
    out = []
    for s, d, n in zip(starts, shape, sizes):
        e = f"fflow_clamp((long long)({_at(b, s, [], guard)}), 0LL, {d - n}LL)"
        out.append(e if guard else b.tmp("long long", e))
    return out


def _dynamic_slice(b, eqn, idx, guard):
    x, *starts = eqn.inputs
    st = _clamped_starts(b, starts, x.aval.shape, eqn.params["slice_sizes"], guard)
    in_idx = [f"(({b.k.idx_t})({s}) + {e})" for s, e in zip(st, idx)]
    return _at(b, x, in_idx, guard)


def _dynamic_update_slice(b, eqn, idx, guard):
    x, upd, *starts = eqn.inputs
    ushape = upd.aval.shape
    st = _clamped_starts(b, starts, x.aval.shape, ushape, guard)
    conds = [f"({e} >= {s} && {e} < {s} + {n})" for e, s, n in zip(idx, st, ushape)]
    inside = _at(b, upd, [f"(({e}) - ({b.k.idx_t})({s}))" for e, s in zip(idx, st)], True)
    outside = _at(b, x, idx, guard)
    if size_of(ushape) == 0:
        return outside
    return f"(({' && '.join(conds) or 'true'}) ? {inside} : {outside})"


def _gather(b, eqn, idx, guard):
    x, indices = eqn.inputs
    axes = eqn.params["axes"]
    nb = indices.aval.ndim - 1
    batch, rest = idx[:nb], iter(idx[nb:])
    in_idx = []
    for dim, n in enumerate(x.aval.shape):
        if dim in axes:
            k = axes.index(dim)
            i = _at(b, indices, batch + [str(k)], guard)
            e = f"fflow_clamp((long long)({i}), 0LL, {n - 1}LL)"
            in_idx.append(f"({b.k.idx_t})({e})")
        else:
            in_idx.append(next(rest))
    return _at(b, x, in_idx, guard)


def _take_along_axis(b, eqn, idx, guard):
    x, indices = eqn.inputs
    axis = eqn.params["axis"]
    i = _at(b, indices, idx, guard)
    e = f"fflow_clamp((long long)({i}), 0LL, {x.aval.shape[axis] - 1}LL)"
    return _at(b, x, idx[:axis] + [f"({b.k.idx_t})({e})"] + idx[axis + 1 :], guard)


def _random_bits(b, eqn, idx, guard):
    (key,) = eqn.inputs
    shape = tuple(eqn.params["shape"])
    nb = key.aval.ndim - 1
    batch, sidx, word = idx[:nb], idx[nb:-1], idx[-1]
    k0 = _at(b, key, batch + ["0"], guard)
    k1 = _at(b, key, batch + ["1"], guard)
    i = f"(unsigned long long)({linear(sidx, shape, b.k.lit)})"
    return f"fflow_threefry({k0}, {k1}, (unsigned)({i} >> 32), (unsigned)({i}), (int)({word}))"


def _random_fold_in(b, eqn, idx, guard):
    key, data = eqn.inputs
    batch, word = idx[:-1], idx[-1]
    k0 = _at(b, key, batch + ["0"], guard)
    k1 = _at(b, key, batch + ["1"], guard)
    d = _at(b, data, batch, guard)
    return f"fflow_threefry({k0}, {k1}, 0u, {d}, (int)({word}))"


INDEX_RULES = {
    broadcast_in_dim_p: _broadcast,
    reshape_p: _reshape,
    squeeze_p: _squeeze,
    transpose_p: _transpose,
    rev_p: _rev,
    slice_p: _slice,
    pad_p: _pad,
    concatenate_p: _concatenate,
    iota_p: _iota,
    dynamic_slice_p: _dynamic_slice,
    dynamic_update_slice_p: _dynamic_update_slice,
    gather_p: _gather,
    take_along_axis_p: _take_along_axis,
    random_bits_p: _random_bits,
    random_fold_in_p: _random_fold_in,
    sbp_constraint_p: lambda b, eqn, idx, guard: _at(b, eqn.inputs[0], idx, guard),
}
INDEX_OPS = frozenset(INDEX_RULES)  # the primitives rendered as index arithmetic


# -- kernels --------------------------------------------------------------------------------


class Kernel:
    """One generated kernel and how to launch it.

    `args` lists ("in", var) / ("out", var) / ("tmp", var) in parameter order;
    `grid`/`block` as for `RawKernel((grid,), (block,), args)`.
    """

    def __init__(self, kind, name, source, args, grid, block, bytes_read, bytes_written):
        self.kind = kind
        self.name = name
        self.source = source
        self.args = args
        self.grid = grid
        self.block = block
        self.bytes_read = bytes_read
        self.bytes_written = bytes_written
        self.pointwise = False  # True: an output may share a dying input's buffer

    def __repr__(self):
        return f"Kernel({self.name}, grid={self.grid}, block={self.block})"


class KernelSource:
    """Collects parameters, helper definitions and body lines of one kernel."""

    def __init__(self, kind, inline, wide=False):
        self.kind = kind
        self.inline = inline  # var -> eqn rendered inline
        self.inputs = {}  # var -> parameter name
        self.outputs = []  # (var, parameter name)
        self.special = {}  # var -> C expression (values held in registers)
        self.reciprocals = set()  # row registers divided by: `<reg>_inv` is declared
        self.vector_inputs = set()
        self.row_shapes = {}  # row kernels: "row" -> x_shape, "col" -> reduced dims
        self.row_cache = {}  # row kernels: input var -> register array name
        self.canonical_reads = {}  # input var -> ids of the loops reading it row-wise
        self.other_reads = set()  # inputs of those shapes also read at other elements
        self.helpers = []
        self.idx_t = "long long" if wide else "int"
        self.lit = "LL" if wide else ""
        self._n = 0

    def fresh(self):
        self._n += 1
        return self._n

    def input(self, v):
        name = self.inputs.get(v)
        if name is None:
            name = f"in{len(self.inputs)}"
            self.inputs[v] = name
        return name

    def output(self, v):
        name = f"out{len(self.outputs)}"
        self.outputs.append((v, name))
        return name

    def helper(self, guard, text):
        if all(g != guard for g, _ in self.helpers):
            self.helpers.append((guard, text))

    def finish(self, body, grid, block, extra_read=0):
        params = [
            f"const {storage_ctype(v.aval.dtype)}* __restrict__ {n}" for v, n in self.inputs.items()
        ] + [f"{storage_ctype(v.aval.dtype)}* __restrict__ {n}" for v, n in self.outputs]
        helpers = "".join(f"#ifndef {g}\n#define {g}\n{t}\n#endif\n" for g, t in self.helpers)
        text = (
            f'extern "C" __global__ void KERNEL_NAME({", ".join(params)}) {{\n'
            + "\n".join("  " + line for line in body)
            + "\n}\n"
        )
        digest = hashlib.sha256((helpers + text).encode()).hexdigest()[:12]
        name = f"fflow_{self.kind}_{digest}"
        source = PREAMBLE + helpers + text.replace("KERNEL_NAME", name)
        args = [("in", v) for v in self.inputs] + [("out", v) for v, _ in self.outputs]
        read = sum(_nbytes(v) for v in self.inputs) + extra_read
        written = sum(_nbytes(v) for v, _ in self.outputs)
        return Kernel(self.kind, name, source, args, grid, block, read, written)


def _nbytes(v):
    return size_of(v.aval.shape) * np.dtype(v.aval.dtype).itemsize


def _grid(work, block=BLOCK):
    return max(1, min((work + block - 1) // block, MAX_GRID))


def _grid_loop(var, start, n, idx_t):
    return (
        f"for ({idx_t} {var} = {start}({idx_t})blockIdx.x * blockDim.x + threadIdx.x; {var} < {n}; "
        f"{var} += ({idx_t})gridDim.x * blockDim.x) {{"
    )


def _indent(lines, n=1):
    return ["  " * n + line for line in lines]


def _pure_elementwise(outputs, inline, shape):
    """True when every inlined equation is elementwise on `shape` (so flat indexing works)."""
    seen = set()
    stack = list(outputs)
    while stack:
        v = stack.pop()
        if type(v) is Literal or v in seen:
            continue
        seen.add(v)
        eqn = inline.get(v)
        if eqn is None:
            if v.aval.ndim and v.aval.shape != shape:
                return False
            continue
        if eqn.primitive is broadcast_in_dim_p and type(eqn.inputs[0]) is Literal:
            continue  # a splat constant
        if eqn.primitive.name not in ELEMENTWISE:
            return False
        for x in eqn.inputs:
            if type(x) is not Literal and x.aval.ndim and x.aval.shape != shape:
                return False
            stack.append(x)
    return True


def elementwise_kernel(outputs, inline, wide=False, vectorize=True):
    """One kernel computing `outputs` (all of one shape) elementwise, producers inlined."""
    shape = outputs[0].aval.shape
    n = size_of(shape)
    k = KernelSource("ew", inline, wide)
    flat = _pure_elementwise(outputs, inline, shape)
    out_names = [k.output(v) for v in outputs]
    body = []

    def scalar_body(ivar):
        b = Builder(k, flat=n if flat else None)
        idx = [ivar] if flat else delinearize(ivar, shape, k.lit)
        if not flat and len(shape) > 1:
            idx = [b.index_tmp(e) for e in idx]
        if not shape:
            idx = []
        stores = []
        for v, name in zip(outputs, out_names):
            val = b.value(v, idx)
            stores.append(f"{name}[{ivar}] = {renderer_for(v.aval.dtype).store(val)};")
        return b.lines + stores

    itemsizes = [np.dtype(v.aval.dtype).itemsize for v in outputs]
    vec = 0
    if vectorize and n >= 64 and shape:
        # probe which external inputs the outputs read (all of them have `shape`), or
        # with broadcasts and index arithmetic: which inputs of `shape` they read at
        # the output's own element (vector loads; the others load per element)
        probe = KernelSource("ew", inline, wide)
        pb = Builder(probe, flat=n if flat else None)
        idx = ["i"] if flat else [pb.index_tmp(e) for e in delinearize("i", shape, probe.lit)]
        if not flat:
            probe.row_shapes = {"row": shape}
            pb.canon = {tuple(idx): "row"}
        for v in outputs:
            pb.value(v, idx)
        if flat:
            arrays = [v for v in probe.inputs if v.aval.ndim]
        else:
            arrays = list(probe.canonical_reads)
        itemsizes += [np.dtype(v.aval.dtype).itemsize for v in arrays]
        vec = 16 // max(itemsizes)
        if vec > 1 and n % vec == 0:
            for v in arrays:
                k.input(v)
                k.vector_inputs.add(v)
        else:
            vec = 0
    if vec:
        nv = n // vec
        body.append(_grid_loop("v", "", f"{nv}{k.lit}", k.idx_t))
        loop = []
        for v in k.vector_inputs:
            name = k.inputs[v]
            vt = _vector_type(np.dtype(v.aval.dtype).itemsize * vec)
            loop.append(f"{vt} {name}_raw = ((const {vt}*){name})[v];")
            loop.append(
                f"const {storage_ctype(v.aval.dtype)}* {name}_v = "
                f"(const {storage_ctype(v.aval.dtype)}*)&{name}_raw;"
            )
        for v, name in zip(outputs, out_names):
            vt = _vector_type(np.dtype(v.aval.dtype).itemsize * vec)
            loop.append(f"{vt} {name}_raw;")
            st = storage_ctype(v.aval.dtype)
            loop.append(f"{st}* {name}_v = ({st}*)&{name}_raw;")
        for lane in range(vec):
            b = Builder(k, flat=n if flat else None)
            b.lane = lane
            ivar = f"(v * {vec} + {lane})"
            idx = [ivar]
            if not flat:
                idx = [b.index_tmp(e) for e in delinearize(ivar, shape, k.lit)]
                b.lane_idx = tuple(idx)
            stores = []
            for v, name in zip(outputs, out_names):
                val = b.value(v, idx)
                stores.append(f"{name}_v[{lane}] = {renderer_for(v.aval.dtype).store(val)};")
            loop += ["{"] + _indent(b.lines + stores) + ["}"]
        for v, name in zip(outputs, out_names):
            vt = _vector_type(np.dtype(v.aval.dtype).itemsize * vec)
            loop.append(f"(({vt}*){name})[v] = {name}_raw;")
        body += _indent(loop) + ["}"]
    else:
        body.append(_grid_loop("i", "", f"{n}{k.lit}", k.idx_t))
        body += _indent(scalar_body("i")) + ["}"]
    kernel = k.finish(body, _grid(n // vec if vec else n), BLOCK)
    kernel.vector_width = vec or 1
    kernel.pointwise = bool(flat)  # element i is read and written by the same thread only
    return kernel


def _vector_type(nbytes):
    return {16: "uint4", 8: "uint2", 4: "unsigned int", 2: "unsigned short", 1: "unsigned char"}[
        nbytes
    ]
