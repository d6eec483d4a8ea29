// The Qwen4-Exp family as the registry lists it (src/models/registry.cpp): model_type qwen4_exp (composite,
// text under text_config) and qwen4_exp_text.
#pragma once
#include <memory>
#include <string>

#include "models/model.h"
#include "models/registry.h"

namespace nextn::qwen4_exp {

std::unique_ptr<Model> load(const std::string& dir, ThreadPool* pool);
CheckpointReport inspect(const std::string& dir, bool scan);

}  // namespace nextn::qwen4_exp
