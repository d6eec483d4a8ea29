// HY V4's MTP drafter for one sequence (docs/speculative.md has the scheme).
//
// Draft step s uses MTP layer s mod L. Layer j keeps a chain of canonical rows over verified positions: row
// q gets token q+1 and layer j-1's output at q-1 (the target's hidden state for j = 0), so before a round
// every layer the round uses catches up on the positions verified since the last one. Step 0 is layer 0's
// row at the newest position; steps >= 1 attend to the positions step 0's indexer selected (vLLM's shared
// top-k), and layer 1's catch-up runs step 1 in the same forward. Rounds with k = 0 defer the catch-up (up
// to 64 positions) so that it runs batched when drafting resumes: a layer's outputs do not depend on how
// many rows share its forward, so the drafts are the same.
#pragma once
#include <cstdint>
#include <vector>

#include "memory/kv_cache.h"
#include "models/hy_v4/model.h"
#include "models/model.h"

namespace nextn {

class HYV4DraftSession : public DraftSession {
 public:
  HYV4DraftSession(HYV4Model& model, int64_t capacity, const DraftOptions& options);

  void push_verified(const float* hidden, int64_t rows) override;
  void catch_up_prompt(const std::vector<int32_t>& tokens, int k_max) override;
  bool begin_round(const std::vector<int32_t>& tokens, int k) override;
  float* step(int s, int32_t prev_draft) override;
  void end_round() override;
  int64_t pending_rows() const override { return pending_rows_; }
  double round_catch_up_seconds() const override { return catch_seconds_; }
  int64_t forwards() const override { return forwards_; }

 private:
  // A speculative row run with a layer's catch-up: token, layer j-1's output, where the output goes.
  struct ExtraRow {
    int32_t token;
    const float* h;
    float* out;
  };
  void grow_rows(int64_t rows);
  TopkOverride step0_selection(int j, int64_t end);
  void catch_up(int j, int64_t m, const ExtraRow* extra);
  void finish_catch_up(int first, int active, int64_t m);

  HYV4Model& model_;
  const int layers_;
  const int64_t H_, V_;
  const bool merge_;
  std::vector<KVCache> dcache_;                // per MTP layer, from the model's shared MTP pool
  const std::vector<int32_t>* tokens_ = nullptr;  // the sequence's tokens (prompt + emitted) this round
  int64_t rows_cap_ = 0;                       // rows the catch-up buffers hold
  std::vector<float> pending_h_;               // [rows, H] target hidden of verified positions layer 0 has not seen
  int64_t pending_rows_ = 0;
  std::vector<std::vector<float>> g_;          // per layer: [rows + 1, H] outputs of this round's catch-up
  std::vector<int64_t> g_start_, g_rows_;      // their first position and count
  std::vector<std::vector<float>> g_last_;     // per layer: [H] last canonical output
  std::vector<int64_t> canon_;                 // canonical rows in each layer's cache
  std::vector<char> stale_;                    // layer dropped its chain (unused by the last rounds)
  std::vector<float> stage_;                   // [rows + 1, H] chained inputs of a catch-up
  std::vector<int32_t> tokens_buf_, topk0_, forced_slots_;
  std::vector<float> step_h_, draft_logits_;   // [H], [V]
  int64_t m_ = 0;                              // newest position of the round (tokens[m] not yet verified)
  int active_ = 1;
  bool merge_step1_ = false, merged_ = false, drafting_ = false;
  double catch_seconds_ = 0;
  int64_t forwards_ = 0;
};

}  // namespace nextn
