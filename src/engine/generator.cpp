#include "engine/generator.h"

#include "core/error.h"
#include "engine/engine.h"

namespace nextn {

Generator::Generator(Model& model) : model_(model) {}

GenerationResult Generator::generate(const std::vector<int32_t>& prompt, const SamplingParams& params,
                                     const SpecOptions& spec, const std::function<bool(int32_t)>& on_token,
                                     const OutputFormat& format) {
  Engine engine(model_);
  TokenCallback callback;
  if (on_token) callback = [&on_token](int32_t t, const TokenLogprob*) { return on_token(t); };
  engine.submit(Request{prompt, params, spec, std::move(callback), format});
  engine.run();
  auto finished = engine.take_finished();
  if (finished.size() != 1) throw Error("internal: the engine lost a request");
  GenerationResult r = std::move(finished[0].second);
  if (r.finish_reason == "error") throw Error(r.error);
  return r;
}

}  // namespace nextn
