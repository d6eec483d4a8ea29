// The HY V4 family as the registry lists it (src/models/registry.cpp).
#pragma once
#include <memory>
#include <string>

#include "models/model.h"
#include "models/registry.h"

namespace nextn::hy_v4 {

std::unique_ptr<Model> load(const std::string& dir, ThreadPool* pool);
CheckpointReport inspect(const std::string& dir, bool scan);

}  // namespace nextn::hy_v4
