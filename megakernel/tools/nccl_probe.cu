// mok-nccl-probe: the communication substrate of the NCCL backend (issue 8), checked on the GPUs at
// hand. One process drives R GPUs (R = 1 is allowed: NCCL accepts a one-rank communicator); each rank
// allocates a buffer with ncclMemAlloc and registers it as a symmetric window; every rank writes a
// pattern recording its origin, then reads its neighbour's buffer through the device-side LSA pointer
// (ncclGetLsaPointer), checks every word, and times a peer-to-local copy over that pointer.
// Whether NCCL gave the communicator symmetric memory is asked with ncclDevCommCreate: NCCL before
// 2.28.7 gives a one-rank communicator none and returns a host-side registration handle as its
// window (src/transport.cc, src/dev_runtime.cc of 2.28.3), which no kernel may read through. A
// one-rank run then reads its own ncclMemAlloc buffer directly, the pointer a rank always has.
//   mok-nccl-probe [ranks = all GPUs] [MiB per rank = 256]
// Exit status: 0 all words right, 1 a mismatch, 2 error, 77 no GPU.
#include <cuda_runtime.h>
#include <nccl.h>
#include <nccl_device.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "mok/core/tool_exit.h"
#include "mok/megakernel/check.h"
#include "mok/megakernel/nccl.h"
#include "mok/tools/cli_args.h"

namespace {

__host__ __device__ uint32_t pattern(int rank, size_t i) { return uint32_t(rank + 1) * 0x9e3779b9u ^ uint32_t(i); }

__global__ void fill(uint32_t* buf, size_t n, int rank) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    buf[i] = pattern(rank, i);
}

// The peer's buffer: through the symmetric window, or `own` (the rank's own buffer, when the
// communicator has no symmetric memory and the peer is the rank itself).
__device__ const void* peer_buffer(ncclWindow_t window, int peer, const void* own) {
  return own ? own : ncclGetLsaPointer(window, 0, peer);
}

__global__ void check_peer(ncclWindow_t window, const void* own, size_t n, int peer, unsigned long long* bad) {
  const uint32_t* p = static_cast<const uint32_t*>(peer_buffer(window, peer, own));
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    if (p[i] != pattern(peer, i)) atomicAdd(bad, 1ull);
}

__global__ void copy_from_peer(ncclWindow_t window, const void* own, size_t n16, int peer, int4* dst) {
  const int4* p = static_cast<const int4*>(peer_buffer(window, peer, own));
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n16; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = p[i];
}

}  // namespace

constexpr const char* kUsage = "usage: mok-nccl-probe [ranks >= 1 [MiB per rank in [1, 65536], default 256]]\n";

int tool_main(int argc, char** argv) {
  if (mok::printed_help(argc, argv, kUsage)) return 0;
  // Parsed whole before any GPU is asked for: atoi took "-1" MiB for 2^64 - 2^20 bytes and "4096x" for 4096.
  int ranks = 0, mib = 256;
  if (argc > 3 || (argc > 1 && !(mok::tools::parse_int(argv[1], ranks) && ranks >= 1)) ||
      (argc > 2 && !(mok::tools::parse_int(argv[2], mib) && mib >= 1 && mib <= 65536))) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  try {
    const int devices = mok::gpu::cuda_device_count();
    if (devices == 0) {
      std::printf("mok-nccl-probe: no CUDA device (skipped)\n");
      return 77;
    }
    if (argc <= 1) ranks = devices;
    const size_t bytes = size_t(mib) << 20;
    if (ranks > devices)
      throw mok::Error("mok-nccl-probe: ranks = " + std::to_string(ranks) + " exceeds the " + std::to_string(devices) +
                       " GPU(s)");
    int version = 0;
    MOK_NCCL_CHECK(ncclGetVersion(&version));
    std::printf("mok-nccl-probe: NCCL %d, %d rank(s) on %d GPU(s), %zu MiB per rank\n", version, ranks, devices,
                bytes >> 20);
    std::vector<int> devs(ranks);
    for (int r = 0; r < ranks; ++r) devs[r] = r;
    std::vector<ncclComm_t> comms(ranks);
    setenv("NCCL_NVLS_ENABLE", "0", 0);  // as the peer group's: no multicast unless asked (docs/multi-gpu.md)
    MOK_NCCL_CHECK(ncclCommInitAll(comms.data(), ranks, devs.data()));
    std::vector<void*> buf(ranks), local(ranks);
    std::vector<ncclWindow_t> win(ranks);
    std::vector<unsigned long long*> bad(ranks);
    for (int r = 0; r < ranks; ++r) {
      MOK_CUDA_CHECK(cudaSetDevice(r));
      MOK_NCCL_CHECK(ncclMemAlloc(&buf[r], bytes));
      MOK_CUDA_CHECK(cudaMalloc(&local[r], bytes));
      MOK_CUDA_CHECK(cudaMalloc(&bad[r], sizeof(unsigned long long)));
      MOK_CUDA_CHECK(cudaMemset(bad[r], 0, sizeof(unsigned long long)));
    }
    MOK_NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < ranks; ++r)
      MOK_NCCL_CHECK(ncclCommWindowRegister(comms[r], buf[r], bytes, &win[r], NCCL_WIN_COLL_SYMMETRIC));
    MOK_NCCL_CHECK(ncclGroupEnd());
    for (int r = 0; r < ranks; ++r)
      if (win[r] == nullptr)
        throw mok::Error("mok-nccl-probe: NCCL registered no window for rank " + std::to_string(r));
    const mok::gpu::SymmetricMemory memory = mok::gpu::symmetric_memory(comms);
    const bool symmetric = memory.available;
    if (!symmetric && ranks > 1)
      throw mok::Error("mok-nccl-probe: NCCL gives these " + std::to_string(ranks) +
                       " ranks no symmetric memory: " + memory.refusal);
    if (!symmetric)
      std::printf("mok-nccl-probe: no symmetric memory for one rank (%s): reading its own buffer\n",
                  memory.refusal.c_str());
    const size_t words = bytes / 4;
    for (int r = 0; r < ranks; ++r) {
      MOK_CUDA_CHECK(cudaSetDevice(r));
      fill<<<1024, 256>>>(static_cast<uint32_t*>(buf[r]), words, r);
      MOK_CUDA_CHECK(cudaGetLastError());
    }
    for (int r = 0; r < ranks; ++r) MOK_CUDA_CHECK(cudaSetDevice(r)), MOK_CUDA_CHECK(cudaDeviceSynchronize());
    unsigned long long total_bad = 0;
    for (int r = 0; r < ranks; ++r) {
      const int peer = (r + 1) % ranks;
      MOK_CUDA_CHECK(cudaSetDevice(r));
      const void* own = symmetric ? nullptr : buf[r];
      check_peer<<<1024, 256>>>(win[r], own, words, peer, bad[r]);
      MOK_CUDA_CHECK(cudaGetLastError());
      unsigned long long n = 0;
      MOK_CUDA_CHECK(cudaMemcpy(&n, bad[r], sizeof n, cudaMemcpyDeviceToHost));
      total_bad += n;
      cudaEvent_t start, stop;
      MOK_CUDA_CHECK(cudaEventCreate(&start));
      MOK_CUDA_CHECK(cudaEventCreate(&stop));
      std::vector<float> ms(5);
      for (float& t : ms) {
        MOK_CUDA_CHECK(cudaEventRecord(start));
        copy_from_peer<<<132 * 8, 512>>>(win[r], own, bytes / 16, peer, static_cast<int4*>(local[r]));
        MOK_CUDA_CHECK(cudaEventRecord(stop));
        MOK_CUDA_CHECK(cudaEventSynchronize(stop));
        MOK_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
      }
      std::sort(ms.begin(), ms.end());
      std::printf(
          "rank %d reads rank %d through its LSA pointer: %llu wrong words of %zu; copy %.1f GB/s (median of 5)\n", r,
          peer, n, words, double(bytes) / (ms[2] * 1e6));
      MOK_CUDA_CHECK(cudaEventDestroy(start));
      MOK_CUDA_CHECK(cudaEventDestroy(stop));
    }
    MOK_NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < ranks; ++r) MOK_NCCL_CHECK(ncclCommWindowDeregister(comms[r], win[r]));
    MOK_NCCL_CHECK(ncclGroupEnd());
    for (int r = 0; r < ranks; ++r) {
      MOK_CUDA_CHECK(cudaSetDevice(r));
      MOK_NCCL_CHECK(ncclMemFree(buf[r]));
      MOK_CUDA_CHECK(cudaFree(local[r]));
      MOK_CUDA_CHECK(cudaFree(bad[r]));
      MOK_NCCL_CHECK(ncclCommDestroy(comms[r]));
    }
    std::printf("mok-nccl-probe: %s\n", total_bad == 0 ? "every word right" : "MISMATCH");
    return total_bad == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}

// A report lost to a full disk or a closed pipe is no success.
int main(int argc, char** argv) { return mok::tool_exit_status("mok-nccl-probe", tool_main(argc, argv)); }
