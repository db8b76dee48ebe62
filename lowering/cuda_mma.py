"""Warp-level tensor-core products for generated kernels: `mma.sync.aligned.m16n8k16`.

`helper(kind)` is the C source of three device functions for 16-bit inputs
(`kind` "bf16" or "f16") with fp32 accumulation:

- `fflow_mma_sync_<kind>(float d[4], const unsigned a[4], const unsigned b[2])`:
  D = A·B + D for the warp's 16x16 A (row-major) and 16x8 B (column-major) tiles.
  On a GPU it is one `mma.sync.aligned.m16n8k16.row.col.f32.<kind>.<kind>.f32`
  (sm_80 and later); on the host shim `fflow_shim::mma16816` (cuda_shim.h)
  computes the same tile from the 32 lanes' registers. Every lane of the warp
  must call it together (the `sync` in its name also tells the shim to run the
  kernel's threads as fibers).
- `fflow_pack_<kind>(float lo, float hi)`: two floats rounded to nearest even to
  16 bits and packed into one register (lo in the low half), as an A/B fragment
  register holds: one `cvt.rn.<kind>x2.f32` on a GPU, the PREAMBLE's conversions
  on the host.

Fragment layout (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point
type"); g = lane >> 2, q = lane % 4:

- A register r holds A[g + 8 (r & 1)][2q + 8 (r >> 1) + {0, 1}];
- B register r holds B[2q + 8 r + {0, 1}][g];
- C/D element i is C[g + 8 (i >> 1)][2q + (i & 1)].

- `fflow_ldmatrix_sync_x4[_trans](unsigned r[4], const unsigned short* row)`:
  `ldmatrix.sync.aligned.m8n8.x4[.trans].b16` from shared memory (generic address;
  rows 16-byte aligned): lane 8j + i passes row i of 8x8 matrix j; register j gets
  row lane/4, elements 2(lane%4), +1, or with `.trans` column lane/4, rows 2(lane%4),
  +1. Non-transposed rows of Kᵀ's source K give B fragments of Q·Kᵀ; transposed rows
  of V give B fragments of P·V. Both kinds share them (own `#ifndef` guard).

So an f32 C fragment of S (two adjacent 16x8 tiles) re-packs in registers into the
A fragment of P for the next product, without shared memory.

Example:
    >>> from fflow.lowering.cuda_mma import helper
    >>> "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in helper("bf16")
    True
"""

_CVT = {"bf16": ("fflow_bf2f", "fflow_f2bf"), "f16": ("fflow_h2f", "fflow_f2h")}


def guard(kind):
    return f"FFLOW_MMA_{kind.upper()}"


def helper(kind):
    """C source of fflow_mma_sync_<kind> and fflow_pack_<kind> (after the PREAMBLE)."""
    widen, narrow = _CVT[kind]
    return f"""__device__ __forceinline__ void fflow_mma_sync_{kind}(float* d, const unsigned* a,
                                                   const unsigned* b) {{
#ifdef __CUDA_ARCH__
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32 "
      "{{%0, %1, %2, %3}}, {{%4, %5, %6, %7}}, {{%8, %9}}, {{%0, %1, %2, %3}};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  fflow_shim::mma16816(d, a, b, {widen});
#endif
}}
#ifndef FFLOW_LDMATRIX
#define FFLOW_LDMATRIX
__device__ __forceinline__ void fflow_ldmatrix_sync_x4(unsigned* r, const unsigned short* row) {{
#ifdef __CUDA_ARCH__
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.b16 {{%0, %1, %2, %3}}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "l"(row));
#else
  fflow_shim::ldmatrix_x4(r, row, false);
#endif
}}
__device__ __forceinline__ void fflow_ldmatrix_sync_x4_trans(unsigned* r,
                                                             const unsigned short* row) {{
#ifdef __CUDA_ARCH__
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.b16 {{%0, %1, %2, %3}}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "l"(row));
#else
  fflow_shim::ldmatrix_x4(r, row, true);
#endif
}}
#endif
__device__ __forceinline__ unsigned fflow_pack_{kind}(float lo, float hi) {{
#ifdef __CUDA_ARCH__
  unsigned r;  // cvt's first source goes to the upper half
  asm("cvt.rn.{kind}x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return (unsigned){narrow}(lo) | ((unsigned){narrow}(hi) << 16);
#endif
}}"""


def kind_of(dtype):
    """ "bf16"/"f16" for 16-bit float dtypes that have an mma, else None."""
    name = getattr(dtype, "name", str(dtype))
    return {"bfloat16": "bf16", "float16": "f16"}.get(name)
