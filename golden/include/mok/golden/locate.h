// Naming elements of a golden's tensors: index -> coordinates -> layer terms (rank, token, slot,
// expert, column), and raw bits -> text. Shared by `mok-golden check` and mok-verify.
#pragma once

#include <optional>
#include <string>

#include "mok/golden/golden.h"

namespace mok::golden {

// The first element whose bits differ (tensors of the same dtype and shape), or none.
std::optional<int64_t> first_difference(const Tensor& want, const Tensor& got);

// "y[37, 12]"
std::string element_name(const Tensor& t, int64_t index);

// Where element `index` of tensor `name` sits in the layer, e.g. "rank 1, token 5 (global 37),
// column 12" or "expert 3 (rank 1), up row 7, column 40". Uses the golden's config and its routing
// (topk_idx, offsets) to name the expert of a slot or layout row.
std::string locate(const GoldenCase& golden, const std::string& name, int64_t index);

// "0x3f80 (1)": the bits in hex and the value (bf16 and f32 as decimal floats, i32 as integers).
std::string describe_bits(DType dtype, uint32_t bits);

}  // namespace mok::golden
