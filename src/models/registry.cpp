#include "models/registry.h"

#include <filesystem>

#include "core/error.h"
#include "models/common/config_json.h"
#include "models/common/tensor_parallel.h"
#include "models/hy_v4/family.h"
#include "models/hy_v4/synthetic.h"
#include "models/qwen4_exp/family.h"

namespace nextn {
namespace {

struct Family {
  const char* model_type;
  std::unique_ptr<Model> (*load)(const std::string& dir, ThreadPool* pool);
  CheckpointReport (*inspect)(const std::string& dir, bool scan);
};

const Family kFamilies[] = {
    {"hy_v4", hy_v4::load, hy_v4::inspect},
    {"qwen4_exp", qwen4_exp::load, qwen4_exp::inspect},
    {"qwen4_exp_text", qwen4_exp::load, qwen4_exp::inspect},
};

// The family of DIR. A config.json that cannot be read, or names no model_type, goes to the first family,
// whose loader reports exactly what is wrong with it (missing file, malformed JSON, missing field).
const Family& family_of(const std::string& dir) {
  std::string type;
  try {
    type = cfg::read_model_type(dir);
  } catch (const Error&) {
    return kFamilies[0];
  }
  for (const Family& f : kFamilies)
    if (type == f.model_type) return f;
  std::string names;
  for (const Family& f : kFamilies) names += std::string(names.empty() ? "" : ", ") + f.model_type;
  throw Error(dir + "/config.json: unsupported model_type '" + type + "' (nextn supports: " + names + ")");
}

}  // namespace

std::vector<std::string> supported_model_types() {
  std::vector<std::string> out;
  for (const Family& f : kFamilies) out.emplace_back(f.model_type);
  return out;
}

namespace {

// The family of DIR after require_checkpoint_folder's checks (config.json read once).
const Family& checked_family(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (!fs::exists(st)) throw Error(dir + ": no such folder (a model is a HuggingFace checkpoint folder)");
  if (!fs::is_directory(st))
    throw Error(dir + " is a file: a model is the checkpoint's folder (config.json and *.safetensors)");
  if (!fs::exists(fs::path(dir) / "config.json", ec))
    throw Error(dir + " has no config.json: not a HuggingFace checkpoint folder");
  return family_of(dir);
}

}  // namespace

void require_checkpoint_folder(const std::string& dir) { checked_family(dir); }

std::unique_ptr<Model> load_model(const std::string& dir, ThreadPool* pool) {
  return checked_family(dir).load(dir, pool);
}

std::unique_ptr<Model> load_model(const std::string& dir, ThreadPool* pool, int tensor_parallel) {
  if (tensor_parallel < 1 || tensor_parallel > 64)
    throw Error("--tensor-parallel " + std::to_string(tensor_parallel) + ": must be 1 to 64 ranks");
  if (tensor_parallel == 1) return load_model(dir, pool);
  std::vector<std::unique_ptr<Model>> ranks;
  for (int r = 0; r < tensor_parallel; ++r) ranks.push_back(load_model(dir, pool));  // (the same mapped files)
  return std::make_unique<TensorParallelModel>(std::move(ranks));
}

CheckpointReport inspect_model(const std::string& dir, bool scan) {
  const Family* f = &kFamilies[0];
  try {
    f = &family_of(dir);
  } catch (const Error&) {
    // an unsupported model_type: the first family's report says so in its own words
  }
  return f->inspect(dir, scan);
}

// ---- synthetic checkpoints (bench --synthetic)

namespace {

struct SyntheticFamily {
  const char* model_type;
  SyntheticCheckpoint (*describe)(const SyntheticOptions& options);
  void (*write)(const std::string& dir, const SyntheticOptions& options);
};

int hy_v4_layers(const SyntheticOptions& o) { return o.layers ? o.layers : kHYV4SyntheticLayers; }
int hy_v4_hidden(const SyntheticOptions& o) { return o.hidden ? o.hidden : kHYV4SyntheticHidden; }

const SyntheticFamily kSyntheticFamilies[] = {
    {"hy_v4",
     [](const SyntheticOptions& o) {
       return SyntheticCheckpoint{hy_v4_synthetic_name(o.fp8, o.dense, hy_v4_layers(o), hy_v4_hidden(o)),
                                  hy_v4_synthetic_facts(o.fp8, o.dense, hy_v4_layers(o), hy_v4_hidden(o))};
     },
     [](const std::string& dir, const SyntheticOptions& o) {
       write_hy_v4_synthetic(dir, o.fp8, o.dense, hy_v4_layers(o), hy_v4_hidden(o));
     }},
};

const SyntheticFamily& synthetic_family(const std::string& model_type) {
  for (const SyntheticFamily& f : kSyntheticFamilies)
    if (model_type == f.model_type) return f;
  throw Error("no synthetic checkpoints for model_type '" + model_type + "'");
}

}  // namespace

SyntheticCheckpoint describe_synthetic_checkpoint(const std::string& model_type, const SyntheticOptions& options) {
  return synthetic_family(model_type).describe(options);
}

void write_synthetic_checkpoint(const std::string& model_type, const std::string& dir, const SyntheticOptions& options) {
  synthetic_family(model_type).write(dir, options);
}

}  // namespace nextn
