// --device: where a command's model runs (commands.h).
#include "cli/args.h"
#include "cli/commands.h"
#include "ops/cuda/cuda_ops.h"

namespace nextn::cli {

std::string device_option(const Args& a) {
  const std::string d = a.get("device", "auto");
  if (d != "cpu" && d != "cuda" && d != "auto") throw UsageError("--device must be cpu, cuda or auto, got '" + d + "'");
  return d;
}

std::string place_model(Model& model, const std::string& option) {
  if (option == "cpu") return "cpu";
  std::string why;
  const bool gpu = cuda::available(&why);
  if (option == "auto" && (!gpu || !model.runs_on(Device::kCuda))) return "cpu";
  if (!gpu) throw Error("--device cuda: " + why);
  model.use_device(Device::kCuda);
  return "cuda: " + cuda::device_name();
}

}  // namespace nextn::cli
