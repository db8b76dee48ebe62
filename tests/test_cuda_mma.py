"""The tensor-core mma.m16n8k16 device function (lowering/cuda_mma.py): its host-shim
emulation against NumPy on fragments laid out here from the PTX ISA's formulas, and
NVRTC builds whose PTX holds the mma.sync instruction."""

import numpy as np
import pytest
from cuda_harness import BF16, nvrtc_required
from fflow.lowering import cuda_mma, nvrtc
from fflow.lowering.cuda_render import PREAMBLE
from fflow.lowering.shim import ShimModule

KERNEL = """
extern "C" __global__ void mma_test(const unsigned* a, const unsigned* b, const float* c,
                                    float* d) {
  const int t = threadIdx.x;
  unsigned ar[4], br[2];
  float acc[4];
  for (int r = 0; r < 4; ++r) { ar[r] = a[t * 4 + r]; acc[r] = c[t * 4 + r]; }
  for (int r = 0; r < 2; ++r) br[r] = b[t * 2 + r];
  fflow_mma_sync_KIND(acc, ar, br);
  for (int r = 0; r < 4; ++r) d[t * 4 + r] = acc[r];
}
extern "C" __global__ void ldm_test(const unsigned short* m, unsigned* y) {
  __shared__ uint4 raw[32 * 16 / 8];  // 32 rows of 8, padded to 16; 16-byte aligned
  unsigned short* const tile = (unsigned short*)raw;
  for (int e = threadIdx.x; e < 256; e += 32) tile[(e / 8) * 16 + e % 8] = m[e];
  __syncthreads();
  fflow_ldmatrix_sync_x4(y + threadIdx.x * 8, tile + threadIdx.x * 16);
  fflow_ldmatrix_sync_x4_trans(y + threadIdx.x * 8 + 4, tile + threadIdx.x * 16);
}
extern "C" __global__ void pack_test(const float* x, unsigned* y) {
  y[threadIdx.x] = fflow_pack_KIND(x[2 * threadIdx.x], x[2 * threadIdx.x + 1]);
}
"""


def source(kind):
    return (
        PREAMBLE
        + cuda_mma.helper(kind)
        + KERNEL.replace("KIND", kind).replace("_test", "_test_" + kind)
    )


def fragments(A, B, C):
    """Per-lane registers from the PTX ISA formulas (g = lane >> 2, q = lane % 4)."""
    bits = lambda x: int(np.asarray(x).view(np.uint16))  # noqa: E731
    pack = lambda lo, hi: bits(lo) | bits(hi) << 16  # noqa: E731
    a, b, c = (np.zeros((32, n), dt) for n, dt in ((4, np.uint32), (2, np.uint32), (4, np.float32)))
    for lane in range(32):
        g, q = lane >> 2, lane % 4
        for r in range(4):
            row, col = g + 8 * (r & 1), 2 * q + 8 * (r >> 1)
            a[lane, r] = pack(A[row, col], A[row, col + 1])
            c[lane, r] = C[g + 8 * (r >> 1), 2 * q + (r & 1)]
        for r in range(2):
            b[lane, r] = pack(B[2 * q + 8 * r, g], B[2 * q + 8 * r + 1, g])
    return a, b, c


def unpack_d(d):
    D = np.zeros((16, 8), np.float32)
    for lane in range(32):
        g, q = lane >> 2, lane % 4
        for i in range(4):
            D[g + 8 * (i >> 1), 2 * q + (i & 1)] = d[lane, i]
    return D


def _dtype(kind):
    dtype = BF16 if kind == "bf16" else np.dtype(np.float16)
    if dtype is None:
        pytest.skip("ml_dtypes missing")
    return dtype


@pytest.mark.parametrize("kind", ["bf16", "f16"])
def test_emulated_mma_matches_numpy_on_random_fragments(kind):
    dtype = _dtype(kind)
    rng = np.random.default_rng(7)
    warps = []
    for _ in range(2):  # two warps of one block hold different tiles
        A = rng.standard_normal((16, 16)).astype(dtype)
        B = rng.standard_normal((16, 8)).astype(dtype)
        C = rng.standard_normal((16, 8)).astype(np.float32)
        warps.append((A, B, C, fragments(A, B, C)))
    a, b, c = (np.concatenate([w[3][i] for w in warps]) for i in range(3))
    d = np.zeros((64, 4), np.float32)
    ShimModule(source(kind)).get_function("mma_test_" + kind)((1,), (64,), (a, b, c, d))
    for w, (A, B, C, _) in enumerate(warps):
        ref = A.astype(np.float64) @ B.astype(np.float64) + C
        got = unpack_d(d[32 * w : 32 * w + 32])
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
        # the layout matters: A's transpose (or B read row-wise) gives another tile
        wrong = A.T.astype(np.float64) @ B.astype(np.float64) + C
        assert np.abs(got - wrong).max() > 0.1


@pytest.mark.parametrize("kind", ["bf16", "f16"])
def test_pack_rounds_to_nearest_even_low_half_first(kind):
    dtype = _dtype(kind)
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(64) * 10).astype(np.float32)
    x[:4] = [1 + 2**-9, 1 + 3 * 2**-9, -0.0, 65504.0]  # ties round to even; -0 keeps its sign
    y = np.zeros(32, np.uint32)
    ShimModule(source(kind)).get_function("pack_test_" + kind)((1,), (32,), (x, y))
    bits = x.astype(dtype).view(np.uint16).astype(np.uint32)
    np.testing.assert_array_equal(y, bits[0::2] | bits[1::2] << 16)


def test_emulated_ldmatrix_x4_and_trans_match_the_ptx_layout():
    """Lane 8j + i gives row i of matrix j; register j of lane l: row l/4, cols 2(l%4)
    and +1 (low half first); .trans: column l/4, rows 2(l%4) and +1."""
    m = np.random.default_rng(2).integers(0, 1 << 16, (32, 8)).astype(np.uint16)
    y = np.zeros((32, 8), np.uint32)
    ShimModule(source("bf16")).get_function("ldm_test_bf16")((1,), (32,), (m, y))
    pair = lambda lo, hi: np.uint32(lo) | np.uint32(hi) << np.uint32(16)  # noqa: E731
    for lane in range(32):
        a, c = lane // 4, 2 * (lane % 4)
        for j in range(4):
            mat = m[8 * j : 8 * j + 8].astype(np.uint32)
            assert y[lane, j] == pair(mat[a, c], mat[a, c + 1]), (lane, j)
            assert y[lane, 4 + j] == pair(mat[c, a], mat[c + 1, a]), (lane, j, "trans")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_nvrtc_builds_mma_sync(arch):
    if not nvrtc_required():
        pytest.skip("libnvrtc does not load here")
    src = source("bf16") + source("f16").replace(PREAMBLE, "")
    ptx = nvrtc.compile_ptx(src, arch="compute_" + arch[3:]).decode()
    assert "cvt.rn.bf16x2.f32" in ptx and "cvt.rn.f16x2.f32" in ptx
    assert "ldmatrix.sync.aligned.m8n8.x4.b16" in ptx
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.b16" in ptx
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
    assert nvrtc.compile_cubin(src, arch=arch)[:4] == b"\x7fELF"
