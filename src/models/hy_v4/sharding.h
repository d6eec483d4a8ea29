// One tensor-parallel rank's part of HY V4's target (docs/parallel.md, P12): attention split by heads (q_b,
// kv_b and the output gate by rows, o_proj by columns, sinks per head), the dense MLP and the shared experts
// by intermediate features (gate / up by rows, down by columns), the routed experts spread over the ranks,
// embedding and lm_head by vocabulary rows. The MLA latent, the DSA indexer, the router, the hyper-connections
// and the norms are whole on every rank (docs/parallel.md says why). Views of the same mmap'd tensors: nothing
// is copied, FP8 stays FP8 with its block scales. The MTP layers are not part of it: they run whole on rank 0.
#pragma once
#include <vector>

#include "models/common/tensor_split.h"
#include "models/hy_v4/config.h"
#include "models/hy_v4/model.h"

namespace nextn {

struct HYV4Shard {
  int rank = 0, ranks = 1;
  UnitRange heads;                 // attention heads of this rank (the same in every layer)
  UnitRange experts;               // routed experts it runs
  std::vector<UnitRange> vocab;    // every rank's vocabulary rows, in rank order (the logits gather needs all)
  HYV4Config config;               // the model's, with this rank's head count
  HYV4Weights weights;             // the target's weights as this rank holds them (mtp empty)
};

// Throws nextn::Error when the checkpoint cannot be split (ranks outside 1..heads).
HYV4Shard shard_target(const HYV4Config& config, const HYV4Weights& weights, int rank, int ranks);

}  // namespace nextn
