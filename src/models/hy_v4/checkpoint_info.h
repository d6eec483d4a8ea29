// What the HY V4 loader makes of a checkpoint directory, as data: the quantization it expects of the
// backbone and of the MTP draft, every problem it finds (collected, not thrown), and the summary that
// `nextn inspect` prints. The rules themselves are documented in docs/checkpoints.md; LoadReport, QuantPlan
// and scan_non_finite come from src/models/common.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/common/load_report.h"
#include "models/common/quant_plan.h"
#include "models/common/scan.h"
#include "models/hy_v4/model.h"

namespace nextn {

// The loader's findings (LoadReport) and what the names in a HY V4 checkpoint look like (filled while binding).
struct HYV4LoadReport : LoadReport {
  std::vector<std::string> name_forms;     // subset of "hub", "internal", "vllm", in that order
  std::vector<std::string> name_features;  // human-readable details behind name_forms
  std::string mtp_naming;                  // "model.mtp_layers.N", "model.layers.{L+N}", "both" or "none"
  std::vector<int> mtp_layers_found;       // MTP layer indices with at least one tensor (either naming)
  std::string expert_layout;               // "fused", "split", "both" or "none"
};

// Resolves quantization_config and mtp_quant_algo (problems go to `report`).
QuantPlan resolve_quant_plan(const HYV4Config& c, LoadReport& report);

// Binds the checkpoint's tensors onto `w` (views into the store; small tensors copied). Never throws for
// checkpoint problems: they are collected in `report`. `w` is only usable when report.ok().
void bind_hy_v4_weights(const HYV4Config& c, const WeightStore& store, HYV4Weights& w, HYV4LoadReport& report);

// Everything `nextn inspect DIR` reports.
struct CheckpointInfo {
  std::string dir;
  bool config_ok = false;
  std::string model_type;
  std::vector<std::string> architectures;
  HYV4Config config;  // valid when config_ok

  // Tensors
  int64_t num_tensors = 0;
  int64_t params = 0;       // elements of all weight tensors (scale tensors excluded)
  int64_t mtp_params = 0;   // of which in MTP layers (either naming)
  int64_t total_bytes = 0;
  std::map<std::string, int64_t> bytes_by_dtype, tensors_by_dtype;

  QuantPlan quant;
  HYV4LoadReport report;
  // Bytes of the KV caches (target and MTP layers) of one sequence as long as the context
  // (max_position_embeddings): the most a generation allocates for them (0 when the binding failed).
  double context_cache_bytes = 0;
  bool scanned = false;                   // every value was read (--scan)
  int64_t scanned_tensors = 0;
  std::vector<NonFiniteTensor> non_finite;  // when scanned; each is also an error in `report`
  bool loadable = false;
};

// Opens DIR's config and tensors and runs the loader's binding without keeping the model; with `scan`, also
// reads every value (scan_non_finite) and counts a non-finite one as an error.
CheckpointInfo inspect_checkpoint(const std::string& dir, bool scan = false);
nlohmann::json checkpoint_info_json(const CheckpointInfo& info);
std::string checkpoint_info_text(const CheckpointInfo& info);

}  // namespace nextn
