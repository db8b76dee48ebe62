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
}
INDEX_OPS = {
    "broadcast_in_dim",
    "reshape",
    "squeeze",
    "transpose",
    "rev",
    "slice",
    "pad",
    "concatenate",
    "iota",
    "dynamic_slice",
    "dynamic_update_slice",
    "gather",
    "random_bits",
    "random_fold_in",
    "sbp_constraint",  # with_sbp's annotation: the identity on one device
}
REDUCTIONS = {
    "reduce_sum",
    "reduce_prod",
    "reduce_max",
    "reduce_min",
    "reduce_or",
    "reduce_and",
    "argmax",
    "argmin",
}
CUMULATIVE = {"cumsum": "reduce_sum", "cumprod": "reduce_prod", "cummax": "reduce_max",
              "cummin": "reduce_min"}  # fmt: skip
SCATTERS = {"scatter": "set", "scatter_add": "add", "scatter_mul": "mul", "scatter_min": "min",
            "scatter_max": "max"}  # fmt: skip


def size_of(shape):
    return int(np.prod(shape, dtype=np.int64))


def is_fusible(eqn):
    """Can this equation be rendered inline at an index (elementwise or index arithmetic)?"""
    name = eqn.primitive.name
    if name not in ELEMENTWISE and name not in INDEX_OPS:
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
            name = self.k.input(v)
            if self.lane is not None and v.aval.ndim and v in self.k.vector_inputs:
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
    if name == "select_n":
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
    if name == "convert_element_type":
        x = ins[0]
        return r.cast_from(_at(b, x, idx, guard), renderer_for(x.aval.dtype))
    if name in ELEMENTWISE:
        in_r = renderer_for(ins[0].aval.dtype)
        args = [_at(b, x, idx, guard) for x in ins]
        return r.round(in_r.code_for_op[name](*args, **p))
    return INDEX_RULES[name](b, eqn, idx, guard)


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
    "broadcast_in_dim": _broadcast,
    "reshape": _reshape,
    "squeeze": _squeeze,
    "transpose": _transpose,
    "rev": _rev,
    "slice": _slice,
    "pad": _pad,
    "concatenate": _concatenate,
    "iota": _iota,
    "dynamic_slice": _dynamic_slice,
    "dynamic_update_slice": _dynamic_update_slice,
    "gather": _gather,
    "random_bits": _random_bits,
    "random_fold_in": _random_fold_in,
    "sbp_constraint": lambda b, eqn, idx, guard: _at(b, eqn.inputs[0], idx, guard),
}


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
        self.vector_inputs = set()
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
        if eqn.primitive.name == "broadcast_in_dim" and type(eqn.inputs[0]) is Literal:
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
    if flat and vectorize and n >= 64:
        # probe which external inputs the outputs read (all of them have `shape`)
        probe = KernelSource("ew", inline, wide)
        pb = Builder(probe, flat=n)
        for v in outputs:
            pb.value(v, ["i"])
        arrays = [v for v in probe.inputs if v.aval.ndim]
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
            b = Builder(k, flat=n)
            b.lane = lane
            ivar = f"(v * {vec} + {lane})"
            stores = []
            for v, name in zip(outputs, out_names):
                val = b.value(v, [ivar])
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
    return kernel


def _vector_type(nbytes):
    return {16: "uint4", 8: "uint2", 4: "unsigned int", 2: "unsigned short", 1: "unsigned char"}[
        nbytes
    ]


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


def _warp_allreduce(red, acc, ids=None, comb_fn=None):
    if red.is_arg:
        return [
            "for (int o = 16; o > 0; o >>= 1) {",
            f"  {red.acc} ov = __shfl_xor_sync(0xffffffffu, {acc}, o);",
            f"  long long oi = __shfl_xor_sync(0xffffffffu, {ids}, o);",
            f"  {comb_fn}({acc}, {ids}, ov, oi);",
            "}",
        ]
    return [
        "for (int o = 16; o > 0; o >>= 1)",
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


def row_kernel(reductions, elem_outputs, row_outputs, inline, wide=False):
    """A kernel per row: reductions over the trailing dims, then outputs of the row.

    `reductions` are equations reducing the trailing axes of inputs of one shape
    R + N (R: rows, N: reduced dims); their results stay in registers and feed the
    later reductions and the outputs (shape R + N or R / R + (1,)), which is how
    softmax, log_softmax and layernorm become one kernel. Rows of up to 1024
    elements take one warp each (shuffles only); longer rows take a block.
    """
    first = reductions[0]
    x_shape = first.inputs[0].aval.shape
    axes = first.params["axes"]
    nrows_dims = x_shape[: len(x_shape) - len(axes)]
    red_shape = x_shape[len(nrows_dims) :]
    rows, n = size_of(nrows_dims), size_of(red_shape)
    k = KernelSource("row", inline, wide)
    warp_mode = n <= 1024
    if warp_mode:
        block = 128
        grid = _grid(rows, block // 32)
        head = [
            f"const {k.idx_t} row = ({k.idx_t})blockIdx.x * (blockDim.x >> 5)"
            " + (threadIdx.x >> 5);",
            "const int tid = threadIdx.x & 31;",
            "const int nt = 32;",
        ]
    else:
        block = 1024 if n >= 16384 else 512 if n >= 4096 else 256
        grid = rows
        # the block size is a constant of the kernel, so loops over a row unroll
        head = [f"const {k.idx_t} row = blockIdx.x;", "const int tid = threadIdx.x;",
                f"const int nt = {block};"]  # fmt: skip
    body = list(head)
    inner = []
    rb = Builder(k)
    row_idx = [rb.index_tmp(e) for e in delinearize("row", nrows_dims, k.lit)] if nrows_dims else []
    inner += rb.lines

    def elem_loop(fill):
        b = Builder(k)
        jdx = delinearize("j", red_shape, k.lit) if red_shape else []
        if len(red_shape) > 1:
            jdx = [b.index_tmp(e) for e in jdx]
        lines = fill(b, row_idx + jdx)
        return (
            ["#pragma unroll 4", f"for ({k.idx_t} j = tid; j < {n}{k.lit}; j += nt) {{"]
            + _indent(b.lines + lines)
            + ["}"]
        )

    for r_i, eqn in enumerate(reductions):
        src = eqn.inputs[0]
        red = Reduction(eqn.primitive.name, src.aval.dtype, eqn.outputs[0].aval.dtype)
        acc, ids = f"acc{r_i}", f"ids{r_i}"
        comb_fn = red.arg_helper(k) if red.is_arg else None
        inner.append(f"{red.acc} {acc} = {red.init};")
        if red.is_arg:
            inner.append(f"long long {ids} = -1;")
        inner += elem_loop(
            lambda b, idx, red=red, src=src, acc=acc, ids=ids, fn=comb_fn: _accumulate(
                k, red, b, b.value(src, idx), acc, ids, "j", fn
            )
        )
        if warp_mode:
            inner += _warp_allreduce(red, acc, ids, comb_fn)
        else:
            inner += _block_allreduce(red, acc, str(r_i), ids, comb_fn)
        result = red.result(ids if red.is_arg else acc)
        reg = f"red{r_i}"
        inner.append(f"const {red.out_r.compute} {reg} = {result};")
        k.special[eqn.outputs[0]] = reg
    out_names = [(v, k.output(v)) for v in elem_outputs + row_outputs]
    if row_outputs:
        b = Builder(k)
        stores = []
        for v, name in out_names[len(elem_outputs) :]:
            idx = row_idx + ["0"] * (v.aval.ndim - len(row_idx))
            val = b.value(v, idx)
            stores.append(f"{name}[row] = {renderer_for(v.aval.dtype).store(val)};")
        inner += ["if (tid == 0) {"] + _indent(b.lines + stores) + ["}"]
    if elem_outputs:

        def fill(b, idx):
            out = []
            for v, name in out_names[: len(elem_outputs)]:
                val = b.value(v, idx)
                out.append(
                    f"{name}[row * {n}{k.lit} + j] = {renderer_for(v.aval.dtype).store(val)};"
                )
            return out

        inner += elem_loop(fill)
    body += [f"if (row < {rows}{k.lit}) {{"] + _indent(inner) + ["}"]
    return k.finish(body, grid, block)


def split_count(eqn):
    """How many slices of the reduced axes a strided reduction is split into (1: none).

    Few outputs over a long reduction (a bias gradient: sum over the batch) would
    leave most of a GPU idle with one thread per output; slices run in parallel and
    a second small kernel combines them.
    """
    if eqn.primitive.name in ("argmax", "argmin"):
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
    red = Reduction(CUMULATIVE[eqn.primitive.name], src.aval.dtype, src.aval.dtype)
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


def scatter_kernel(eqn, inline, out_var, wide=False):
    """Apply the updates of a scatter to `out_var` (already holding the operand)."""
    x, indices, updates = eqn.inputs
    axes = eqn.params["axes"]
    mode = SCATTERS[eqn.primitive.name]
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
    for dim, size in enumerate(x.aval.shape):
        if dim in axes:
            t = b.tmp(
                "long long", f"(long long)({b.value(indices, batch + [str(axes.index(dim))])})"
            )
            conds.append(f"{t} >= 0 && {t} < {size}")
            tidx.append(f"({k.idx_t})({t})")
        else:
            tidx.append(next(rest))
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
    dim, num_keys = eqn.params["dimension"], eqn.params.get("num_keys", 1)
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
    off = f"(({t})(line / {post}{k.lit}) * {length * post}{k.lit} + ({t})(line % {post}{k.lit}))"
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
    call = f"{helper}({', '.join(names)}, base, "
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
