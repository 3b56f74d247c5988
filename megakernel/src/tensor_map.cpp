#include "tensor_map.h"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <string>

#include "mok/core/config.h"
#include "mok/megakernel/check.h"

namespace mok::gpu {
namespace {

// The driver's encoder through the runtime: no link-time dependency on libcuda, so binaries still
// start (and GPU tests skip) on machines without a driver.
PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    MOK_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    require(found == cudaDriverEntryPointSuccess && fn != nullptr,
            "mok: the CUDA driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

}  // namespace

void encode_tensor_map(CUtensorMap& out, const void* base, long rows, long cols, MapElement element, int box_rows) {
  out = CUtensorMap{};
  if (rows == 0 || cols == 0) return;
  const bool e4m3 = element == MapElement::e4m3, f32 = element == MapElement::f32;
  const bool output = f32 || element == MapElement::bf16_out;
  const cuuint32_t bytes = e4m3 ? 1 : f32 ? 4 : 2;
  const cuuint32_t box_cols = (output ? 64 : 128) / bytes;  // a box row: the swizzle's span
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t row_stride[1] = {cuuint64_t(cols) * bytes};
  const cuuint32_t box[2] = {box_cols, cuuint32_t(box_rows)}, element_strides[2] = {1, 1};
  const CUtensorMapDataType type = e4m3  ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                   : f32 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                         : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const CUresult r =
      encoder()(&out, type, 2, const_cast<void*>(base), dims, row_stride, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, output ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  const char* name = e4m3 ? "E4M3" : f32 ? "fp32" : output ? "bf16 output" : "bf16";
  require(r == CUDA_SUCCESS, "mok: cuTensorMapEncodeTiled failed (CUresult " + std::to_string(int(r)) + ") for a [" +
                                 std::to_string(rows) + ", " + std::to_string(cols) + "] " + name + " matrix");
}

void TensorMapCache::encode(int slot, CUtensorMap& out, const void* base, long rows, long cols, MapElement element) {
  require(slot >= 0 && slot < int(entries_.size()),
          [&] { return "internal: tensor map slot " + std::to_string(slot); });
  Entry& e = entries_[slot];
  if (e.base != base || e.rows != rows || e.cols != cols || e.element != element) {
    encode_tensor_map(e.map, base, rows, cols, element);
    e.base = base, e.rows = rows, e.cols = cols, e.element = element;
  }
  out = e.map;
}

}  // namespace mok::gpu
