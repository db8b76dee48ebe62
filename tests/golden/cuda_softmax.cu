extern "C" __global__ void fflow_row_4ed68e8a5ea0(const float* __restrict__ in0, float* __restrict__ out0) {
  const int tid = threadIdx.x & 31;
  const int nt = 32;
  for (int row = (int)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); row < 4; row += (int)gridDim.x * (blockDim.x >> 5)) {
    int t1 = (row);
    float xc0[4];
    #pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int jv = (int)(tid + c * nt) * 2;
      if (jv < 100) {
        const uint2 raw = ((const uint2*)(in0 + row * 100))[tid + c * nt];
        const float* rv = (const float*)&raw;
        #pragma unroll
        for (int l = 0; l < 2; ++l) xc0[c * 2 + l] = rv[l];
      }
    }
    float acc0 = (float)(__int_as_float(0xff800000));
    #pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int jv = (int)(tid + c * nt) * 2;
      if (jv < 100) {
        #pragma unroll
        for (int l = 0; l < 2; ++l) {
          const int j = jv + l;
          acc0 = fflow_max<float>(acc0, (float)(xc0[(c * 2 + l)]));
        }
      }
    }
    for (int o = 16; o > 0; o >>= 1)
      acc0 = fflow_max<float>(acc0, __shfl_xor_sync(0xffffffffu, acc0, o));
    const float red0 = (float)(acc0);
    float acc1 = (float)(0);
    #pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int jv = (int)(tid + c * nt) * 2;
      if (jv < 100) {
        #pragma unroll
        for (int l = 0; l < 2; ++l) {
          const int j = jv + l;
          float t2 = red0;
          float t3 = t2;
          float t4 = t3;
          float t5 = (xc0[(c * 2 + l)] - t4);
          float t6 = expf(t5);
          acc1 = (acc1 + (float)(t6));
        }
      }
    }
    for (int o = 16; o > 0; o >>= 1)
      acc1 = (acc1 + __shfl_xor_sync(0xffffffffu, acc1, o));
    const float red1 = (float)(acc1);
    const float red1_inv = 1.0f / red1;
    #pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int jv = (int)(tid + c * nt) * 2;
      if (jv < 100) {
        uint2 out0_raw;
        float* out0_v = (float*)&out0_raw;
        #pragma unroll
        for (int l = 0; l < 2; ++l) {
          const int j = jv + l;
          float t7 = red0;
          float t8 = t7;
          float t9 = t8;
          float t10 = (xc0[(c * 2 + l)] - t9);
          float t11 = expf(t10);
          float t12 = (t11 * red1_inv);
          out0_v[l] = t12;
        }
        ((uint2*)(out0 + row * 100))[tid + c * nt] = out0_raw;
      }
    }
  }
}
