// Block-wise FP8 quantization as a loader expects it: what config.json's quantization_config says, and the
// scheme each part of a model (backbone, MTP draft) is checked against. The FP8 checks of single tensors are
// in binder.h.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/common/load_report.h"

namespace nextn {

// `quantization_config` block (present=false when absent or null); a family's config parser fills it.
struct QuantConfig {
  bool present = false;
  std::string quant_method, fmt;
  std::vector<int64_t> weight_block_size;
  std::string activation_scheme;
  std::string scale_fmt;
  // Union (in order, without duplicates) of ignored_layers / modules_to_not_convert / exclude_modules.
  std::vector<std::string> ignored_layers;
  nlohmann::json raw;
};

// The quantization the loader expects of one part of the model (backbone or MTP draft).
struct QuantScheme {
  bool fp8 = false;                   // block-wise FP8 e4m3 weights with block scales
  int64_t block_out = 0, block_in = 0;
  bool ue8m0 = false;                 // scale_fmt "ue8m0": uint8 scales are E8M0 exponents
  std::vector<std::string> ignored;   // module patterns that must stay unquantized
  std::string source;                 // where this scheme comes from (for messages)
};

struct QuantPlan {
  QuantScheme backbone, draft;
  std::string draft_resolution;  // how the draft's scheme was resolved, one line
};

// The scheme quantization_config describes: block-wise FP8 e4m3 [block_out, block_in], or none when the
// config has no quantization_config. Unsupported settings are errors in `report` and leave the scheme
// unquantized; an unknown scale_fmt is a warning.
QuantScheme resolve_fp8_scheme(const QuantConfig& qc, LoadReport& report);

// Blocks of `block` covering n elements, ceil(n / block): a block scale of an [out, in] weight is
// [block_count(out, block_out), block_count(in, block_in)].
inline int64_t block_count(int64_t n, int64_t block) { return (n + block - 1) / block; }

}  // namespace nextn
