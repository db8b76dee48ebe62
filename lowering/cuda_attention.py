"""Fused attention kernels (flash-style): one kernel for the forward, one for the backward.

Forward (`dot_product_attention` -> out, lse): a block per (batch·head, query tile);
the query tile sits in shared memory, key/value tiles stream through it, and each
query row keeps an online softmax (running max m, running sum l, the output
accumulator rescaled by exp(m_old - m_new)). Scores exist only as one tile in shared
memory: no [T, S] tensor in HBM. 16-bit operands are widened on load; everything
accumulates in fp32 (fp64 for float64).

Backward (`attention_bwd` -> dq, dk, dv): one launch whose grid has two halves, so
no atomics and no fp32 scratch are needed and the result is deterministic:
blocks y < NQB own a query tile and accumulate dQ over all key tiles; the other
blocks own a key tile of a key/value head and accumulate dK, dV over the query tiles
of every query head that reads it. Both recompute P = exp(s - lse) from the forward's
lse, with D = rowsum(dO · O); dS = P (dP - D) is zero where a logit is masked.

A thread handles one row of a tile with TPR = 4 lanes of one warp (row maxima and
sums by two xor shuffles). Causal attention without an explicit mask skips the tiles
above the diagonal (every row keeps key 0, so skipping is exact).
These are the SIMT FMA kernels, for f32/f64 and head sizes the tensor-core path does
not take. bf16/fp16 forwards with h % 16 == 0, hv % 8 == 0 (both <= 128), and
backwards that also have hv % 16 == 0, run `cuda_attention_tc.py` (mma.m16n8k16,
fp32 accumulate), chosen here at plan time;
`FFLOW_ATTN_TC=0` keeps the SIMT kernels.
"""

import os

import numpy as np
from fflow.lowering import cuda_attention_tc as tc
from fflow.lowering.cuda_kernels import KernelSource
from fflow.lowering.cuda_render import renderer_for
from fflow.primitives.attention import BIG_NEG, attention_bwd_p, attention_p

TPR = 4  # lanes per tile row
SMEM_LIMIT = 48 * 1024  # static shared memory per block


def _tile(h, hv, acc_bytes, bwd):
    for t in (32, 16, 8):
        if bwd:
            floats = t * h + t * hv + t * (h + 1) + t * (hv + 1) + 2 * t * (t + 1) + 2 * t
        else:
            floats = t * h + t * (h + 1) + t * hv + t * (t + 1)
        if floats * acc_bytes <= SMEM_LIMIT:
            return t
    raise NotImplementedError(f"attention head size {h}/{hv} needs too much shared memory")


class _Ctx:
    """Shapes, types and the C snippets both kernels share."""

    def __init__(self, eqn, kind):
        p = eqn.params
        q, k, v = eqn.inputs[:3]
        self.has_mask, self.causal, self.scale = p["has_mask"], p["causal"], p["scale"]
        self.b, self.t, self.n, self.h = q.aval.shape
        self.s, self.kh, self.hv = k.aval.shape[1], k.aval.shape[2], v.aval.shape[3]
        self.g = self.n // self.kh
        self.q_dtype, self.k_dtype, self.v_dtype = (np.dtype(x.aval.dtype) for x in (q, k, v))
        double = np.dtype(q.aval.dtype) == np.float64
        self.acc = "double" if double else "float"
        self.exp, self.log = ("exp", "log") if double else ("expf", "logf")
        self.tile = _tile(self.h, self.hv, 8 if double else 4, kind == "attn_bwd")
        self.rq, self.rk, self.rv = (renderer_for(x.aval.dtype) for x in (q, k, v))
        self.k = KernelSource(kind, {})
        self.names = [self.k.input(x) for x in eqn.inputs]
        self.skip = self.causal and not self.has_mask
        if self.has_mask:
            self.mshape = eqn.inputs[3].aval.shape

    def lit(self, x):
        return repr(float(x)) + ("" if self.acc == "double" else "f")

    def mask_ok(self, bidx, nidx, iidx, jidx):
        """C expression: key j may be attended by query i (mask and causal)."""
        conds = []
        if self.causal:
            conds.append(f"{jidx} <= {iidx}")
        if self.has_mask:
            mb, mn, mt, ms = self.mshape
            lin = (
                f"((((long long)({bidx if mb > 1 else 0}) * {mn} + ({nidx if mn > 1 else 0}))"
                f" * {mt} + ({iidx if mt > 1 else 0})) * {ms} + {jidx})"
            )
            conds.append(f"{self.names[3]}[{lin}]")
        return " && ".join(conds) or "true"

    def shuffle_reduce(self, var, op):
        fn = (
            (lambda a, b: f"({a} > {b} ? {a} : {b})")
            if op == "max"
            else (lambda a, b: f"{a} + {b}")
        )
        shfl = "__shfl_xor_sync(0xffffffffu, "
        return [
            f"{{ {self.acc} o_ = {shfl}{var}, {m}); {var} = {fn(var, 'o_')}; }}" for m in (1, 2)
        ]


def _load_rows(dst, stride, src, r, rows0, nrows, width, head, heads, seq, guard_len):
    """Lines loading a [tile, width] slab of a [B, seq, heads, width] tensor into shared."""
    return [
        f"for (int e = threadIdx.x; e < {nrows * width}; e += blockDim.x) {{",
        f"  const int rr = e / {width}, d = e % {width}, i = {rows0} + rr;",
        f"  {dst}[rr * {stride} + d] = i < {guard_len} ? "
        f"{r.load(f'{src}[(((long long)b * {seq} + i) * {heads} + {head}) * {width} + d]')} : 0;",
        "}",
    ]


def _use_tc(eqn):
    """The tensor-core kernel applies (decided at plan time from shapes and dtypes)."""
    if os.environ.get("FFLOW_ATTN_TC", "1") == "0":
        return None
    fwd = eqn.primitive is attention_p
    c = _Ctx(eqn, "attn_fwd" if fwd else "attn_bwd")
    return c if (tc.fits_fwd(c) if fwd else tc.fits_bwd(c)) else None


def describe(eqn):
    """The launch-plan note of the attention kernel of `eqn`."""
    direction = "fwd" if eqn.primitive is attention_p else "bwd"
    c = _use_tc(eqn)
    if c is not None:
        return tc.describe(c, direction)
    return f"fused {eqn.primitive.name} (attention {direction}, SIMT FMA)"


def attention_fwd_kernel(eqn):
    c = _use_tc(eqn)
    if c is not None:
        return tc.fwd_kernel(c, eqn)
    c = _Ctx(eqn, "attn_fwd")
    k, T, acc = c.k, c.tile, c.acc
    q, kk, v = c.names[:3]
    out, lse = k.output(eqn.outputs[0]), k.output(eqn.outputs[1])
    h, hv, s, t, n = c.h, c.hv, c.s, c.t, c.n
    na = -(-hv // TPR)
    body = [
        f"__shared__ {acc} Qs[{T * h}], Ks[{T * (h + 1)}], Vs[{T * hv}], Ss[{T * (T + 1)}];",
        f"const int r = threadIdx.x / {TPR}, c = threadIdx.x % {TPR};",
        f"const int b = blockIdx.x / {n}, n = blockIdx.x % {n}, kvh = n / {c.g};",
        f"const int q0 = blockIdx.y * {T}, qi = q0 + r;",
        *_load_rows("Qs", h, q, c.rq, "q0", T, h, "n", n, t, t),
        f"{acc} m = -3.0e38, l = 0, acc[{na}];",
        f"for (int a = 0; a < {na}; ++a) acc[a] = 0;",
        f"const int kend = {f'(q0 + {T} < {s} ? q0 + {T} : {s})' if c.skip else s};",
        f"for (int k0 = 0; k0 < kend; k0 += {T}) {{",
        "  __syncthreads();",
        *["  " + x for x in _load_rows("Ks", h + 1, kk, c.rk, "k0", T, h, "kvh", c.kh, s, s)],
        *["  " + x for x in _load_rows("Vs", hv, v, c.rv, "k0", T, hv, "kvh", c.kh, s, s)],
        "  __syncthreads();",
        f"  {acc} mx = -3.0e38;",
        f"  for (int jj = c; jj < {T}; jj += {TPR}) {{",
        f"    const int j = k0 + jj; {acc} sc = -3.0e38;",
        f"    if (j < {s}) {{",
        f"      {acc} dot = 0;",
        f"      for (int d = 0; d < {h}; ++d) dot += Qs[r * {h} + d] * Ks[jj * {h + 1} + d];",
        f"      sc = (qi < {t} && !({c.mask_ok('b', 'n', 'qi', 'j')})) ? {c.lit(BIG_NEG)} "
        f": dot * {c.lit(c.scale)};",
        "    }",
        f"    Ss[r * {T + 1} + jj] = sc; mx = mx > sc ? mx : sc;",
        "  }",
        *["  " + x for x in c.shuffle_reduce("mx", "max")],
        f"  const {acc} mn = m > mx ? m : mx, alpha = {c.exp}(m - mn);",
        f"  {acc} ps = 0;",
        f"  for (int jj = c; jj < {T}; jj += {TPR}) {{",
        f"    const {acc} p = k0 + jj < {s} ? {c.exp}(Ss[r * {T + 1} + jj] - mn) : 0;",
        f"    Ss[r * {T + 1} + jj] = p; ps += p;",
        "  }",
        *["  " + x for x in c.shuffle_reduce("ps", "sum")],
        "  l = l * alpha + ps; m = mn;",
        "  __syncwarp();",
        f"  for (int a = 0; a < {na}; ++a) {{",
        f"    const int d = c + a * {TPR};",
        f"    if (d < {hv}) {{ {acc} o = acc[a] * alpha;",
        f"      for (int jj = 0; jj < {T}; ++jj) o += Ss[r * {T + 1} + jj] * Vs[jj * {hv} + d];",
        "      acc[a] = o; }",
        "  }",
        "  __syncwarp();",
        "}",
        f"if (qi < {t}) {{",
        f"  const {acc} inv = 1 / l;",
        f"  for (int a = 0; a < {na}; ++a) {{ const int d = c + a * {TPR};",
        f"    if (d < {hv}) {out}[(((long long)b * {t} + qi) * {n} + n) * {hv} + d] = "
        f"{c.rv.store('acc[a] * inv')}; }}",
        f"  if (c == 0) {lse}[((long long)b * {n} + n) * {t} + qi] = m + {c.log}(l);",
        "}",
    ]
    grid = (c.b * n, -(-t // T))
    return k.finish(body, grid, T * TPR)


def attention_bwd_kernel(eqn):
    c = _use_tc(eqn)
    if c is not None:
        return tc.bwd_kernel(c, eqn)
    c = _Ctx(eqn, "attn_bwd")
    k, T, acc = c.k, c.tile, c.acc
    q, kk, v = c.names[:3]
    out, lse, ct = c.names[3 + c.has_mask :]
    dq, dk, dv = (k.output(o) for o in eqn.outputs)
    h, hv, s, t, n, kh, g = c.h, c.hv, c.s, c.t, c.n, c.kh, c.g
    rq, rk, rv = c.rq, c.rk, c.rv
    nqb = -(-t // T)
    nh, nhv = -(-h // TPR), -(-hv // TPR)
    scale = c.lit(c.scale)

    def stats(head):  # D = rowsum(dO * O) and lse of the query tile at q0
        return [
            f"for (int rr = threadIdx.x; rr < {T}; rr += blockDim.x) {{",
            f"  const int i = q0 + rr; {acc} ds = 0;",
            f"  if (i < {t}) {{ for (int d = 0; d < {hv}; ++d) ds += dOs[rr * {hv} + d] * "
            f"{rv.load(f'{out}[(((long long)b * {t} + i) * {n} + {head}) * {hv} + d]')};",
            f"    Ls[rr] = {lse}[((long long)b * {n} + {head}) * {t} + i]; }} else Ls[rr] = 0;",
            "  Ds[rr] = ds;",
            "}",
        ]

    def score(qrow, krow, i, j, head):  # lines computing p and ds for one (query, key)
        return [
            f"{acc} dot = 0, dp = 0;",
            f"for (int d = 0; d < {h}; ++d)",
            f"  dot += Qs[{qrow} * {h} + d] * Ks[{krow} * {h + 1} + d];",
            f"for (int d = 0; d < {hv}; ++d)",
            f"  dp += dOs[{qrow} * {hv} + d] * Vs[{krow} * {hv + 1} + d];",
            f"const bool ok = {c.mask_ok('b', head, i, j)};",
            # a fully masked row (lse == BIG_NEG: log(S) is below its ulp) averages all keys
            f"p = Ls[{qrow}] <= {c.lit(BIG_NEG)} ? {c.lit(1.0 / s)} "
            f": (ok ? {c.exp}(dot * {scale} - Ls[{qrow}]) : 0);",
            f"ds = ok ? p * (dp - Ds[{qrow}]) : 0;",
        ]

    ind = lambda lines, d: ["  " * d + x for x in lines]  # noqa: E731
    body = [
        f"__shared__ {acc} Qs[{T * h}], dOs[{T * hv}], Ks[{T * (h + 1)}], Vs[{T * (hv + 1)}];",
        f"__shared__ {acc} P1[{T * (T + 1)}], P2[{T * (T + 1)}], Ls[{T}], Ds[{T}];",
        f"const int r = threadIdx.x / {TPR}, c = threadIdx.x % {TPR};",
        f"const int b = blockIdx.x / {n}, n = blockIdx.x % {n};",
        f"if (blockIdx.y < {nqb}) {{  // dQ of one query tile",
        f"  const int kvh = n / {g}, q0 = blockIdx.y * {T}, qi = q0 + r;",
        *ind(_load_rows("Qs", h, q, rq, "q0", T, h, "n", n, t, t), 1),
        *ind(_load_rows("dOs", hv, ct, rv, "q0", T, hv, "n", n, t, t), 1),
        "  __syncthreads();",
        *ind(stats("n"), 1),
        f"  {acc} acc[{nh}];",
        f"  for (int a = 0; a < {nh}; ++a) acc[a] = 0;",
        f"  const int kend = {f'(q0 + {T} < {s} ? q0 + {T} : {s})' if c.skip else s};",
        f"  for (int k0 = 0; k0 < kend; k0 += {T}) {{",
        "    __syncthreads();",
        *ind(_load_rows("Ks", h + 1, kk, rk, "k0", T, h, "kvh", kh, s, s), 2),
        *ind(_load_rows("Vs", hv + 1, v, rv, "k0", T, hv, "kvh", kh, s, s), 2),
        "    __syncthreads();",
        f"    for (int jj = c; jj < {T}; jj += {TPR}) {{",
        f"      const int j = k0 + jj; {acc} p = 0, ds = 0;",
        f"      if (j < {s} && qi < {t}) {{",
        *ind(score("r", "jj", "qi", "j", "n"), 4),
        "      }",
        f"      P1[r * {T + 1} + jj] = ds;",
        "    }",
        "    __syncwarp();",
        f"    for (int a = 0; a < {nh}; ++a) {{ const int d = c + a * {TPR};",
        f"      if (d < {h}) {{ {acc} o = 0;",
        f"        for (int jj = 0; jj < {T}; ++jj)",
        f"          o += P1[r * {T + 1} + jj] * Ks[jj * {h + 1} + d];",
        "        acc[a] += o; } }",
        "    __syncwarp();",
        "  }",
        f"  if (qi < {t}) for (int a = 0; a < {nh}; ++a) {{ const int d = c + a * {TPR};",
        f"    if (d < {h}) {dq}[(((long long)b * {t} + qi) * {n} + n) * {h} + d] = "
        f"{rq.store(f'acc[a] * {scale}')}; }}",
        "} else {  // dK, dV of one key tile of key/value head n",
        f"  if (n >= {kh}) return;",
        f"  const int kvh = n, k0 = (blockIdx.y - {nqb}) * {T}, kj = k0 + r;",
        *ind(_load_rows("Ks", h + 1, kk, rk, "k0", T, h, "kvh", kh, s, s), 1),
        *ind(_load_rows("Vs", hv + 1, v, rv, "k0", T, hv, "kvh", kh, s, s), 1),
        f"  {acc} dka[{nh}], dva[{nhv}];",
        f"  for (int a = 0; a < {nh}; ++a) dka[a] = 0;",
        f"  for (int a = 0; a < {nhv}; ++a) dva[a] = 0;",
        f"  for (int gg = 0; gg < {g}; ++gg) {{",
        f"    const int hn = kvh * {g} + gg;",
        f"    for (int q0 = {f'(k0 / {T}) * {T}' if c.skip else 0}; q0 < {t}; q0 += {T}) {{",
        "      __syncthreads();",
        *ind(_load_rows("Qs", h, q, rq, "q0", T, h, "hn", n, t, t), 3),
        *ind(_load_rows("dOs", hv, ct, rv, "q0", T, hv, "hn", n, t, t), 3),
        "      __syncthreads();",
        *ind(stats("hn"), 3),
        "      __syncthreads();",
        f"      for (int ii = c; ii < {T}; ii += {TPR}) {{",
        f"        const int i = q0 + ii; {acc} p = 0, ds = 0;",
        f"        if (i < {t} && kj < {s}) {{",
        *ind(score("ii", "r", "i", "kj", "hn"), 5),
        "        }",
        f"        P1[r * {T + 1} + ii] = p; P2[r * {T + 1} + ii] = ds;",
        "      }",
        "      __syncwarp();",
        f"      for (int a = 0; a < {nhv}; ++a) {{ const int d = c + a * {TPR};",
        f"        if (d < {hv}) {{ {acc} o = 0;",
        f"          for (int ii = 0; ii < {T}; ++ii)",
        f"            o += P1[r * {T + 1} + ii] * dOs[ii * {hv} + d];",
        "          dva[a] += o; } }",
        f"      for (int a = 0; a < {nh}; ++a) {{ const int d = c + a * {TPR};",
        f"        if (d < {h}) {{ {acc} o = 0;",
        f"          for (int ii = 0; ii < {T}; ++ii) o += P2[r * {T + 1} + ii] * Qs[ii * {h} + d];",
        "          dka[a] += o; } }",
        "      __syncwarp();",
        "    }",
        "  }",
        f"  if (kj < {s}) {{",
        f"    for (int a = 0; a < {nh}; ++a) {{ const int d = c + a * {TPR};",
        f"      if (d < {h}) {dk}[(((long long)b * {s} + kj) * {kh} + kvh) * {h} + d] = "
        f"{rk.store(f'dka[a] * {scale}')}; }}",
        f"    for (int a = 0; a < {nhv}; ++a) {{ const int d = c + a * {TPR};",
        f"      if (d < {hv}) {dv}[(((long long)b * {s} + kj) * {kh} + kvh) * {hv} + d] = "
        f"{rv.store('dva[a]')}; }}",
        "  }",
        "}",
    ]
    grid = (c.b * n, nqb + -(-s // T))
    return k.finish(body, grid, T * TPR)


def supported(eqn):
    """Whether a fused kernel exists for this attention equation (else it runs on the host)."""
    if eqn.primitive not in KERNELS:
        return False
    q, _, v = eqn.inputs[:3]
    acc = 8 if np.dtype(q.aval.dtype) == np.float64 else 4
    try:
        _tile(q.aval.shape[3], v.aval.shape[3], acc, eqn.primitive is attention_bwd_p)
    except NotImplementedError:
        return False
    return all(d > 0 for d in q.aval.shape + v.aval.shape)


KERNELS = {attention_p: attention_fwd_kernel, attention_bwd_p: attention_bwd_kernel}
