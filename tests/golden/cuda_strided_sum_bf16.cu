extern "C" __global__ void fflow_cred_c00cd073b9b8(const unsigned short* __restrict__ in0, unsigned short* __restrict__ out0) {
  __shared__ float part[8][33];
  const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
  const int col = (int)blockIdx.x * 32 + tx;
  const int r0 = (int)blockIdx.y * 7;
  const int r1 = r0 + 7 < 7 ? r0 + 7 : 7;
  float acc = (float)(0);
  if (col < 3) {
    for (int r = r0 + ty; r < r1; r += 8) {
      int t1 = (col);
      int t2 = (r);
      float t3 = fflow_bf2f(in0[(t2) * 3 + (t1)]);
      acc = (acc + (float)(t3));
    }
  }
  part[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && col < 3) {
    for (int s = 1; s < 8; ++s) acc = (acc + part[s][tx]);
    out0[col] = fflow_f2bf(fflow_bf2f(fflow_f2bf((float)(acc))));
  }
}
