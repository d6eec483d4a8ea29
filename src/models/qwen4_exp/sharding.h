// One tensor-parallel rank's part of Qwen4-Exp's target (docs/parallel.md, P12): Gated DeltaNet split by key
// heads with their value heads (the q / k / v / z / b / a rows and conv channels of its heads, out_proj by
// columns; each rank keeps only its heads' recurrent state), QSA by query heads with their KV heads (a KV head
// is shared by the ranks of its query group when there are more ranks than KV heads), the shared expert by
// intermediate features, the routed experts spread over the ranks, embedding and lm_head by vocabulary rows.
// The hyper-connections, PLE, the QSA indexer, the router and the norms are whole on every rank. Views of the
// mmap'd tensors (the small conv / decay vectors are copied). The MTP layers run on rank 0, whole.
#pragma once
#include <vector>

#include "models/common/tensor_split.h"
#include "models/qwen4_exp/config.h"
#include "models/qwen4_exp/model.h"

namespace nextn {

struct Qwen4Shard {
  int rank = 0, ranks = 1;
  UnitRange key_heads;          // GDN key heads (value heads: these times the group)
  UnitRange heads, kv_heads;    // QSA query heads and the KV heads they read
  UnitRange experts;            // routed experts this rank runs
  std::vector<UnitRange> vocab; // every rank's vocabulary rows, in rank order
  Qwen4ExpConfig config;        // the model's, with this rank's head counts and shared expert width
  Qwen4ExpWeights weights;      // the target's weights as this rank holds them (no MTP layers)
};

// Throws nextn::Error naming what does not split (more ranks than GDN key heads, QSA groups that do not divide).
Qwen4Shard shard_qwen4_target(const Qwen4ExpConfig& config, const Qwen4ExpWeights& weights, int rank, int ranks);

}  // namespace nextn
