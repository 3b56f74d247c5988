// fill_nan_on_error (nan_fill.h): one small launch behind the call, whose blocks read the error word and
// leave, or fill every output element by element (the error path's speed does not matter).
#include <cstdint>
#include <string>

#include "mok/core/gradient_add.h"
#include "mok/megakernel/check.h"
#include "nan_fill.h"

namespace mok::gpu {
namespace {

constexpr int kMaxOutputs = 8;

struct NanFill {
  const int* error_code;
  void* data[kMaxOutputs];
  int64_t elements[kMaxOutputs];
  bool bf16[kMaxOutputs];  // else fp32
  int count;
};

__global__ void fill_nan_kernel(const __grid_constant__ NanFill f) {
  if (*f.error_code == 0) return;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, stride = int64_t(gridDim.x) * blockDim.x;
  for (int i = 0; i < f.count; ++i)
    for (int64_t j = first; j < f.elements[i]; j += stride)
      if (f.bf16[i])
        static_cast<uint16_t*>(f.data[i])[j] = kCanonicalNanBf16;
      else
        static_cast<uint32_t*>(f.data[i])[j] = kCanonicalNanF32;
}

}  // namespace

void fill_nan_on_error(cudaStream_t stream, const int* error_code, std::initializer_list<TensorView> outputs) {
  NanFill f{error_code, {}, {}, {}, 0};
  for (const TensorView& v : outputs) {
    if (!v.data) continue;
    require(f.count < kMaxOutputs, "fill_nan_on_error: more than 8 outputs");
    require(v.dtype == DType::bf16 || v.dtype == DType::f32,
            [&] { return std::string("fill_nan_on_error: an output of dtype ") + dtype_name(v.dtype); });
    f.data[f.count] = v.data;
    f.elements[f.count] = int64_t(tensor_bytes(v.dtype, v.shape) / (v.dtype == DType::bf16 ? 2 : 4));
    f.bf16[f.count] = v.dtype == DType::bf16;
    ++f.count;
  }
  if (f.count == 0) return;
  constexpr int kBlocks = 264, kBlockThreads = 256;
  fill_nan_kernel<<<kBlocks, kBlockThreads, 0, stream>>>(f);
  MOK_CUDA_CHECK(cudaGetLastError());
}

const void* nan_fill_kernel() { return reinterpret_cast<const void*>(fill_nan_kernel); }

}  // namespace mok::gpu
