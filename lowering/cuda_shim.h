// Host shim: runs fflow's generated CUDA C on the CPU, compiled by g++.
//
// It defines the CUDA built-ins the generated kernels use (threadIdx, blockIdx,
// __shared__, __syncthreads, warp shuffles, atomics, a few intrinsics) and a
// scheduler that runs a grid block by block. The threads of a block are fibers
// (ucontext): __syncthreads() and the warp-level operations switch fibers, so
// shared memory, barriers and shuffles behave as on the GPU. A fiber is started once
// per launch (makecontext) and then runs the kernel for block after block; switches
// use _setjmp/_longjmp (no signal-mask system calls, unlike swapcontext). Kernels with no
// barrier run their threads as plain calls (no fibers), which is much faster.
//
// Everything is single-threaded: __shared__ variables become function statics
// (shared by the fibers of the running block, reused by the next block) and
// atomics are plain read-modify-writes.
#pragma once
#define FFLOW_SHIM 1

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <setjmp.h>
#include <ucontext.h>

// Math functions: declared here instead of <math.h>, whose C++ wrapper costs half a
// second of g++ time per kernel library.
extern "C" {
float expf(float);
double exp(double);
float sinf(float);
double sin(double);
float cosf(float);
double cos(double);
float tanf(float);
double tan(double);
float asinf(float);
double asin(double);
float acosf(float);
double acos(double);
float atanf(float);
double atan(double);
float sinhf(float);
double sinh(double);
float coshf(float);
double cosh(double);
float tanhf(float);
double tanh(double);
float asinhf(float);
double asinh(double);
float acoshf(float);
double acosh(double);
float atanhf(float);
double atanh(double);
float exp2f(float);
double exp2(double);
float expm1f(float);
double expm1(double);
float logf(float);
double log(double);
float log1pf(float);
double log1p(double);
float log2f(float);
double log2(double);
float log10f(float);
double log10(double);
float sqrtf(float);
double sqrt(double);
float cbrtf(float);
double cbrt(double);
float erff(float);
double erf(double);
float erfcf(float);
double erfc(double);
float fabsf(float);
double fabs(double);
float floorf(float);
double floor(double);
float ceilf(float);
double ceil(double);
float roundf(float);
double round(double);
float rintf(float);
double rint(double);
float truncf(float);
double trunc(double);
float fmodf(float, float);
double fmod(double, double);
float powf(float, float);
double pow(double, double);
float atan2f(float, float);
double atan2(double, double);
float nextafterf(float, float);
double nextafter(double, double);
float fminf(float, float);
double fmin(double, double);
float fmaxf(float, float);
double fmax(double, double);
float fmaf(float, float, float);
double fma(double, double, double);
void* malloc(size_t);
void* calloc(size_t, size_t);
void free(void*);
void abort(void);
}

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __shared__ static
#define __constant__ static
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __align__(n) alignas(n)

struct dim3 {
  unsigned int x, y, z;
};
struct alignas(8) uint2 {
  unsigned int x, y;
};
struct alignas(16) uint4 {
  unsigned int x, y, z, w;
};
struct alignas(8) float2 {
  float x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};

static dim3 threadIdx, blockIdx, blockDim, gridDim;
static const int warpSize = 32;

namespace fflow_shim {

enum { RUNNABLE = 0, WAIT_BLOCK = 1, WAIT_WARP = 2, DONE = 3 };

struct Fiber {
  ucontext_t ctx;
  jmp_buf jb;
  int state;
  bool started;
};

static ucontext_t sched_ctx;
static jmp_buf sched_jb;
static Fiber* fibers = nullptr;
static char* stacks = nullptr;
static int capacity = 0;
static int nthreads = 0;
static int current = 0;
static bool use_fibers = false;
static const size_t stack_size = 64 * 1024;
static void (*body)(void*) = nullptr;
static void* body_arg = nullptr;
static unsigned long long shfl_slots[1024];
static char* dyn_smem = nullptr;
static size_t dyn_smem_size = 0;

static inline void set_thread(int t) {
  current = t;
  threadIdx.x = t % blockDim.x;
  threadIdx.y = (t / blockDim.x) % blockDim.y;
  threadIdx.z = t / (blockDim.x * blockDim.y);
}

static inline int linear_tid() {
  return (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
}

// Back to the scheduler; returns when the scheduler resumes this fiber.
static inline void yield_fiber() {
  if (!_setjmp(fibers[current].jb)) _longjmp(sched_jb, 1);
}

static void fiber_main() {
  for (;;) {  // one pass per block of the grid; parked (DONE) in between
    body(body_arg);
    fibers[current].state = DONE;
    yield_fiber();
  }
}

static void fail(const char* msg) {
  fprintf(stderr, "fflow cuda shim: %s\n", msg);
  abort();
}

// Park the current fiber until the barrier of `kind` releases it.
static inline void wait(int kind) {
  if (!use_fibers) fail("a barrier or shuffle ran in a kernel launched without fibers");
  fibers[current].state = kind;
  yield_fiber();
}

static void ensure_capacity(int n) {
  if (n <= capacity) return;
  free(fibers);
  free(stacks);
  fibers = (Fiber*)calloc(n, sizeof(Fiber));
  stacks = (char*)malloc(stack_size * (size_t)n);
  if (!fibers || !stacks) fail("out of memory for fiber stacks");
  capacity = n;
}

static void start_fibers() {
  ensure_capacity(nthreads);
  ucontext_t proto;
  getcontext(&proto);
  for (int t = 0; t < nthreads; ++t) {
    Fiber& f = fibers[t];
    f.ctx = proto;
    f.ctx.uc_stack.ss_sp = stacks + stack_size * (size_t)t;
    f.ctx.uc_stack.ss_size = stack_size;
    f.ctx.uc_link = nullptr;  // fiber_main never returns
    makecontext(&f.ctx, fiber_main, 0);
    f.started = false;
  }
}

static inline void resume(int t) {
  set_thread(t);
  if (!_setjmp(sched_jb)) {
    Fiber& f = fibers[t];
    if (!f.started) {
      f.started = true;
      swapcontext(&sched_ctx, &f.ctx);  // first entry onto the fiber's own stack
    } else {
      _longjmp(f.jb, 1);
    }
  }
}

static void run_block_fibers() {
  for (int t = 0; t < nthreads; ++t) fibers[t].state = RUNNABLE;
  for (;;) {
    for (int t = 0; t < nthreads; ++t) {
      if (fibers[t].state != RUNNABLE) continue;
      resume(t);
    }
    // Everyone is parked or done: release the barriers that are complete.
    bool released = false, all_done = true, any_warp_wait = false;
    for (int w = 0; w * 32 < nthreads; ++w) {
      int lo = w * 32, hi = lo + 32 < nthreads ? lo + 32 : nthreads;
      bool warp_ready = true, warp_waits = false;
      for (int t = lo; t < hi; ++t) {
        int s = fibers[t].state;
        if (s != DONE) all_done = false;
        if (s == WAIT_WARP) warp_waits = true;
        else if (s != DONE) warp_ready = false;
      }
      any_warp_wait |= warp_waits;
      if (warp_waits && warp_ready) {
        for (int t = lo; t < hi; ++t)
          if (fibers[t].state == WAIT_WARP) fibers[t].state = RUNNABLE;
        released = true;
      }
    }
    if (all_done) return;
    if (released) continue;
    if (!any_warp_wait) {
      for (int t = 0; t < nthreads; ++t)
        if (fibers[t].state == WAIT_BLOCK) fibers[t].state = RUNNABLE;
      continue;
    }
    fail("deadlock: threads wait at different barriers (divergent __syncthreads/shuffle)");
  }
}

static void run_grid(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                     size_t smem, int with_fibers, void (*fn)(void*), void* arg) {
  gridDim = {gx, gy, gz};
  blockDim = {bx, by, bz};
  nthreads = (int)(bx * by * bz);
  if (nthreads > 1024) fail("more than 1024 threads per block");
  if (smem > dyn_smem_size) {
    free(dyn_smem);
    dyn_smem = (char*)calloc(smem, 1);
    dyn_smem_size = smem;
  }
  use_fibers = with_fibers != 0;
  body = fn;
  body_arg = arg;
  if (use_fibers) start_fibers();
  for (unsigned z = 0; z < gz; ++z)
    for (unsigned y = 0; y < gy; ++y)
      for (unsigned x = 0; x < gx; ++x) {
        blockIdx = {x, y, z};
        if (use_fibers) {
          run_block_fibers();
        } else {
          for (int t = 0; t < nthreads; ++t) {
            set_thread(t);
            fn(arg);
          }
        }
      }
}

template <class T>
static inline T shuffle(T v, int src_lane_in_warp) {
  static_assert(sizeof(T) <= sizeof(unsigned long long), "shuffle of a large type");
  int t = linear_tid();
  memcpy(&shfl_slots[t], &v, sizeof(T));
  wait(WAIT_WARP);
  T r;
  int src = (t / 32) * 32 + src_lane_in_warp;
  if (src >= nthreads) src = t;
  memcpy(&r, &shfl_slots[src], sizeof(T));
  wait(WAIT_WARP);
  return r;
}

// Tensor-core mma.m16n8k16 (row.col, 16-bit A/B, fp32 C/D) for one warp, emulated:
// each lane publishes its fragments in warp-shared scratch, the warp barrier makes
// them visible, every lane computes its own four D elements from all lanes' A and B
// registers (PTX ISA "Matrix Fragments for mma.m16n8k16 with floating point type":
// g = lane >> 2, q = lane % 4; A reg r holds row g + 8 (r & 1), cols 2q + 8 (r >> 1)
// and +1 in its low/high half; B reg r holds rows 2q + 8 r, +1 of column g; C/D
// element i is row g + 8 (i >> 1), col 2q + (i & 1)), and a second barrier keeps the
// scratch until the whole warp has read it. `cvt` widens one 16-bit element.
static unsigned mma_a[1024][4], mma_b[1024][2];

static inline float mma_elem(const unsigned* regs, int r, int half, float (*cvt)(unsigned short)) {
  return cvt((unsigned short)(half ? regs[r] >> 16 : regs[r] & 0xffffu));
}

static inline void mma16816(float* d, const unsigned* a, const unsigned* b,
                            float (*cvt)(unsigned short)) {
  const int t = linear_tid(), w0 = t - t % 32, lane = t % 32;
  if (w0 + 32 > nthreads) fail("mma.sync needs a full warp of 32 threads");
  memcpy(mma_a[t], a, sizeof(mma_a[t]));
  memcpy(mma_b[t], b, sizeof(mma_b[t]));
  wait(WAIT_WARP);
  const int g = lane >> 2, q = lane & 3;
  float out[4];
  for (int i = 0; i < 4; ++i) {
    const int row = g + 8 * (i >> 1), col = 2 * q + (i & 1);
    float acc = d[i];
    for (int k = 0; k < 16; ++k) {
      const int half = k & 1, kq = (k % 8) / 2, hi = k >= 8;
      const float x = mma_elem(mma_a[w0 + (row % 8) * 4 + kq], (row >= 8) + 2 * hi, half, cvt);
      const float y = mma_elem(mma_b[w0 + col * 4 + kq], hi, half, cvt);
      acc += x * y;
    }
    out[i] = acc;
  }
  wait(WAIT_WARP);
  memcpy(d, out, sizeof(out));
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].b16, emulated: lane 8j + i gives the address of
// row i of matrix j; register j of lane l receives row l/4, elements 2(l%4) and +1 (low
// half first) of matrix j, or with .trans column l/4, rows 2(l%4) and +1.
static const unsigned short* ldm_rows[1024];

static inline void ldmatrix_x4(unsigned* r, const unsigned short* row, bool trans) {
  const int t = linear_tid(), w0 = t - t % 32, lane = t % 32;
  if (w0 + 32 > nthreads) fail("ldmatrix needs a full warp of 32 threads");
  ldm_rows[t] = row;
  wait(WAIT_WARP);
  const int a = lane / 4, c = 2 * (lane % 4);
  for (int j = 0; j < 4; ++j) {
    const unsigned short* const* m = ldm_rows + w0 + 8 * j;
    const unsigned lo = trans ? m[c][a] : m[a][c], hi = trans ? m[c + 1][a] : m[a][c + 1];
    r[j] = lo | (hi << 16);
  }
  wait(WAIT_WARP);
}

}  // namespace fflow_shim

static inline void __syncthreads() { fflow_shim::wait(fflow_shim::WAIT_BLOCK); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
  (void)mask;
  fflow_shim::wait(fflow_shim::WAIT_WARP);
}
static inline void __threadfence() {}
static inline void __threadfence_block() {}

template <class T>
static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  (void)mask;
  int lane = fflow_shim::linear_tid() % 32;
  return fflow_shim::shuffle(v, (lane / width) * width + (src % width));
}
template <class T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  (void)mask;
  int lane = fflow_shim::linear_tid() % 32;
  int src = lane + (int)delta;
  if (src / width != lane / width) src = lane;
  return fflow_shim::shuffle(v, src);
}
template <class T>
static inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  (void)mask;
  int lane = fflow_shim::linear_tid() % 32;
  int src = lane - (int)delta;
  if (src < 0 || src / width != lane / width) src = lane;
  return fflow_shim::shuffle(v, src);
}
template <class T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  (void)mask;
  int lane = fflow_shim::linear_tid() % 32;
  int src = lane ^ lane_mask;
  if (src / width != lane / width) src = lane;
  return fflow_shim::shuffle(v, src);
}

// Atomics: the shim runs one thread at a time, so a read-modify-write is atomic.
template <class T>
static inline T atomicAdd(T* p, T v) {
  T old = *p;
  *p = old + v;
  return old;
}
template <class T>
static inline T atomicMax(T* p, T v) {
  T old = *p;
  if (v > old) *p = v;
  return old;
}
template <class T>
static inline T atomicMin(T* p, T v) {
  T old = *p;
  if (v < old) *p = v;
  return old;
}
template <class T>
static inline T atomicExch(T* p, T v) {
  T old = *p;
  *p = v;
  return old;
}
template <class T>
static inline T atomicCAS(T* p, T compare, T v) {
  T old = *p;
  if (old == compare) *p = v;
  return old;
}

// Intrinsics.
static inline float __int_as_float(int x) {
  float f;
  memcpy(&f, &x, 4);
  return f;
}
static inline int __float_as_int(float x) {
  int i;
  memcpy(&i, &x, 4);
  return i;
}
static inline float __uint_as_float(unsigned x) {
  float f;
  memcpy(&f, &x, 4);
  return f;
}
static inline unsigned __float_as_uint(float x) {
  unsigned i;
  memcpy(&i, &x, 4);
  return i;
}
static inline double __longlong_as_double(long long x) {
  double d;
  memcpy(&d, &x, 8);
  return d;
}
static inline long long __double_as_longlong(double x) {
  long long i;
  memcpy(&i, &x, 8);
  return i;
}
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float __fdividef(float a, float b) { return a / b; }
template <class T>
static inline T __ldg(const T* p) {
  return *p;
}
static inline unsigned __umulhi(unsigned a, unsigned b) {
  return (unsigned)(((unsigned long long)a * b) >> 32);
}
static inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }

// CUDA's double erfinv (not in libm): Giles' single-precision start, then Newton on erf.
static inline double erfinv(double y) {
  if (y <= -1.0 || y >= 1.0) return y == 1.0 ? __longlong_as_double(0x7ff0000000000000LL)
                                   : y == -1.0 ? -__longlong_as_double(0x7ff0000000000000LL)
                                               : __longlong_as_double(0x7ff8000000000000LL);
  double w = -log1p(-y * y), p;
  if (w < 5.0) {
    w -= 2.5;
    p = 2.81022636e-08;
    const double c[] = {3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                        -0.00125372503, -0.00417768164, 0.246640727, 1.50140941};
    for (double ci : c) p = p * w + ci;
  } else {
    w = sqrt(w) - 3.0;
    p = -0.000200214257;
    const double c[] = {0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                        -0.0076224613, 0.00943887047, 1.00167406, 2.83297682};
    for (double ci : c) p = p * w + ci;
  }
  double x = p * y;
  for (int i = 0; i < 4; ++i) x -= (erf(x) - y) / (1.1283791670955126 * exp(-x * x));
  return x;
}
