// Does racecheck count a named barrier of one warpgroup (bar.sync 1, 128: the megakernel's
// warpgroup_sync) as a step of the whole block's barrier? A block of 384 threads in the megakernel's
// roles: warpgroup 0 (the producer) and warpgroups 1, 2 (the consumers). First the consumers alone meet
// `named` times at their own named barriers (1 and 2, 128 threads each), as the GEMM epilogues do; then
// every thread runs rounds of: __syncthreads; the consumers write a shared row; __syncthreads; every
// thread reads it (chain_gemm's stage and fma loop). The rounds are race-free as written; run under
//   compute-sanitizer --tool racecheck ./racecheck_named_barriers <named>
// a hazard between a consumer's write and a producer's read means the tool miscounts.
#include <cstdio>
#include <cstdlib>

__device__ void warpgroup_sync(int warpgroup) {
  if (warpgroup == 1)
    asm volatile("bar.sync 1, 128;\n" ::: "memory");
  else
    asm volatile("bar.sync 2, 128;\n" ::: "memory");
}

__global__ void rounds(int named, float* out) {
  __shared__ float row[256];
  const int warpgroup = threadIdx.x / 128;
  if (warpgroup > 0)
    for (int i = 0; i < named; ++i) warpgroup_sync(warpgroup);
  float sum = 0.0f;
  for (int round = 0; round < 4; ++round) {
    __syncthreads();  // the last round's reads are done
    if (warpgroup > 0) row[threadIdx.x - 128] = float(round * 1000 + threadIdx.x);
    __syncthreads();
    sum += row[(threadIdx.x * 7 + round) % 256];
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

int main(int argc, char** argv) {
  const int named = argc > 1 ? std::atoi(argv[1]) : 0;
  float* out;
  if (cudaMalloc(&out, 4 * 384 * sizeof(float)) != cudaSuccess) return 2;
  rounds<<<4, 384>>>(named, out);
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("named barriers %d: %s\n", named, cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
