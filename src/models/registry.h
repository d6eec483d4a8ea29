// Model families by config.json's `model_type`: loading, and describing a checkpoint for `inspect`.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/model.h"

namespace nextn {

// The model_types nextn loads ("hy_v4", ...).
std::vector<std::string> supported_model_types();
// Throws nextn::Error when DIR is not a folder nextn could load: missing, a file, without config.json, or of a
// model_type no family takes (what a mistyped --model meets first, before any question about its tokenizer).
void require_checkpoint_folder(const std::string& dir);
// Loads DIR with the family its config.json names. Throws nextn::Error naming the file / tensor / field.
std::unique_ptr<Model> load_model(const std::string& dir, ThreadPool* pool);
// ... as `tensor_parallel` ranks of a tensor-parallel group (models/common/tensor_parallel.h; 1: load_model):
// ranks as threads of this process sharing `pool` (the CPU form of what several GPUs run, docs/parallel.md).
std::unique_ptr<Model> load_model(const std::string& dir, ThreadPool* pool, int tensor_parallel);

// What `inspect` prints about DIR (never throws for checkpoint problems: they are in the report).
struct CheckpointReport {
  bool loadable = false;
  nlohmann::json json;
  std::string text;
};
CheckpointReport inspect_model(const std::string& dir, bool scan);

// Synthetic checkpoints (`nextn bench --synthetic`): random weights of a family at a realistic width, written
// once, large enough that decode reads DRAM rather than cache.
struct SyntheticOptions {
  bool fp8 = false;    // FP8-block linear weights (else bf16)
  bool dense = false;  // dense MLPs in every layer (else the family's MoE)
  int layers = 0;      // target layers (0: the family's default)
  int hidden = 0;      // hidden size (0: the family's default; the other widths scale with it)
};
struct SyntheticCheckpoint {
  std::string name;  // folder name for a cache of them; changes whenever the files written would
  ModelFacts facts;  // what the checkpoint has once written and loaded (dir empty)
};
// Without writing anything. Throws nextn::Error for a model_type without synthetic checkpoints.
SyntheticCheckpoint describe_synthetic_checkpoint(const std::string& model_type, const SyntheticOptions& options);
// Writes config.json and the weights into DIR (created if needed). Throws nextn::Error.
void write_synthetic_checkpoint(const std::string& model_type, const std::string& dir, const SyntheticOptions& options);

}  // namespace nextn
