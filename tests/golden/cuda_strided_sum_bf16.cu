extern "C" __global__ void fflow_red_d3f8db48e33f(const unsigned short* __restrict__ in0, unsigned short* __restrict__ out0) {
  for (int o = (int)blockIdx.x * blockDim.x + threadIdx.x; o < 3; o += (int)gridDim.x * blockDim.x) {
    int t1 = (o);
    float acc = (float)(0);
    for (int r = 0; r < 7; ++r) {
      int t2 = (r);
      float t3 = fflow_bf2f(in0[(t2) * 3 + (t1)]);
      acc = (acc + (float)(t3));
    }
    out0[o] = fflow_f2bf(fflow_bf2f(fflow_f2bf((float)(acc))));
  }
}
