// Golden files (docs/golden-format.md) to and from the ops' tensors, through mok_golden, so the format
// has one implementation: mok.capture writes one layer call, tests read the committed goldens.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <string>

#include "op_config.h"

namespace mok::py {

// Tensors by their golden dataset name (x, dy, router, ..., given_topk_idx, topk_idx, logits, y, dx,
// d_w1, ...), CPU and contiguous.
using NamedTensors = std::map<std::string, at::Tensor>;

// One forward and backward of the ops as a golden: `tensors` holds the inputs, the forward's outputs
// (with `saved`, whose dispatch layout the golden stores) and the backward's. Mode replay_ids has no
// place in format v1 (mok::Error).
void write_golden(const std::string& path, const std::string& name, const std::string& description, const Call& call,
                  const NamedTensors& tensors);

struct GoldenRead {
  std::string name, description;
  Call call;  // mode router or given; ring_rows as the golden's options hold it
  NamedTensors tensors;
};

// read_golden's validated contents.
GoldenRead read_golden(const std::string& path);

}  // namespace mok::py
