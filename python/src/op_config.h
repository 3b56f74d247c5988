// The ops' vocabulary for a layer call: mok::LayerConfig as two flat lists (config_ints, config_floats),
// the routing mode and the launch settings. The tables below are the only place that names the fields
// and their order; Python reads them (mok._C.CONFIG_INT_FIELDS, ...) and packs its MoEConfig by them.
#pragma once

#include <c10/util/ArrayRef.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "mok/core/config.h"
#include "mok/core/layer_io.h"
#include "mok/core/saved_layout.h"
#include "mok/core/validate.h"

namespace mok::py {

// One int field of LayerConfig: its name, the values it accepts, and how to read and write it (the
// int32 counts, the ScoreMode enum and the renormalize flag all travel as int64).
struct IntField {
  const char* name;
  int64_t min, max;
  int64_t (*get)(const LayerConfig&);
  void (*set)(LayerConfig&, int64_t);
};

inline constexpr int64_t kInt32Max = 2147483647;

// The macro names each field once, as the member and as its string; one field a line.
// clang-format off
#define MOK_INT_FIELD(field, min, max)                                              \
  IntField{#field, min, max, [](const LayerConfig& c) { return int64_t(c.field); }, \
           [](LayerConfig& c, int64_t v) { c.field = static_cast<decltype(c.field)>(v); }}
inline constexpr IntField kIntFields[] = {
    MOK_INT_FIELD(ranks, 1, kInt32Max),
    MOK_INT_FIELD(tokens_per_rank, 1, kInt32Max),
    MOK_INT_FIELD(experts, 1, kInt32Max),
    MOK_INT_FIELD(hidden, 1, kInt32Max),
    MOK_INT_FIELD(intermediate, 1, kInt32Max),
    MOK_INT_FIELD(top_k, 1, kInt32Max),
    MOK_INT_FIELD(score_mode, 0, 1),  // ScoreMode: softmax 0, sigmoid 1 (kScoreModes)
    MOK_INT_FIELD(renormalize, 0, 1),
    MOK_INT_FIELD(n_group, 1, kInt32Max),
    MOK_INT_FIELD(topk_group, 1, kInt32Max),
    MOK_INT_FIELD(shared_intermediate, 0, kInt32Max),
    MOK_INT_FIELD(precision, 0, 1),  // Precision: bf16 0, fp8 1 (kPrecisions)
};
#undef MOK_INT_FIELD
// clang-format on

struct FloatField {
  const char* name;
  float LayerConfig::*member;
};
inline constexpr FloatField kFloatFields[] = {
    {"routed_scale", &LayerConfig::routed_scale},
    {"swiglu_limit", &LayerConfig::swiglu_limit},
};

// Enum names in value order: the Python side passes their index.
inline constexpr const char* kRoutingModes[] = {"router", "replay_ids", "given"};
static_assert(int(RoutingMode::router) == 0 && int(RoutingMode::replay_ids) == 1 && int(RoutingMode::given) == 2);
inline constexpr const char* kScoreModes[] = {"softmax", "sigmoid"};
static_assert(int(ScoreMode::softmax) == 0 && int(ScoreMode::sigmoid) == 1);
inline constexpr const char* kPrecisions[] = {"bf16", "fp8"};
static_assert(int(Precision::bf16) == 0 && int(Precision::fp8) == 1);

// The launch list: rows of each rank's receive ring (0: the layer's default; else a multiple of the
// GPU's 128-row tile; no bit depends on it), persistent blocks per GPU (0: all co-resident; the CPU
// ignores it), recompute (1: saved holds the dispatch layout alone, the backward pulls and recomputes the rest; the
// same bits), and
// the expert-parallel communicator: comm, an ncclComm_t as an integer (0: none; a torch.distributed
// process group's, mok.distributed), and gpus G, its size (1 without one). With a communicator the
// call is this GPU's share of the layer (docs/multi-gpu.md, "Device API"): the per-token tensors hold
// N / G tokens, w1, w2 and their gradients E / G experts; G travels in the list so that the argument
// checks and the fake kernels know the shares' shapes without asking NCCL (the GPU op checks it
// against the communicator's size); capacity_rows, the routed rows this GPU's experts can hold over G
// GPUs (mok::gpu::LaunchConfig::capacity_rows; 0: the most any routing gives them, N min(k, E/G));
// fp8_weight_gradients (1: the fp8 mode's routed-expert weight gradients on E4M3 operands too,
// mok::gpu::LaunchConfig::fp8_weight_gradients and the reference's option; other bits than 0's).
enum LaunchField : int {
  kRingRows,
  kBlocks,
  kRecompute,
  kComm,
  kGpus,
  kCapacityRows,
  kFp8WeightGradients,
  kLaunchFieldCount
};
inline constexpr const char* kLaunchFields[kLaunchFieldCount] = {
    "ring_rows", "blocks", "recompute", "comm", "gpus", "capacity_rows", "fp8_weight_gradients"};
static_assert(std::string_view(kLaunchFields[kComm]) == "comm" &&
                  std::string_view(kLaunchFields[kFp8WeightGradients]) == "fp8_weight_gradients",
              "kLaunchFields: in LaunchField's order");

struct Call {
  LayerConfig config;
  RoutingMode mode = RoutingMode::router;
  int ring_rows = 0;
  int blocks = 0;
  bool recompute = false;
  uintptr_t comm = 0;  // ncclComm_t; 0: none (the whole layer on one device)
  int gpus = 1;        // G: the communicator's ranks (GPUs), each holding a share
  long capacity_rows = 0;
  bool fp8_weight_gradients = false;  // the fp8 mode only

  // This GPU's share: its tokens (N / G) and its experts (E / G); the whole layer without a communicator.
  int64_t own_tokens() const { return int64_t(config.tokens()) / gpus; }
  int64_t own_experts() const { return int64_t(config.experts) / gpus; }
};

// The layout of the call's saved buffer: over G GPUs this GPU's, whose per-row sections hold its own
// experts' rows (its size is the same on every GPU).
inline SavedLayout saved_of(const Call& call) {
  return saved_layout(call.config, call.recompute, RowShare{call.gpus, 0, call.capacity_rows});
}

inline std::string list_size_error(const char* list, size_t got, size_t want) {
  return std::string(list) + " has " + std::to_string(got) + " entries, expected " + std::to_string(want);
}

// Throws mok::Error naming the field; validates the config as the layer does.
inline LayerConfig parse_config(c10::IntArrayRef ints, c10::ArrayRef<double> floats) {
  require(ints.size() == std::size(kIntFields),
          [&] { return list_size_error("config_ints", ints.size(), std::size(kIntFields)); });
  require(floats.size() == std::size(kFloatFields),
          [&] { return list_size_error("config_floats", floats.size(), std::size(kFloatFields)); });
  LayerConfig c;
  for (size_t i = 0; i < ints.size(); ++i) {
    const IntField& f = kIntFields[i];
    require(ints[i] >= f.min && ints[i] <= f.max, [&] {
      return std::string(f.name) + " = " + std::to_string(ints[i]) + " (need " + std::to_string(f.min) + " .. " +
             std::to_string(f.max) + ")";
    });
    f.set(c, ints[i]);
  }
  // Stored as float32, as LayerConfig holds them (rounded to nearest): a value that rounds to 0 is refused as the
  // case files refuse it (swiglu_limit = 1e-50 switched the clamp off without a word).
  for (size_t i = 0; i < floats.size(); ++i) {
    const std::string why = std::isfinite(floats[i]) ? float32_problem(floats[i]) : "is not a finite float32";
    require(why.empty(), [&] {
      char value[32];  // %g: std::to_string gave 0.000000 for 1e-50 and 300 digits for 1e300
      std::snprintf(value, sizeof value, "%.9g", floats[i]);
      return std::string(kFloatFields[i].name) + " = " + value + " " + why;
    });
    c.*kFloatFields[i].member = float(floats[i]);
  }
  validate(c);
  return c;
}

// One GPU's share over `gpus` GPUs: R / G ranks each, and its experts' capacity_rows (0, or over G > 1 at
// most the rows any routing gives them).
inline void validate_share(const LayerConfig& c, int64_t gpus, int64_t capacity_rows) {
  require(gpus >= 1 && gpus <= kInt32Max,
          [&] { return "gpus = " + std::to_string(gpus) + " (need 1 <= gpus < 2^31)"; });
  require(c.ranks % gpus == 0, [&] {
    return "ranks R = " + std::to_string(c.ranks) + " is not a multiple of gpus G = " + std::to_string(gpus) +
           " (each GPU executes R / G ranks)";
  });
  // On one device every routed row is its own (N k of them): a capacity only helps over G > 1 GPUs.
  const long most = most_own_rows(c, int(gpus));
  require(capacity_rows == 0 || (gpus > 1 && capacity_rows > 0 && capacity_rows <= most), [&] {
    return "capacity_rows = " + std::to_string(capacity_rows) + " (need 0, or over gpus G > 1 a value in [1, " +
           std::to_string(most) + "], the most rows any routing gives one GPU's experts)";
  });
}

inline Call parse_call(c10::IntArrayRef ints, c10::ArrayRef<double> floats, int64_t routing_mode,
                       c10::IntArrayRef launch) {
  Call call;
  call.config = parse_config(ints, floats);
  require(routing_mode >= 0 && routing_mode < int64_t(std::size(kRoutingModes)), [&] {
    return "routing_mode = " + std::to_string(routing_mode) + " (need 0 router, 1 replay_ids or 2 given)";
  });
  call.mode = RoutingMode(routing_mode);
  require(launch.size() == std::size(kLaunchFields),
          [&] { return list_size_error("launch", launch.size(), std::size(kLaunchFields)); });
  require(launch[kRingRows] >= 0 && launch[kRingRows] <= kInt32Max,
          [&] { return "ring_rows = " + std::to_string(launch[kRingRows]) + " (need 0 <= ring_rows < 2^31)"; });
  call.ring_rows = int(launch[kRingRows]);
  // The GPU's unit, so a call valid on the CPU is valid on the GPU.
  if (call.ring_rows) validate_ring_rows(call.ring_rows, kTileRows);
  require(launch[kBlocks] >= 0 && launch[kBlocks] <= kInt32Max,
          [&] { return "blocks = " + std::to_string(launch[kBlocks]) + " (need 0 <= blocks < 2^31)"; });
  call.blocks = int(launch[kBlocks]);
  require(launch[kRecompute] == 0 || launch[kRecompute] == 1,
          [&] { return "recompute = " + std::to_string(launch[kRecompute]) + " (need 0 or 1)"; });
  call.recompute = launch[kRecompute] == 1;
  call.comm = static_cast<uintptr_t>(launch[kComm]);
  require(launch[kGpus] >= 1 && launch[kGpus] <= kInt32Max,
          [&] { return "gpus = " + std::to_string(launch[kGpus]) + " (need 1 <= gpus < 2^31)"; });
  call.gpus = int(launch[kGpus]);
  require(call.comm != 0 || call.gpus == 1, [&] {
    return "gpus = " + std::to_string(call.gpus) + " needs a communicator (comm = 0: the whole layer on one device)";
  });
  validate_share(call.config, call.gpus, launch[kCapacityRows]);
  call.capacity_rows = long(launch[kCapacityRows]);
  require(launch[kFp8WeightGradients] == 0 || launch[kFp8WeightGradients] == 1,
          [&] { return "fp8_weight_gradients = " + std::to_string(launch[kFp8WeightGradients]) + " (need 0 or 1)"; });
  call.fp8_weight_gradients = launch[kFp8WeightGradients] == 1;
  require(!call.fp8_weight_gradients || call.config.precision == Precision::fp8, [] {
    return std::string("fp8_weight_gradients needs precision = fp8 (the bf16 mode has no E4M3 operands)");
  });
  return call;
}

// The call's launch fields as the op takes them (kLaunchFields' order): parse_call's inverse.
inline std::vector<int64_t> pack_launch(const Call& c) {
  std::vector<int64_t> launch(kLaunchFieldCount);
  launch[kRingRows] = c.ring_rows, launch[kBlocks] = c.blocks, launch[kRecompute] = c.recompute;
  launch[kComm] = static_cast<int64_t>(c.comm), launch[kGpus] = c.gpus, launch[kCapacityRows] = c.capacity_rows;
  launch[kFp8WeightGradients] = c.fp8_weight_gradients;
  return launch;
}

inline std::pair<std::vector<int64_t>, std::vector<double>> pack_config(const LayerConfig& c) {
  std::pair<std::vector<int64_t>, std::vector<double>> packed;
  for (const IntField& f : kIntFields) packed.first.push_back(f.get(c));
  for (const FloatField& f : kFloatFields) packed.second.push_back(c.*f.member);
  return packed;
}

}  // namespace mok::py
