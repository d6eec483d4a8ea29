// Text generation with native MTP speculative decoding, one request at a time: a front to the engine
// (engine/engine.h) for callers with a single prompt (the CLI's generate, tests).
//
// Each round: the checkpoint's MTP layers draft k tokens; the target verifies all of them in ONE forward
// over k+1 positions; the longest acceptable prefix is emitted plus one token from the target (the
// correction at the first rejection, or a bonus token when all k pass). Greedy acceptance is exact
// match with the target's argmax, so the output is token for token the target's own greedy output
// (kernels are batch invariant: a row's logits do not depend on how many rows share the forward).
// Sampling uses speculative sampling (accept with min(1, p/q), resample from max(p - q, 0)), so the
// output is distributed exactly as the target's. See docs/speculative.md for the draft-cache scheme.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "engine/request.h"
#include "models/model.h"

namespace nextn {

class Generator {
 public:
  explicit Generator(Model& model);

  // Generates after `prompt`. on_token(id) is called for each emitted token in order (streaming) and may
  // return false to stop (stop strings). `format`: structured output (request.h). Throws nextn::Error for
  // bad arguments and for a failed forward.
  GenerationResult generate(const std::vector<int32_t>& prompt, const SamplingParams& params,
                            const SpecOptions& spec, const std::function<bool(int32_t)>& on_token = {},
                            const OutputFormat& format = {});

 private:
  Model& model_;
};

}  // namespace nextn
