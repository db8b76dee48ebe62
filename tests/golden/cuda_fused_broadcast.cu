extern "C" __global__ void fflow_ew_3cf033a6b53c(const float* __restrict__ in0, const float* __restrict__ in1, float* __restrict__ out0) {
  for (int i = (int)blockIdx.x * blockDim.x + threadIdx.x; i < 15; i += (int)gridDim.x * blockDim.x) {
    int t1 = ((i) / 5);
    int t2 = ((i) % 5);
    float t3 = in0[(t1) * 5 + (t2)];
    float t4 = sinf(t3);
    float t5 = in1[(t2)];
    float t6 = t5;
    float t7 = (t4 * t6);
    float t8 = 1.0f;
    float t9 = (t7 + t8);
    out0[i] = t9;
  }
}
