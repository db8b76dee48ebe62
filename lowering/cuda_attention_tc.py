"""Flash attention forward on tensor cores (bf16/fp16 in, fp32 accumulate).

A block of 4 warps owns 64 query rows of one (batch, head), 16 rows per warp. Each
warp keeps its Q rows as mma A fragments in registers (read once from HBM), and for
every key tile of BK keys (staged in shared memory: K row-major as 16-bit pairs,
V row-major) computes

- S = Q·Kᵀ with `mma.m16n8k16` (`cuda_mma.py`): BK/8 accumulator tiles of 16x8,
  h/16 products each; B = Kᵀ's column-major 16x8 tile is K's row-major rows;
- the online softmax on those fragments: lane (g, q) holds rows g and g+8, the row
  max/sum combine over the 4 lanes of a quad with two xor shuffles;
- O += P·V: the f32 fragments of P re-pack in registers, rounded to 16 bits, into
  A fragments (two 16x8 C tiles = one 16x16 A tile); V's B fragments pair two keys.

Masking, causal tile skipping, grouped heads, the fully masked row (every key gets
BIG_NEG, so the row averages V) and the lse output are those of the SIMT kernel in
`cuda_attention.py`, which stays the path for f32/f64 and for head sizes that do not
fit (h not a multiple of 16, hv not a multiple of 8, or either above 128).
"""

from fflow.lowering import cuda_mma
from fflow.primitives.attention import BIG_NEG

WARPS = 4
BQ = 16 * WARPS  # query rows per block
SMEM_LIMIT = 48 * 1024
MAX_HEAD = 128


def key_tile(h, hv):
    """Keys per shared-memory tile, or None when no tile fits."""
    for bk in (64, 32, 16):
        if bk * (h + 8) * 2 + bk * (hv + 8) * 2 <= SMEM_LIMIT:
            return bk
    return None


def fits_fwd(c):
    """Whether the tensor-core forward applies to the attention context `c`."""
    kind = cuda_mma.kind_of(c.q_dtype)
    return (
        kind is not None
        and c.q_dtype == c.k_dtype == c.v_dtype
        and c.h % 16 == 0
        and c.hv % 8 == 0
        and 0 < c.h <= MAX_HEAD
        and 0 < c.hv <= MAX_HEAD
        and key_tile(c.h, c.hv) is not None
    )


def fwd_kernel(c, eqn):
    """The forward `Kernel` for context `c` (cuda_attention._Ctx) of `eqn`."""
    kind = cuda_mma.kind_of(c.q_dtype)
    k = c.k
    k.helper(cuda_mma.guard(kind), cuda_mma.helper(kind))
    q, kk, v = c.names[:3]
    out, lse = k.output(eqn.outputs[0]), k.output(eqn.outputs[1])
    h, hv, s, t, n, kh = c.h, c.hv, c.s, c.t, c.n, c.kh
    bk = key_tile(h, hv)
    sth, vst = h + 8, hv + 8  # tile row strides (16-bit; padding spreads banks)
    nkc, nsb, nvb, npc = h // 16, bk // 8, hv // 8, bk // 16
    mma, pack = f"fflow_mma_sync_{kind}", f"fflow_pack_{kind}"
    unroll = "#pragma unroll"

    krow = lambda i: f"(((long long)b * {s} + k0 + {i}) * {kh} + kvh) * {h}"  # noqa: E731
    vrow = lambda i: f"(((long long)b * {s} + k0 + {i}) * {kh} + kvh) * {hv}"  # noqa: E731
    body = [
        f"__shared__ uint4 smraw[{bk * (sth + vst) // 8}];  // 16-byte rows for ldmatrix",
        f"unsigned short* const Kt = (unsigned short*)smraw; unsigned short* const Vt = Kt + "
        f"{bk * sth};",
        "const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, qd = lane & 3;",
        f"const int b = blockIdx.x / {n}, n = blockIdx.x % {n}, kvh = n / {c.g};",
        f"const int q0 = blockIdx.y * {BQ}, r0 = q0 + warp * 16 + g, r1 = r0 + 8;",
        # Q as A fragments: register r holds row g + 8 (r & 1), cols 2qd + 8 (r >> 1)
        *_a_frags(
            "qf",
            q,
            nkc,
            lambda i: f"(((long long)b * {t} + {i}) * {n} + n) * {h}",
            lambda i: f"{i} < {t}",
        ),  # fmt: skip
        f"float m[2] = {{-3.0e38f, -3.0e38f}}, l[2] = {{0.f, 0.f}}, o[{nvb}][4];",
        "#pragma unroll",
        f"for (int a = 0; a < {nvb}; ++a) o[a][0] = o[a][1] = o[a][2] = o[a][3] = 0.f;",
        f"const int kend = {f'(q0 + {BQ} < {s} ? q0 + {BQ} : {s})' if c.skip else s};",
        f"for (int k0 = 0; k0 < kend; k0 += {bk}) {{",
        "  __syncthreads();",
        *["  " + x for x in _stage("Kt", sth, kk, bk, h, krow, lambda r: f"k0 + {r} < {s}")],
        *["  " + x for x in _stage("Vt", vst, v, bk, hv, vrow, lambda r: f"k0 + {r} < {s}")],
        "  __syncthreads();",
        *["  " + x for x in _mma_bt(mma, "sc", "qf", "Kt", sth, nsb, nkc)],
        "  float mx[2] = {-3.0e38f, -3.0e38f};",
        f"  {unroll}",
        f"  for (int nb = 0; nb < {nsb}; ++nb) {{",
        f"    {unroll}",
        "    for (int e = 0; e < 4; ++e) {",
        "      const int qi = (e >> 1) ? r1 : r0, j = k0 + nb * 8 + 2 * qd + (e & 1);",
        "      float x = -3.0e38f;",
        f"      if (j < {s}) x = (qi < {t} && !({c.mask_ok('b', 'n', 'qi', 'j')})) ? "
        f"{c.lit(BIG_NEG)} : sc[nb][e] * {c.lit(c.scale)};",
        "      sc[nb][e] = x; mx[e >> 1] = mx[e >> 1] > x ? mx[e >> 1] : x;",
        "    }",
        "  }",
        "  float alpha[2], ps[2] = {0.f, 0.f};",
        "  #pragma unroll",
        "  for (int hh = 0; hh < 2; ++hh) {",
        "    for (int sh = 1; sh <= 2; sh <<= 1) {",
        "      const float y = __shfl_xor_sync(0xffffffffu, mx[hh], sh);",
        "      mx[hh] = mx[hh] > y ? mx[hh] : y;",
        "    }",
        "    const float mn = m[hh] > mx[hh] ? m[hh] : mx[hh];",
        "    alpha[hh] = expf(m[hh] - mn); m[hh] = mn;",
        "  }",
        f"  {unroll}",
        f"  for (int nb = 0; nb < {nsb}; ++nb) {{",
        f"    {unroll}",
        "    for (int e = 0; e < 4; ++e) {",
        "      const int j = k0 + nb * 8 + 2 * qd + (e & 1);",
        f"      const float p = j < {s} ? expf(sc[nb][e] - m[e >> 1]) : 0.f;",
        "      sc[nb][e] = p; ps[e >> 1] += p;",
        "    }",
        "  }",
        "  #pragma unroll",
        "  for (int hh = 0; hh < 2; ++hh) {",
        "    for (int sh = 1; sh <= 2; sh <<= 1) ps[hh] += __shfl_xor_sync(0xffffffffu, "
        "ps[hh], sh);",
        "    l[hh] = l[hh] * alpha[hh] + ps[hh];",
        "  }",
        f"  {unroll}",
        f"  for (int a = 0; a < {nvb}; ++a) {{",
        "    o[a][0] *= alpha[0]; o[a][1] *= alpha[0]; o[a][2] *= alpha[1]; o[a][3] *= alpha[1];",
        "  }",
        *["  " + x for x in _mma_pk(mma, pack, "o", "sc", "Vt", vst, nvb, npc)],
        "}",
        "for (int hh = 0; hh < 2; ++hh) {",
        "  const int qi = hh ? r1 : r0;",
        f"  if (qi >= {t}) continue;",
        "  const float inv = 1.f / l[hh];",
        f"  for (int a = 0; a < {nvb}; ++a) {{",
        "    const int d = a * 8 + 2 * qd;",
        f"    const long long base = (((long long)b * {t} + qi) * {n} + n) * {hv} + d;",
        f"    {out}[base] = {c.rv.store('o[a][2 * hh] * inv')};",
        f"    {out}[base + 1] = {c.rv.store('o[a][2 * hh + 1] * inv')};",
        "  }",
        f"  if (qd == 0) {lse}[((long long)b * {n} + n) * {t} + qi] = m[hh] + logf(l[hh]);",
        "}",
    ]
    return k.finish(body, (c.b * n, -(-t // BQ)), 32 * WARPS)


def describe(c, direction="fwd"):
    """Plan-text note of a tensor-core kernel."""
    return f"attention {direction} (tensor cores mma.m16n8k16 {cuda_mma.kind_of(c.q_dtype)})"


# -- backward ---------------------------------------------------------------------------------
BQ2 = 32  # query rows per shared tile in the dK/dV half (4 threads per row for D)
assert BQ2 * 4 == 32 * WARPS


def fits_bwd(c):
    """Whether the tensor-core backward applies (dP = dO·Vᵀ needs hv % 16 == 0 too)."""
    return fits_fwd(c) and c.hv % 16 == 0


def _a_frags(dst, src, nkc, base, ok):
    """A fragments of rows r0/r1 (16-bit, `base(i)` = offset of row i's element 0)."""
    return [
        f"unsigned {dst}[{nkc}][4];",
        "#pragma unroll",
        f"for (int kc = 0; kc < {nkc}; ++kc) {{",
        "  #pragma unroll",
        "  for (int r = 0; r < 4; ++r) {",
        "    const int i = (r & 1) ? r1 : r0, d = kc * 16 + 2 * qd + 8 * (r >> 1);",
        f"    {dst}[kc][r] = {ok('i')} ? ((const unsigned*){src})[({base('i')} + d) / 2] : 0u;",
        "  }",
        "}",
    ]


def _a_ldm(dst, tile, st, nkc):
    """A fragments of the warp's 16 rows of a shared tile, one ldmatrix.x4 per k chunk:
    lane 8j + i passes row (j & 1)*8 + i, columns from kc*16 + (j >> 1)*8."""
    return [
        f"unsigned {dst}[{nkc}][4];",
        "#pragma unroll",
        f"for (int kc = 0; kc < {nkc}; ++kc)",
        f"  fflow_ldmatrix_sync_x4({dst}[kc], {tile} + (warp * 16 + (lane & 7) + ((lane >> 3) & 1)"
        f" * 8) * {st} + kc * 16 + (lane >> 4) * 8);",
    ]


def _mma_bt_ldm(mma, acc, atile, tile, st, nn, nkc):
    """Like _mma_bt with A = the warp's 16 rows of the shared `atile` (same stride),
    loaded by ldmatrix one k-chunk pair at a time (8 live registers, not 4·nkc)."""
    if nkc % 2:
        return _a_ldm("af", atile, st, nkc) + _mma_bt(mma, acc, "af", tile, st, nn, nkc)
    arow = f"{atile} + (warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * {st} + (lane >> 4) * 8"
    return [
        f"float {acc}[{nn}][4];",
        "#pragma unroll",
        f"for (int nb = 0; nb < {nn}; ++nb)",
        f"  {acc}[nb][0] = {acc}[nb][1] = {acc}[nb][2] = {acc}[nb][3] = 0.f;",
        "#pragma unroll",
        f"for (int kc2 = 0; kc2 < {nkc // 2}; ++kc2) {{",
        "  unsigned a0[4], a1[4];",
        f"  fflow_ldmatrix_sync_x4(a0, {arow} + kc2 * 32);",
        f"  fflow_ldmatrix_sync_x4(a1, {arow} + kc2 * 32 + 16);",
        "  #pragma unroll",
        f"  for (int nb = 0; nb < {nn}; ++nb) {{",
        "    unsigned bq[4];",
        f"    fflow_ldmatrix_sync_x4(bq, {tile} + (nb * 8 + (lane & 7)) * {st} + kc2 * 32 "
        "+ (lane >> 3) * 8);",
        f"    {mma}({acc}[nb], a0, bq);",
        f"    {mma}({acc}[nb], a1, bq + 2);",
        "  }",
        "}",
    ]


def _stage(tile, st, src, nrows, width, base, ok):
    """Copy `nrows` rows of `width` 16-bit elements into a shared tile: 16 bytes a
    thread when rows are whole 16-byte units (global rows and tile strides then are
    16-byte aligned), else 4 bytes (pairs)."""
    vec, per = ("uint4", 8) if width % 8 == 0 and st % 8 == 0 else ("unsigned", 2)
    zero = "{0u, 0u, 0u, 0u}" if vec == "uint4" else "0u"
    w = width // per
    return [
        f"for (int e = threadIdx.x; e < {nrows * w}; e += blockDim.x) {{",
        f"  const int rr = e / {w}, dv = e % {w};",
        f"  {vec} val = {zero};",
        f"  if ({ok('rr')}) val = ((const {vec}*){src})[({base('rr')}) / {per} + dv];",
        f"  (({vec}*)({tile} + rr * {st}))[dv] = val;",
        "}",
    ]


def _mma_bt(mma, acc, afr, tile, st, nn, nkc):
    """acc[nb] = A · tileᵀ: B[k][n] = tile[nb*8 + n][kc*16 + k] (rows hold pairs along k).

    With an even number of k chunks, one ldmatrix.x4 gives the B fragments of two:
    lane 8j + i passes row nb*8 + i, columns from kc2*32 + 8j."""
    head = [
        f"float {acc}[{nn}][4];",
        "#pragma unroll",
        f"for (int nb = 0; nb < {nn}; ++nb) {{",
        f"  {acc}[nb][0] = {acc}[nb][1] = {acc}[nb][2] = {acc}[nb][3] = 0.f;",
        "  #pragma unroll",
    ]
    if nkc % 2 == 0:
        body = [
            f"  for (int kc2 = 0; kc2 < {nkc // 2}; ++kc2) {{",
            "    unsigned bq[4];",
            f"    fflow_ldmatrix_sync_x4(bq, {tile} + (nb * 8 + (lane & 7)) * {st} + kc2 * 32 "
            "+ (lane >> 3) * 8);",
            f"    {mma}({acc}[nb], {afr}[2 * kc2], bq);",
            f"    {mma}({acc}[nb], {afr}[2 * kc2 + 1], bq + 2);",
        ]
    else:
        body = [
            f"  for (int kc = 0; kc < {nkc}; ++kc) {{",
            f"    const unsigned* tr = (const unsigned*)({tile} + (nb * 8 + g) * {st} + kc * 16 "
            "+ 2 * qd);",
            "    const unsigned bf[2] = {tr[0], tr[4]};",
            f"    {mma}({acc}[nb], {afr}[kc], bf);",
        ]
    return head + body + ["  }", "}"]


def _mma_pk(mma, pack, acc, x, tile, st, nvb, npc):
    """acc[a] += X · tile: X's f32 C fragments re-packed as A, B[k][n] = tile[k][a*8 + n].

    With an even number of 8-column blocks, one ldmatrix.x4.trans gives the B fragments
    of two: lane 8j + i passes row pc*16 + (j & 1)*8 + i, columns from (2*a2 + j/2)*8."""
    pf = (
        f"  const unsigned pf[4] = {{{pack}({x}[2 * pc][0], {x}[2 * pc][1]), "
        f"{pack}({x}[2 * pc][2], {x}[2 * pc][3]), {pack}({x}[2 * pc + 1][0], {x}[2 * pc + 1][1]), "
        f"{pack}({x}[2 * pc + 1][2], {x}[2 * pc + 1][3])}};"
    )
    if nvb % 2 == 0:
        return [
            "#pragma unroll",
            f"for (int pc = 0; pc < {npc}; ++pc) {{",
            pf,
            "  #pragma unroll",
            f"  for (int a2 = 0; a2 < {nvb // 2}; ++a2) {{",
            "    unsigned bv[4];",
            f"    fflow_ldmatrix_sync_x4_trans(bv, {tile} + (pc * 16 + ((lane >> 3) & 1) * 8 "
            f"+ (lane & 7)) * {st} + (2 * a2 + (lane >> 4)) * 8);",
            f"    {mma}({acc}[2 * a2], pf, bv);",
            f"    {mma}({acc}[2 * a2 + 1], pf, bv + 2);",
            "  }",
            "}",
        ]
    return [
        "#pragma unroll",
        f"for (int pc = 0; pc < {npc}; ++pc) {{",
        f"  const unsigned pf[4] = {{{pack}({x}[2 * pc][0], {x}[2 * pc][1]), "
        f"{pack}({x}[2 * pc][2], {x}[2 * pc][3]), {pack}({x}[2 * pc + 1][0], {x}[2 * pc + 1][1]), "
        f"{pack}({x}[2 * pc + 1][2], {x}[2 * pc + 1][3])}};",
        "  #pragma unroll",
        f"  for (int a = 0; a < {nvb}; ++a) {{",
        f"    const unsigned short* vc = {tile} + (pc * 16 + 2 * qd) * {st} + a * 8 + g;",
        f"    const unsigned bf[2] = {{(unsigned)vc[0] | ((unsigned)vc[{st}] << 16), "
        f"(unsigned)vc[{8 * st}] | ((unsigned)vc[{9 * st}] << 16)}};",
        f"    {mma}({acc}[a], pf, bf);",
        "  }",
        "}",
    ]


def _zero(acc, nn):
    return [
        f"float {acc}[{nn}][4];",
        "#pragma unroll",
        f"for (int a = 0; a < {nn}; ++a)",
        f"  {acc}[a][0] = {acc}[a][1] = {acc}[a][2] = {acc}[a][3] = 0.f;",
    ]


def bwd_kernel(c, eqn):
    """dq, dk, dv on tensor cores: the SIMT kernel's two-halves grid (no atomics)."""
    kind = cuda_mma.kind_of(c.q_dtype)
    k = c.k
    k.helper(cuda_mma.guard(kind), cuda_mma.helper(kind))
    q, kk, v = c.names[:3]
    out, lse, ct = c.names[3 + c.has_mask :]
    dq, dk, dv = (k.output(o) for o in eqn.outputs)
    h, hv, s, t, n, kh, g = c.h, c.hv, c.s, c.t, c.n, c.kh, c.g
    # dQ half: S and dP tiles are 2·bk/8·4 registers beside 4·(h+hv)/16 of Q/dO fragments
    # and h/2 of dQ; 32 keys keep h=128 under 255 registers
    bk = min(key_tile(h, hv), 32 if max(h, hv) > 64 else 64)
    sth, stv = h + 8, hv + 8
    nqb, nkb = -(-t // BQ), -(-s // BQ)
    mma, pack = f"fflow_mma_sync_{kind}", f"fflow_pack_{kind}"
    scale, big, inv_s = c.lit(c.scale), c.lit(BIG_NEG), c.lit(1.0 / s)
    # dQ half: K and V tiles; dK/dV half: Q and dO tiles plus the block's 64 V rows
    smem = max(bk * (sth + stv), BQ2 * (sth + stv) + BQ * stv)
    load = c.rv.load

    def row(head, seq, heads, width, off=""):  # element offset of row `off + i`
        return lambda i: f"(((long long)b * {seq} + {off}{i}) * {heads} + {head}) * {width}"

    def p_ds(sv, dpv, lse_v, d_v, qi, kj, head):
        return [
            "float p = 0.f, ds = 0.f;",
            f"if ({qi} < {t} && {kj} < {s}) {{",
            f"  const bool ok = {c.mask_ok('b', head, qi, kj)};",
            # a fully masked row (lse == BIG_NEG: log(S) is below its ulp) averages all keys
            f"  p = {lse_v} <= {big} ? {inv_s} : (ok ? expf({sv} * {scale} - {lse_v}) : 0.f);",
            f"  ds = ok ? p * ({dpv} - {d_v}) : 0.f;",
            "}",
        ]

    ind = lambda lines, d=1: ["  " * d + x for x in lines]  # noqa: E731
    body = [
        f"__shared__ uint4 smw[{smem // 8}];  // 16-byte rows for ldmatrix",
        f"__shared__ float Ls[{BQ2}], Ds[{BQ2}];",
        "unsigned short* const T0 = (unsigned short*)smw;",
        "const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, qd = lane & 3;",
        f"const int b = blockIdx.x / {n}, n = blockIdx.x % {n};",
        f"if (blockIdx.y < {nqb}) {{  // dQ of 64 query rows, 16 per warp",
        f"  unsigned short* const Kt = T0; unsigned short* const Vt = T0 + {bk * sth};",
        f"  const int kvh = n / {g}, q0 = blockIdx.y * {BQ}, r0 = q0 + warp * 16 + g, r1 = r0 + 8;",
        *ind(_a_frags("qf", q, h // 16, row("n", t, n, h), lambda i: f"{i} < {t}")),
        *ind(_a_frags("of", ct, hv // 16, row("n", t, n, hv), lambda i: f"{i} < {t}")),
        "  float L[2], D[2];",
        "  #pragma unroll",
        "  for (int hh = 0; hh < 2; ++hh) {",
        "    const int i = hh ? r1 : r0; float acc = 0.f;",
        f"    L[hh] = i < {t} ? {lse}[((long long)b * {n} + n) * {t} + i] : 0.f;",
        f"    if (i < {t}) for (int d = qd; d < {hv}; d += 4) {{",
        f"      const long long e = (((long long)b * {t} + i) * {n} + n) * {hv} + d;",
        f"      acc += {load(f'{ct}[e]')} * {load(f'{out}[e]')};",
        "    }",
        "    for (int sh = 1; sh <= 2; sh <<= 1) acc += __shfl_xor_sync(0xffffffffu, acc, sh);",
        "    D[hh] = acc;",
        "  }",
        *ind(_zero("dqa", h // 8)),
        f"  const int kend = {f'(q0 + {BQ} < {s} ? q0 + {BQ} : {s})' if c.skip else s};",
        f"  for (int k0 = 0; k0 < kend; k0 += {bk}) {{",
        "    __syncthreads();",
        *ind(
            _stage(
                "Kt", sth, kk, bk, h, row("kvh", s, kh, h, "k0 + "), lambda r: f"k0 + {r} < {s}"
            ),
            2,
        ),  # fmt: skip
        *ind(
            _stage(
                "Vt", stv, v, bk, hv, row("kvh", s, kh, hv, "k0 + "), lambda r: f"k0 + {r} < {s}"
            ),
            2,
        ),  # fmt: skip
        "    __syncthreads();",
        *ind(_mma_bt(mma, "sc", "qf", "Kt", sth, bk // 8, h // 16), 2),
        *ind(_mma_bt(mma, "dp", "of", "Vt", stv, bk // 8, hv // 16), 2),
        "    #pragma unroll",
        f"    for (int nb = 0; nb < {bk // 8}; ++nb) for (int e = 0; e < 4; ++e) {{",
        "      const int qi = (e >> 1) ? r1 : r0, j = k0 + nb * 8 + 2 * qd + (e & 1);",
        *ind(p_ds("sc[nb][e]", "dp[nb][e]", "L[e >> 1]", "D[e >> 1]", "qi", "j", "n"), 3),
        "      sc[nb][e] = ds;",
        "    }",
        *ind(_mma_pk(mma, pack, "dqa", "sc", "Kt", sth, h // 8, bk // 16), 2),
        "  }",
        "  #pragma unroll",
        "  for (int hh = 0; hh < 2; ++hh) {",
        "    const int i = hh ? r1 : r0;",
        f"    if (i >= {t}) continue;",
        "    #pragma unroll",
        f"    for (int a = 0; a < {h // 8}; ++a) {{",
        f"      const long long e = (((long long)b * {t} + i) * {n} + n) * {h} + a * 8 + 2 * qd;",
        f"      {dq}[e] = {c.rq.store(f'dqa[a][2 * hh] * {scale}')};",
        f"      {dq}[e + 1] = {c.rq.store(f'dqa[a][2 * hh + 1] * {scale}')};",
        "    }",
        "  }",
        "} else {  // dK, dV of 64 keys of key/value head n, 16 per warp",
        f"  if (n >= {kh}) return;",
        f"  unsigned short* const Qt = T0; unsigned short* const Ot = T0 + {BQ2 * sth};",
        f"  unsigned short* const Vk = Ot + {BQ2 * stv};",
        f"  const int kvh = n, k0 = (blockIdx.y - {nqb}) * {BQ}, r0 = k0 + warp * 16 + g, "
        "r1 = r0 + 8;",
        *ind(_a_frags("kf", kk, h // 16, row("kvh", s, kh, h), lambda i: f"{i} < {s}")),
        # V's A fragments are re-read from shared memory by ldmatrix (registers: h=128
        # would spill holding both K's and V's)
        *ind(
            _stage(
                "Vk", stv, v, BQ, hv, row("kvh", s, kh, hv, "k0 + "), lambda r: f"k0 + {r} < {s}"
            )
        ),  # fmt: skip
        *ind(_zero("dka", h // 8)),
        *ind(_zero("dva", hv // 8)),
        f"  for (int gg = 0; gg < {g}; ++gg) {{",
        f"    const int hn = kvh * {g} + gg;",
        f"    for (int q0 = {f'(k0 / {BQ2}) * {BQ2}' if c.skip else 0}; q0 < {t}; q0 += {BQ2}) {{",
        "      __syncthreads();",
        *ind(
            _stage("Qt", sth, q, BQ2, h, row("hn", t, n, h, "q0 + "), lambda r: f"q0 + {r} < {t}"),
            3,
        ),  # fmt: skip
        *ind(
            _stage(
                "Ot", stv, ct, BQ2, hv, row("hn", t, n, hv, "q0 + "), lambda r: f"q0 + {r} < {t}"
            ),
            3,
        ),  # fmt: skip
        "      __syncthreads();",
        # D = rowsum(dO * O): 4 lanes per query row (dO from the staged tile), 2 shuffles
        "      {",
        "        const int rr = threadIdx.x / 4, i = q0 + rr; float acc = 0.f;",
        f"        if (i < {t}) for (int d = threadIdx.x % 4; d < {hv}; d += 4)",
        f"          acc += {load(f'Ot[rr * {stv} + d]')} * "
        f"{load(f'{out}[(((long long)b * {t} + i) * {n} + hn) * {hv} + d]')};",
        "        for (int sh = 1; sh <= 2; sh <<= 1) acc += __shfl_xor_sync(0xffffffffu, acc, sh);",
        "        if (threadIdx.x % 4 == 0) {",
        "          Ds[rr] = acc;",
        f"          Ls[rr] = i < {t} ? {lse}[((long long)b * {n} + hn) * {t} + i] : 0.f;",
        "        }",
        "      }",
        "      __syncthreads();",
        *ind(_mma_bt(mma, "st", "kf", "Qt", sth, BQ2 // 8, h // 16), 3),
        *ind(_mma_bt_ldm(mma, "dpt", "Vk", "Ot", stv, BQ2 // 8, hv // 16), 3),
        "      #pragma unroll",
        f"      for (int nb = 0; nb < {BQ2 // 8}; ++nb) for (int e = 0; e < 4; ++e) {{",
        "        const int kj = (e >> 1) ? r1 : r0, ii = nb * 8 + 2 * qd + (e & 1), i = q0 + ii;",
        *ind(p_ds("st[nb][e]", "dpt[nb][e]", "Ls[ii]", "Ds[ii]", "i", "kj", "hn"), 4),
        "        st[nb][e] = p; dpt[nb][e] = ds;",
        "      }",
        *ind(_mma_pk(mma, pack, "dva", "st", "Ot", stv, hv // 8, BQ2 // 16), 3),
        *ind(_mma_pk(mma, pack, "dka", "dpt", "Qt", sth, h // 8, BQ2 // 16), 3),
        "    }",
        "  }",
        "  #pragma unroll",
        "  for (int hh = 0; hh < 2; ++hh) {",
        "    const int j = hh ? r1 : r0;",
        f"    if (j >= {s}) continue;",
        "    #pragma unroll",
        f"    for (int a = 0; a < {h // 8}; ++a) {{",
        f"      const long long e = (((long long)b * {s} + j) * {kh} + kvh) * {h} + a * 8"
        " + 2 * qd;",
        f"      {dk}[e] = {c.rk.store(f'dka[a][2 * hh] * {scale}')};",
        f"      {dk}[e + 1] = {c.rk.store(f'dka[a][2 * hh + 1] * {scale}')};",
        "    }",
        "    #pragma unroll",
        f"    for (int a = 0; a < {hv // 8}; ++a) {{",
        f"      const long long e = (((long long)b * {s} + j) * {kh} + kvh) * {hv} + a * 8"
        " + 2 * qd;",
        f"      {dv}[e] = {c.rv.store('dva[a][2 * hh]')};",
        f"      {dv}[e + 1] = {c.rv.store('dva[a][2 * hh + 1]')};",
        "    }",
        "  }",
        "}",
    ]
    return k.finish(body, (c.b * n, nqb + nkb), 32 * WARPS)
