#include "models/hy_v4/family.h"

#include "models/hy_v4/checkpoint_info.h"
#include "models/hy_v4/model.h"

namespace nextn::hy_v4 {

std::unique_ptr<Model> load(const std::string& dir, ThreadPool* pool) { return std::make_unique<HYV4Model>(dir, pool); }

CheckpointReport inspect(const std::string& dir, bool scan) {
  const CheckpointInfo info = inspect_checkpoint(dir, scan);
  return {info.loadable, checkpoint_info_json(info), checkpoint_info_text(info)};
}

}  // namespace nextn::hy_v4
