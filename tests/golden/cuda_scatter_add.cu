extern "C" __global__ void fflow_ew_312dadfb3fed(const unsigned short* __restrict__ in0, unsigned short* __restrict__ out0) {
  for (int i = (int)blockIdx.x * blockDim.x + threadIdx.x; i < 10; i += (int)gridDim.x * blockDim.x) {
    float t1 = fflow_h2f(in0[i]);
    float t2 = fflow_h2f(fflow_f2h(t1));
    out0[i] = fflow_f2h(t2);
  }
}

#ifndef FFLOW_ATOMIC_ADD_FLOAT16
#define FFLOW_ATOMIC_ADD_FLOAT16
__device__ __forceinline__ void fflow_atomic_add_float16(unsigned short* p, float v) {
  unsigned long long a = (unsigned long long)p;
  unsigned* w = (unsigned*)(a & ~3ULL); int sh = (int)(a & 3ULL) * 8;
  unsigned old = *w, assumed;
  do { assumed = old; union { unsigned short u; unsigned short s; } c;
    c.u = (unsigned short)((assumed >> sh) & 65535u);
    float cur = fflow_h2f(c.s); c.s = fflow_f2h(fflow_h2f(fflow_f2h((cur + v))));
    unsigned nw = (assumed & ~(65535u << sh)) | ((unsigned)c.u << sh);
    old = atomicCAS(w, assumed, nw); } while (assumed != old);
}
#endif
extern "C" __global__ void fflow_scat_f23cd270fb33(const int* __restrict__ in0, const unsigned short* __restrict__ in1, unsigned short* __restrict__ out0) {
  for (int u = (int)blockIdx.x * blockDim.x + threadIdx.x; u < 6; u += (int)gridDim.x * blockDim.x) {
    int t1 = ((u) / 2);
    int t2 = ((u) % 2);
    int t3 = in0[(t1)];
    long long t4 = (long long)(t3);
    float t5 = fflow_h2f(in1[(t1) * 2 + (t2)]);
    if (t4 >= 0 && t4 < 5) fflow_atomic_add_float16(&out0[((int)(t4)) * 2 + (t2)], t5);
  }
}
