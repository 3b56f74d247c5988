// Does racecheck report hazards in a correct __syncthreads pattern after the warpgroups of a block used
// named barriers unevenly (as the megakernel's GEMM phases do: each consumer warpgroup its own barrier,
// the producer none)? One block of 384 threads (three warpgroups, as the megakernel's).
//   racecheck_probe <mode> <n>: mode bits: 1 consumer warpgroups 1 and 2 each pass n barriers of their
//   own id (bar.sync 1/2, 128); 2 the whole block meets at barrier.sync 3, 384 from two paths; 4 the
//   registers move (setmaxnreg 40 / 232 and back, as gemm_tiles); 8 all three warpgroups pass n
//   barriers of their own id (even counts); 16 warpgroup 0 passes one barrier of its own (with 1 and
//   n > 1: every warpgroup passed some, unevenly); 32 warpgroups 1 and 2 pass n bar.red.and of their
//   own id (as warpgroup_all) instead.
// Then the quantizer's pattern, four rounds: threads < 256 write words, barrier, threads < 128 read
// other threads' words, barrier, every thread reads, barrier. No word is written by one thread and
// accessed by another between two barriers, so a correct racecheck reports nothing.
#include <cstdio>
#include <cstdlib>

template <int kId, int kCount>
__device__ __forceinline__ void bar_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(kId), "n"(kCount) : "memory");
}
// bar.red.and on warpgroup wg's own id (1 or 2), as the megakernel's warpgroup_all.
__device__ __forceinline__ int sum_and(int wg, int v) {
  int r;
  if (wg == 1)
    asm volatile("{ .reg .pred p, q; setp.ne.s32 p, %1, 0; bar.red.and.pred q, 1, 128, p; selp.s32 %0, 1, 0, q; }\n"
                 : "=r"(r)
                 : "r"(v)
                 : "memory");
  else
    asm volatile("{ .reg .pred p, q; setp.ne.s32 p, %1, 0; bar.red.and.pred q, 2, 128, p; selp.s32 %0, 1, 0, q; }\n"
                 : "=r"(r)
                 : "r"(v)
                 : "memory");
  return r;
}
__device__ __forceinline__ void block_barrier() { asm volatile("barrier.sync 3, 384;\n" ::: "memory"); }

__global__ void __launch_bounds__(384, 1) probe(int mode, int n, unsigned* out) {
  __shared__ unsigned words[8][128];
  const int t = threadIdx.x, wg = __shfl_sync(~0u, t / 128, 0);
  if (mode & 4) {
    if (wg == 0) {
      asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
      block_barrier();
      block_barrier();
      asm volatile("setmaxnreg.inc.sync.aligned.u32 168;\n");
    } else {
      block_barrier();
      asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
      asm volatile("setmaxnreg.dec.sync.aligned.u32 168;\n");
      block_barrier();
    }
  }
  for (int i = 0; i < n; ++i) {
    if ((mode & 9) && wg == 1) bar_sync<1, 128>();
    if ((mode & 9) && wg == 2) bar_sync<2, 128>();
    if ((mode & 8) && wg == 0) bar_sync<4, 128>();
    if ((mode & 32) && wg > 0) sum_and(wg, t);
  }
  if ((mode & 16) && wg == 0) bar_sync<4, 128>();
  if (mode & 2) {
    if (wg == 0)
      block_barrier();
    else
      block_barrier();
  }
  __syncthreads();
  unsigned sum = 0;
  for (int round = 0; round < 4; ++round) {
    if (t < 256 && t % 32 < 16)
      for (int j = 0; j < 8; ++j) words[t / 32][(8 * (t % 16) + j) % 128] = unsigned(round * 1000 + t + j);
    __syncthreads();
    if (t < 128)
      for (int w = 0; w < 8; ++w) sum += words[w][t];
    __syncthreads();
    sum += words[t % 8][(t * 7) % 128];
    __syncthreads();
  }
  out[t] = sum;
}

int main(int argc, char** argv) {
  const int mode = argc > 1 ? atoi(argv[1]) : 0, n = argc > 2 ? atoi(argv[2]) : 1;
  unsigned* out;
  if (cudaMalloc(&out, 384 * sizeof(unsigned)) != cudaSuccess) return 2;
  probe<<<1, 384>>>(mode, n, out);
  const cudaError_t e = cudaDeviceSynchronize();
  unsigned h[384];
  cudaMemcpy(h, out, sizeof(h), cudaMemcpyDeviceToHost);
  printf("mode %d n %d: %s, out[0] %u out[383] %u\n", mode, n, cudaGetErrorString(e), h[0], h[383]);
  return e == cudaSuccess ? 0 : 1;
}
