extern "C" __global__ void fflow_row_6dcfdaa48905(const float* __restrict__ in0, float* __restrict__ out0, float* __restrict__ out1, float* __restrict__ out2) {
  const int tid = threadIdx.x & 31;
  const int nt = 32;
  for (int row = (int)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); row < 4; row += (int)gridDim.x * (blockDim.x >> 5)) {
    int t1 = (row);
    float acc0 = (float)(__int_as_float(0xff800000));
    #pragma unroll 4
    for (int j = tid; j < 100; j += nt) {
      float t2 = in0[(t1) * 100 + ((j))];
      acc0 = fflow_max<float>(acc0, (float)(t2));
    }
    for (int o = 16; o > 0; o >>= 1)
      acc0 = fflow_max<float>(acc0, __shfl_xor_sync(0xffffffffu, acc0, o));
    const float red0 = (float)(acc0);
    float acc1 = (float)(0);
    #pragma unroll 4
    for (int j = tid; j < 100; j += nt) {
      float t3 = in0[(t1) * 100 + ((j))];
      float t4 = red0;
      float t5 = t4;
      float t6 = t5;
      float t7 = (t3 - t6);
      float t8 = expf(t7);
      acc1 = (acc1 + (float)(t8));
    }
    for (int o = 16; o > 0; o >>= 1)
      acc1 = (acc1 + __shfl_xor_sync(0xffffffffu, acc1, o));
    const float red1 = (float)(acc1);
    const float red1_inv = 1.0f / red1;
    if (tid == 0) {
      out1[row] = red0;
      out2[row] = red1;
    }
    #pragma unroll 4
    for (int j = tid; j < 100; j += nt) {
      float t9 = in0[(t1) * 100 + ((j))];
      float t10 = red0;
      float t11 = t10;
      float t12 = t11;
      float t13 = (t9 - t12);
      float t14 = expf(t13);
      float t15 = (t14 * red1_inv);
      out0[row * 100 + j] = t15;
    }
  }
}
