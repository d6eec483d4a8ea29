// What a family's blocks need to be one rank of a tensor-parallel group (docs/parallel.md): the communicator,
// every rank's vocabulary rows, and the collectives at the points the families share, with buffers sized once
// (reserve) so that decode allocates nothing:
//   sum        a block's partial output [rows, H] summed over the ranks in rank order (all_reduce_sum)
//   embed      embedding rows taken from their owners (moved, not summed: one rank's bits)
//   logits     each rank's vocabulary part of lm_head, gathered into whole rows
//   argmax     each rank's best (value, id) per row, and the global greedy ids (no logits gathered)
#pragma once
#include <cstdint>
#include <vector>

#include "core/aligned.h"
#include "core/communicator.h"
#include "models/common/tensor_split.h"
#include "ops/ops.h"

namespace nextn {

class ThreadPool;

class TensorParallelRank {
 public:
  // comm null: one rank (every collective a no-op or a plain lm_head).
  void set(Communicator* comm, std::vector<UnitRange> vocab);
  bool active() const { return comm_ != nullptr; }
  // Buffers for `rows` rows of `hidden` floats (and the logits' vocabulary parts).
  void reserve(int64_t rows, int64_t hidden);
  // Bytes reserve(rows, hidden) holds (for a workspace's memory check).
  int64_t bytes_for(int64_t rows, int64_t hidden) const;

  void sum(float* y, int64_t count);
  // out [rows, H] = the embedding rows of tokens [rows]; `part` holds this rank's vocabulary rows.
  void embed(const Linear& part, const int32_t* tokens, int64_t rows, int64_t H, float* out);
  // out [rows, V] = lm_head(hidden [rows, H]) with `part` this rank's vocabulary rows of lm_head.
  void logits(ThreadPool* pool, const Linear& part, const float* hidden, int64_t rows, int64_t V, float* out);
  // ids [rows] = finite_argmax of each row of lm_head(hidden) over the whole vocabulary (-1: a NaN or inf).
  void argmax(ThreadPool* pool, const Linear& part, const float* hidden, int64_t rows, int32_t* ids);

 private:
  int owner(int32_t token) const;
  int64_t largest_part() const;

  Communicator* comm_ = nullptr;
  std::vector<UnitRange> vocab_;
  std::vector<float> gather_;                     // [ranks, rows, max(H, largest part)]
  AlignedFloats part_;                            // [rows, largest part]
  std::vector<RankBest> best_, best_all_;         // [rows], [ranks, rows]
};

}  // namespace nextn
