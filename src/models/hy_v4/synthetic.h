// Synthetic HY V4 checkpoints for `nextn bench --synthetic`: random weights at a realistic width (hidden 2048 by
// default, up to 8192 with the other widths in proportion; 8 layers by default, 32 experts or dense MLPs, 1 MTP
// layer; a few GB), large enough that a decode step reads DRAM, not cache. Reached through the registry
// (models/registry.h: write_synthetic_checkpoint), never directly.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "models/model.h"

namespace nextn {

// The target layers of the default synthetic checkpoint: few, so that it writes and loads fast. Real
// checkpoints have dozens, which makes one MTP layer (plus lm_head) a small share of a decode step.
constexpr int kHYV4SyntheticLayers = 8;
constexpr int kHYV4SyntheticMaxLayers = 128;
// The default hidden size; others are multiples of 1024 up to 8192 (the MLP's, the attention's low ranks and
// heads scale with it, so that FP8's 128-blocks still tile them).
constexpr int kHYV4SyntheticHidden = 2048;

// The config.json of a synthetic checkpoint: FP8-block (else bf16) linear weights, dense (else MoE) MLPs,
// `layers` target layers (1..kHYV4SyntheticMaxLayers), hidden size `hidden` (kHYV4SyntheticHidden's rule).
// Throws nextn::Error naming what is out of range.
nlohmann::json hy_v4_synthetic_config(bool fp8, bool dense, int layers, int hidden = kHYV4SyntheticHidden);

// The facts HYV4Model::facts() gives for it once written and loaded (dir empty).
ModelFacts hy_v4_synthetic_facts(bool fp8, bool dense, int layers, int hidden = kHYV4SyntheticHidden);

// The folder name under the cache ("synthetic-hy4-v2-bf16", "...-fp8-dense", "...-fp8-dense-48l" for other
// than kHYV4SyntheticLayers layers, "...-h7168" for another hidden size): changes whenever the files
// written would (a cached checkpoint of an older writer is then never reused).
std::string hy_v4_synthetic_name(bool fp8, bool dense, int layers, int hidden = kHYV4SyntheticHidden);

// Writes config.json and model.safetensors (streamed tensor by tensor, never the whole model in memory;
// the safetensors file appears under its name only once complete). Throws nextn::Error.
void write_hy_v4_synthetic(const std::string& dir, bool fp8, bool dense, int layers,
                           int hidden = kHYV4SyntheticHidden);

}  // namespace nextn
