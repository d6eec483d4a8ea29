#include "models/common/quant_plan.h"

#include "core/tensor.h"
#include "models/common/name_rules.h"

namespace nextn {

namespace {

using names::to_lower;

// Whether nextn computes what quantization_config describes; each unsupported setting is an error.
bool supported(const QuantConfig& qc, LoadReport& r) {
  bool ok = true;
  if (to_lower(qc.quant_method) != "fp8") {
    r.errors.push_back("config.json: quantization_config.quant_method '" + qc.quant_method +
                       "' is not supported (nextn loads block-wise FP8: quant_method \"fp8\")");
    ok = false;
  }
  if (!qc.fmt.empty() && to_lower(qc.fmt) != "e4m3" && to_lower(qc.fmt) != "float8_e4m3fn") {
    r.errors.push_back("config.json: quantization_config.fmt '" + qc.fmt + "' is not supported (only e4m3)");
    ok = false;
  }
  if (qc.weight_block_size.size() != 2) {
    r.errors.push_back("config.json: quantization_config.weight_block_size must be [block_out, block_in], found " +
                       list_string(qc.weight_block_size) + " (per-tensor FP8 is not supported)");
    ok = false;
  }
  const std::string act = to_lower(qc.activation_scheme);
  if (!act.empty() && act != "dynamic" && act != "static") {
    r.errors.push_back("config.json: quantization_config.activation_scheme '" + qc.activation_scheme +
                       "' is not supported (dynamic or static; nextn computes weight-only FP8 either way)");
    ok = false;
  }
  return ok;
}

}  // namespace

QuantScheme resolve_fp8_scheme(const QuantConfig& qc, LoadReport& r) {
  QuantScheme s;
  if (!qc.present) {
    s.source = "config.json has no quantization_config (FP8 tensors need one)";
    return s;
  }
  const bool ok = supported(qc, r);
  if (!qc.scale_fmt.empty() && to_lower(qc.scale_fmt) != "ue8m0")
    r.warnings.push_back("quantization_config.scale_fmt '" + qc.scale_fmt +
                         "' is not known; scales are read by their tensor dtype");
  if (!ok) return s;
  s.fp8 = true;
  s.block_out = qc.weight_block_size[0];
  s.block_in = qc.weight_block_size[1];
  s.ue8m0 = to_lower(qc.scale_fmt) == "ue8m0";
  s.ignored = qc.ignored_layers;
  s.source = "quantization_config (fp8, block " + list_string(qc.weight_block_size) + ")";
  return s;
}

}  // namespace nextn
