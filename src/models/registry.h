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
// Loads DIR with the family its config.json names. Throws nextn::Error naming the file / tensor / field.
std::unique_ptr<Model> load_model(const std::string& dir, ThreadPool* pool);

// What `inspect` prints about DIR (never throws for checkpoint problems: they are in the report).
struct CheckpointReport {
  bool loadable = false;
  nlohmann::json json;
  std::string text;
};
CheckpointReport inspect_model(const std::string& dir, bool scan);

}  // namespace nextn
