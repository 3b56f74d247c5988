// mok's E4M3 rounding (mok/core/fp8.h) against CUDA's own float -> E4M3 conversion with saturation
// (cuda_fp8.h's __nv_cvt_float_to_fp8 on the host: the rule of cvt.rn.satfinite.e4m3x2.f32), on
// every one of the 2^32 floats. No GPU needed; the device instruction itself is checked against the
// same function on the GPU (issue 19).
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <cstdint>

#include "mok/core/fp8.h"

namespace mok {
namespace {

TEST(E4m3Conversion, EqualsCudasOnEveryFloat) {
  uint64_t differing = 0, first = 0;
  for (uint64_t u = 0; u < (uint64_t(1) << 32); ++u) {
    const float f = float_of(uint32_t(u));
    if (to_e4m3(f).bits != uint8_t(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3)) && differing++ == 0) first = u;
  }
  EXPECT_EQ(differing, 0u) << "the first differing float has bits 0x" << std::hex << first;
}

}  // namespace
}  // namespace mok
