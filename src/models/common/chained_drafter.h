// The MTP drafter both families share: one sequence's chain of MTP layers (docs/speculative.md has the
// scheme), over any model that provides the few calls listed below (HYV4Model, Qwen4ExpModel).
//
// Draft step s uses MTP layer s mod L. Layer j keeps a chain of canonical rows over verified positions: row
// q gets token q+1 and layer j-1's output at q-1 (the target's hidden state for j = 0), so before a round
// every layer the round uses catches up on the positions verified since the last one. Step 0 is layer 0's
// row at the newest position; steps >= 1 attend to the positions step 0's indexer selected (vLLM's shared
// top-k), and layer 1's catch-up runs step 1 in the same forward. Rounds with k = 0 defer the catch-up so
// that it runs batched when drafting resumes (a layer's outputs do not depend on how many rows share its
// forward, so the drafts are the same). A long run of k = 0 rounds (plain decoding chosen by the tuner, as
// at high concurrency, where a verify's rows cost what they read) keeps only the newest deferred positions:
// the layers then restart their chains from those, and plain decoding pays no MTP forwards at all.
//
// What Stack provides:
//   int num_mtp_layers() const;  const ModelFacts& facts() const;  ThreadPool* host_pool() const;
//   int64_t draft_width() const;            // floats of the hidden state a layer takes and gives (per row)
//   int64_t draft_selection_max() const;    // most positions one sparse-attention query selects
//   KVCache new_shared_draft_cache(int64_t capacity);
//   void reserve_batch(int64_t rows, int64_t positions);  // (Model's)
//   void check_draft_request(const DraftRequest& r) const;  // throws nextn::Error naming what is wrong
//   void draft_forward_batch(int layer, DraftRequest* const* requests, size_t n);  // many sequences' rows
//   void draft_logits_rows(const float* hidden, int64_t rows, float* logits, int32_t* argmax, int64_t argmax_rows);
//       [rows, width] -> logits [rows, V]; the first argmax_rows rows' finite_argmax into argmax instead
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/finite.h"
#include "core/threadpool.h"
#include "memory/kv_cache.h"
#include "models/common/draft_round.h"
#include "models/model.h"

namespace nextn {

namespace chained_draft {

// Rounds with k = 0 leave the MTP layers' catch-up for later. Once 2 · kDeferRows positions wait, the oldest
// are dropped and kDeferRows kept: what a resumed round catches up on is bounded, and costs one forward.
inline constexpr int64_t kDeferRows = 16;
// A deferred backlog reaches 2 · kDeferRows - 1 positions, then takes one more verify of up to k_max + 1 rows:
// the most rows a session's catch-up runs in one forward (what a session reserves in the model).
constexpr int64_t backlog_rows(int k_max) { return 2 * kDeferRows + k_max + 1; }

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace chained_draft

template <class Stack>
class ChainedDraftSession : public DraftSession {
 public:
  ChainedDraftSession(Stack& model, int64_t capacity, const DraftOptions& options);

  void push_verified(const float* hidden, int64_t rows) override;
  void catch_up_prompt(const std::vector<int32_t>& tokens, int k_max) override;
  DraftRound round(const std::vector<int32_t>& tokens, int k, DraftPicker& picker) override;
  int64_t pending_rows() const override { return pending_rows_; }
  int64_t deferred_window() const override { return chained_draft::kDeferRows; }
  double round_catch_up_seconds() const override { return catch_seconds_; }
  double round_draft_seconds() const override { return draft_seconds_; }
  int64_t forwards() const override { return forwards_; }
  FrameArena& frame_arena() { return arena_; }

 private:
  // A speculative row run with a layer's catch-up: token, layer j-1's output, where the output goes.
  struct ExtraRow {
    int32_t token;
    const float* h;
    float* out;
  };
  void grow_rows(int64_t rows);
  void drop_oldest_deferred();
  void plan_round(const std::vector<int32_t>& tokens, int k);
  TopkOverride step0_selection(int j, int64_t end);
  bool prepare_catch_up(int j, int64_t m, const ExtraRow* extra);
  void after_catch_up(int j, const ExtraRow* extra);
  void remember_last_outputs(int active);
  void catch_up_now(int j, int64_t m);  // (catch_up_prompt: a forward of its own, alone)

  Stack& model_;
  const int layers_;
  const int64_t H_, V_;
  const bool merge_;
  std::vector<KVCache> dcache_;                // per MTP layer, from the model's shared MTP pool
  const std::vector<int32_t>* tokens_ = nullptr;  // the sequence's tokens (prompt + emitted) this round
  int64_t rows_cap_ = 0;                       // rows the catch-up buffers hold
  std::vector<float> pending_h_;               // [rows, H] target hidden (H: the draft width) of verified positions layer 0 has not seen
  int64_t pending_rows_ = 0;
  std::vector<std::vector<float>> g_;          // per layer: [rows + 1, H] outputs of this round's catch-up
  std::vector<int64_t> g_start_, g_rows_;      // their first position and count
  std::vector<std::vector<float>> g_last_;     // per layer: [H] last canonical output
  std::vector<int64_t> canon_;                 // canonical rows in each layer's cache
  std::vector<char> stale_;                    // layer dropped its chain (unused by the last rounds)
  std::vector<float> stage_;                   // [rows + 1, H] chained inputs of a catch-up
  std::vector<int32_t> tokens_buf_, topk0_, forced_slots_;
  std::vector<float> step_h_, draft_logits_;   // [H], [V]
  int32_t draft_argmax_ = 0;                   // a draft step's argmax, when the picker takes ids
  DraftRequest req_;                           // the forward the round waits on
  TopkOverride ov_{nullptr, 0};                // its forced selection
  FrameArena arena_;
  int64_t m_ = 0;                              // newest position of the round (tokens[m] not yet verified)
  int active_ = 1;
  int32_t prev_draft_ = 0;
  bool merge_step1_ = false, merged_ = false;
  double catch_seconds_ = 0, draft_seconds_ = 0;
  int64_t forwards_ = 0;
};

// Runs rounds of ChainedDraftSession<Stack> sessions (many sequences) to their ends, batching their requests:
// every pass runs the waiting requests of each MTP layer as forwards of up to kMaxRows rows, and the waiting
// logits as one lm_head, then resumes those rounds. A request that fails its checks fails its round alone.
template <class Stack>
class ChainedDraftDriver {
 public:
  static constexpr int64_t kMaxRows = 256;  // rows of one batched forward (bounds the forward's workspace)
  void run(Stack& model, DraftRound* const* rounds, size_t n);

 private:
  void run_group(Stack& model, int layer);
  void hand_over_rows(Stack& model, int64_t from, int64_t to);
  std::vector<DraftRound*> live_;
  std::vector<DraftRequest*> group_;
  std::vector<float> hidden_, logits_;  // gathered logits rows [n, width] -> [n, V]
  std::vector<DraftRequest*> order_;    // a logits group's requests, those that take only the argmax first
  std::vector<int32_t> argmax_;         // [n]: those requests' argmax
};

template <class Stack>
ChainedDraftSession<Stack>::ChainedDraftSession(Stack& model, int64_t capacity, const DraftOptions& options)
    : model_(model), layers_(model.num_mtp_layers()), H_(model.draft_width()), V_(model.facts().vocab_size),
      merge_(options.merge_catch_up) {
  for (int j = 0; j < layers_; ++j) {
    dcache_.push_back(model.new_shared_draft_cache(capacity));
    dcache_.back().set_base_position(j);  // layer j's chained entries start at position j
  }
  g_.resize(layers_);
  g_start_.assign(layers_, 0);
  g_rows_.assign(layers_, 0);
  g_last_.assign(layers_, std::vector<float>(H_));
  canon_.assign(layers_, 0);
  stale_.assign(layers_, 0);
  // The catch-up buffers, and the model's own for a forward of backlog_rows, are sized for it now, so that
  // resuming drafting after a run of k = 0 rounds allocates nothing mid-decode.
  const int64_t backlog_max = chained_draft::backlog_rows(options.k_max);
  grow_rows(backlog_max);
  model.reserve_batch(backlog_max, capacity);
  // (filled per round: no growth; a selection never holds more positions than the cache)
  const int64_t topk_max = std::min<int64_t>(std::max<int64_t>(model.draft_selection_max(), 1), capacity);
  topk0_.reserve(topk_max);
  forced_slots_.reserve(topk_max);
  step_h_.resize(H_);
  draft_logits_.resize(V_);
}

// Catch-up buffers for `rows` positions (a prompt, or the deferred backlog): sized at prefill, never in decode.
template <class Stack>
void ChainedDraftSession<Stack>::grow_rows(int64_t rows) {
  if (rows <= rows_cap_) return;
  rows_cap_ = rows;
  pending_h_.resize(rows * H_);
  for (auto& g : g_) g.resize((rows + 1) * H_);
  stage_.resize((rows + 1) * H_);
  tokens_buf_.resize(rows + 1);
}

template <class Stack>
void ChainedDraftSession<Stack>::push_verified(const float* hidden, int64_t rows) {
  grow_rows(pending_rows_ + rows);
  std::copy(hidden, hidden + rows * H_, pending_h_.begin() + pending_rows_ * H_);
  pending_rows_ += rows;
}

// Keeps the newest kDeferRows deferred positions. Every layer forgets its chain: layer 0 restarts at the first
// kept position (its row q takes the target's hidden state at q, which is kept), the others after it as usual.
template <class Stack>
void ChainedDraftSession<Stack>::drop_oldest_deferred() {
  const int64_t drop = pending_rows_ - chained_draft::kDeferRows;
  if (drop <= 0) return;
  const int64_t first_kept = dcache_[0].base_position() + dcache_[0].length() + drop;
  std::copy(pending_h_.begin() + drop * H_, pending_h_.begin() + pending_rows_ * H_, pending_h_.begin());
  pending_rows_ -= drop;
  for (int j = 0; j < layers_; ++j) {
    dcache_[j].truncate(0);
    canon_[j] = 0;
    g_rows_[j] = 0;
    stale_[j] = j > 0;
  }
  dcache_[0].set_base_position(first_kept);
  g_start_[0] = first_kept;
}

// Draft steps >= 1 attend to the positions step 0 selected (the seed's shared top-k buffer): those of layer
// j's canonical rows, positions [base, end), as slots of its cache. Fills forced_slots_.
template <class Stack>
TopkOverride ChainedDraftSession<Stack>::step0_selection(int j, int64_t end) {
  forced_slots_.clear();
  const int64_t base = dcache_[j].base_position();
  for (int32_t ps : topk0_)
    if (ps >= base && ps < end) forced_slots_.push_back(static_cast<int32_t>(ps - base));
  TopkOverride ov{forced_slots_.data(), int64_t(forced_slots_.size())};
  ov.extend_from_slot = m_ - base;  // positions after step 0's query (m - 1)
  return ov;
}

// Catch-up of MTP layer j on the positions the target has verified, [cj, m-1]: row q gets token tokens[q+1]
// and layer j-1's output at q-1 (the target's hidden state for j = 0). With `extra`, the same forward also
// runs one speculative row at position m (layer j's draft step j, which extends the chain by one: token d_j,
// layer j-1's output at m-1, attending to step 0's selection); its output lands in extra->out and its cache
// row is dropped with the other draft rows at the end of the round. Fills req_; false: nothing to run.
template <class Stack>
bool ChainedDraftSession<Stack>::prepare_catch_up(int j, int64_t m, const ExtraRow* extra) {
  const std::vector<int32_t>& seq = *tokens_;
  if (stale_[j]) {
    dcache_[j].truncate(0);
    dcache_[j].set_base_position(std::max<int64_t>(j, g_start_[j - 1] + 1));
    stale_[j] = 0;
  }
  const int64_t cj = dcache_[j].base_position() + dcache_[j].length();
  const int64_t rows = m - cj;
  g_start_[j] = cj;
  g_rows_[j] = std::max<int64_t>(rows, 0);
  if (rows <= 0 && !extra) return false;
  const float* h_in;
  if (j == 0) {
    if (rows != pending_rows_) throw Error("internal: draft catch-up out of step");
    for (int64_t r = 0; r < rows; ++r) tokens_buf_[r] = seq[cj + r + 1];
    h_in = pending_h_.data();
  } else {
    // row q needs layer j-1's output at q-1: this round's rows, or its last canonical one before them
    // (g_last_[j-1] is still last round's: remember_last_outputs runs after every layer ran)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t qp = cj + r - 1;
      if (qp < g_start_[j - 1] - 1) throw Error("internal: chained draft input missing");
      const float* src =
          qp >= g_start_[j - 1] ? g_[j - 1].data() + (qp - g_start_[j - 1]) * H_ : g_last_[j - 1].data();
      std::copy(src, src + H_, stage_.data() + r * H_);
      tokens_buf_[r] = seq[cj + r + 1];
    }
    h_in = stage_.data();
  }
  const int64_t n_rows = std::max<int64_t>(rows, 0) + (extra ? 1 : 0);
  const TopkOverride* forced = nullptr;
  if (extra) {
    if (j == 0) throw Error("internal: layer 0 has no speculative catch-up row");
    tokens_buf_[n_rows - 1] = extra->token;
    std::copy(extra->h, extra->h + H_, stage_.data() + (n_rows - 1) * H_);
    h_in = stage_.data();
    ov_ = step0_selection(j, m);  // (this layer's canonical rows end at m once caught up)
    ov_.first_row = n_rows - 1;
    forced = &ov_;
  }
  req_ = layer_request(j, tokens_buf_.data(), h_in, n_rows, cj, &dcache_[j], g_[j].data(), forced,
                       j == 0 ? &topk0_ : nullptr);
  return true;
}

template <class Stack>
void ChainedDraftSession<Stack>::after_catch_up(int j, const ExtraRow* extra) {
  catch_seconds_ += req_.seconds;
  ++forwards_;
  canon_[j] = dcache_[j].length() - (extra ? 1 : 0);
  if (extra) {
    const float* o = g_[j].data() + (req_.rows - 1) * H_;
    std::copy(o, o + H_, extra->out);
  }
}

// Every active layer's output at position m-1 (canonical: the next round's chain), once all of them ran:
// layer j+1 reads layer j's previous last output.
template <class Stack>
void ChainedDraftSession<Stack>::remember_last_outputs(int active) {
  for (int j = 0; j < active; ++j)
    if (g_rows_[j] > 0) {
      const float* last = g_[j].data() + (g_rows_[j] - 1) * H_;
      std::copy(last, last + H_, g_last_[j].begin());
    }
}

template <class Stack>
void ChainedDraftSession<Stack>::catch_up_now(int j, int64_t m) {
  if (!prepare_catch_up(j, m, nullptr)) return;
  DraftRequest* one = &req_;
  model_.check_draft_request(req_);
  const auto t0 = chained_draft::Clock::now();
  model_.draft_forward_batch(j, &one, 1);
  req_.seconds = chained_draft::seconds_since(t0);
  after_catch_up(j, nullptr);
}

template <class Stack>
void ChainedDraftSession<Stack>::catch_up_prompt(const std::vector<int32_t>& tokens, int k_max) {
  tokens_ = &tokens;
  const int64_t n = int64_t(tokens.size()) - 1;  // the prompt; tokens[n] is the first generated token
  const int active = std::max(1, std::min(layers_, k_max));
  for (int j = 0; j < active; ++j) catch_up_now(j, n);
  remember_last_outputs(active);
  for (int j = active; j < layers_; ++j) stale_[j] = 1;
  pending_rows_ = 0;
}

// What a round decides before its first forward: the layers it uses, whether step 1 joins layer 1's catch-up.
template <class Stack>
void ChainedDraftSession<Stack>::plan_round(const std::vector<int32_t>& tokens, int k) {
  tokens_ = &tokens;
  m_ = int64_t(tokens.size()) - 1;  // tokens[m] is the newest token; the target has seen [0, m)
  catch_seconds_ = draft_seconds_ = 0;
  merged_ = false;
  if (k == 0 && pending_rows_ >= 2 * chained_draft::kDeferRows) drop_oldest_deferred();
  // Layers this round's steps use. An unused layer drops its chain and restarts it when next needed, from
  // the first position this round's outputs of layer j-1 allow.
  active_ = std::max(1, std::min(layers_, k));
  merge_step1_ = k >= 2 && merge_ && active_ >= 2;
  if (k > 0)
    for (int j = active_; j < layers_; ++j) {
      dcache_[j].truncate(0);
      stale_[j] = 1;
      g_rows_[j] = 0;
      canon_[j] = 0;
    }
}

// catch up (k > 0; k = 0 defers), then k steps: step 0 is layer 0's row at position m-1 (token tokens[m]),
// which drafts position m+1; step s >= 1 runs layer s mod L on the last draft (step 1 with layer 1's
// catch-up, when merged); each step's logits go to the picker, which returns the draft.
template <class Stack>
DraftRound ChainedDraftSession<Stack>::round(const std::vector<int32_t>& tokens, int k, DraftPicker& picker) {
  plan_round(tokens, k);
  if (k > 0) {
    if (prepare_catch_up(0, m_, nullptr)) {
      co_await DraftRound::Ask{req_};
      after_catch_up(0, nullptr);
    }
    if (!merge_step1_) {
      for (int j = 1; j < active_; ++j)
        if (prepare_catch_up(j, m_, nullptr)) {
          co_await DraftRound::Ask{req_};
          after_catch_up(j, nullptr);
        }
      remember_last_outputs(active_);
    }
    pending_rows_ = 0;
  }
  // Layer 0 has run position m-1: this round (its catch-up's last row) or before (right after prefill).
  const bool drafting = k > 0 && dcache_[0].base_position() + dcache_[0].length() == m_;
  if (drafting) {
    const float* h = g_rows_[0] > 0 ? g_[0].data() + (g_rows_[0] - 1) * H_ : g_last_[0].data();
    std::copy(h, h + H_, step_h_.begin());
    for (int s = 0; s < k; ++s) {
      if (s == 1 && merge_step1_) {
        const ExtraRow extra{prev_draft_, step_h_.data(), step_h_.data()};
        if (prepare_catch_up(1, m_, &extra)) {
          co_await DraftRound::Ask{req_};
          after_catch_up(1, &extra);
        }
        for (int j = 2; j < active_; ++j)
          if (prepare_catch_up(j, m_, nullptr)) {
            co_await DraftRound::Ask{req_};
            after_catch_up(j, nullptr);
          }
        remember_last_outputs(active_);
        merged_ = true;
      } else if (s > 0) {
        const int j = s % layers_;
        ov_ = step0_selection(j, dcache_[j].base_position() + canon_[j]);
        req_ = layer_request(j, &prev_draft_, step_h_.data(), 1, m_ - 1 + s, &dcache_[j], step_h_.data(), &ov_);
        co_await DraftRound::Ask{req_};
        draft_seconds_ += req_.seconds;
        ++forwards_;
      }
      const bool by_id = picker.picks_argmax();
      req_ = DraftRequest{};
      req_.hidden = step_h_.data();
      req_.logits = draft_logits_.data();
      req_.argmax = by_id ? &draft_argmax_ : nullptr;
      req_.picker = !by_id && picker.picks_alone() ? &picker : nullptr;
      req_.step = s;
      co_await DraftRound::Ask{req_};
      draft_seconds_ += req_.seconds;
      // NaN or inf would be drafted as token 0 or as garbage: stop, naming the layer.
      // (a row the driver picked from was finite: the pick may have masked it with -inf since)
      if (by_id ? draft_argmax_ < 0 : req_.picked < 0 && !all_finite(draft_logits_.data(), V_))
        throw Error("generate: MTP draft step " + std::to_string(s) + " (MTP layer " + std::to_string(s % layers_) +
                    ", position " + std::to_string(m_ - 1 + s) +
                    ") produced non-finite logits (NaN or inf); check the checkpoint with `nextn inspect --scan`");
      prev_draft_ = by_id                ? picker.pick_id(s, draft_argmax_)
                    : req_.picked >= 0 ? req_.picked
                                       : picker.pick(s, draft_logits_.data());
    }
    for (int j = 0; j < layers_; ++j) dcache_[j].truncate(canon_[j]);  // drop speculative draft rows
  }
  if (merge_step1_ && !merged_) {  // (no draft step ran: the other layers catch up)
    for (int j = 1; j < active_; ++j)
      if (prepare_catch_up(j, m_, nullptr)) {
        co_await DraftRound::Ask{req_};
        after_catch_up(j, nullptr);
      }
    remember_last_outputs(active_);
  }
}

template <class Stack>
void ChainedDraftDriver<Stack>::run(Stack& model, DraftRound* const* rounds, size_t n) {
  live_.clear();
  for (size_t i = 0; i < n; ++i)
    if (rounds[i] && !rounds[i]->done()) {
      rounds[i]->resume();  // (rounds start suspended)
      live_.push_back(rounds[i]);
    }
  while (true) {
    live_.erase(std::remove_if(live_.begin(), live_.end(), [](DraftRound* r) { return r->done(); }), live_.end());
    if (live_.empty()) return;
    for (DraftRound* r : live_) r->waiting()->seconds = -1;  // (not run yet)
    for (int layer = -1; layer < model.num_mtp_layers(); ++layer) run_group(model, layer);
    for (DraftRound* r : live_) {
      DraftRequest* q = r->waiting();
      if (q->seconds < 0) {
        q->error = std::make_exception_ptr(Error("internal: a draft round asked for MTP layer " + std::to_string(q->layer)));
        q->seconds = 0;
      }
      r->resume();
    }
  }
}

// The waiting requests of one layer (-1: logits), in forwards of up to kMaxRows rows (a larger request alone).
// A request that ran has seconds >= 0.
template <class Stack>
void ChainedDraftDriver<Stack>::run_group(Stack& model, int layer) {
  group_.clear();
  for (DraftRound* r : live_) {
    DraftRequest* q = r->waiting();
    if (q->layer != layer) continue;
    try {
      if (layer >= 0) model.check_draft_request(*q);
      group_.push_back(q);
    } catch (...) {
      q->error = std::current_exception();
      q->seconds = 0;
    }
  }
  const int64_t W = model.draft_width(), V = model.facts().vocab_size;
  auto rows_of = [](const DraftRequest* q) { return q->layer >= 0 ? q->rows : int64_t(1); };
  for (size_t b = 0; b < group_.size();) {
    size_t e = b;
    int64_t rows = 0;
    while (e < group_.size() && (e == b || rows + rows_of(group_[e]) <= kMaxRows)) rows += rows_of(group_[e++]);
    const auto t0 = chained_draft::Clock::now();
    double picks_seconds = 0;  // (a pick charges its own time to its sequence)
    try {
      if (layer >= 0) {
        model.draft_forward_batch(layer, group_.data() + b, e - b);
      } else {
        // One lm_head for all: the requests that take only the argmax first, then those that read whole rows.
        order_.clear();
        for (size_t i = b; i < e; ++i)
          if (group_[i]->argmax) order_.push_back(group_[i]);
        const int64_t by_id = int64_t(order_.size());
        for (size_t i = b; i < e; ++i)
          if (!group_[i]->argmax) order_.push_back(group_[i]);
        if (int64_t(hidden_.size()) < rows * W) hidden_.resize(rows * W);
        if (int64_t(logits_.size()) < rows * V) logits_.resize(rows * V);
        if (int64_t(argmax_.size()) < rows) argmax_.resize(rows);
        for (int64_t r = 0; r < rows; ++r) std::copy(order_[r]->hidden, order_[r]->hidden + W, hidden_.begin() + r * W);
        model.draft_logits_rows(hidden_.data(), rows, logits_.data(), argmax_.data(), by_id);
        for (int64_t r = 0; r < by_id; ++r) *order_[r]->argmax = argmax_[r];
        const auto t_picks = chained_draft::Clock::now();
        hand_over_rows(model, by_id, rows);
        picks_seconds = chained_draft::seconds_since(t_picks);
      }
    } catch (...) {
      for (size_t i = b; i < e; ++i) group_[i]->error = std::current_exception();
    }
    const double seconds = chained_draft::seconds_since(t0) - picks_seconds;
    for (size_t i = b; i < e; ++i) group_[i]->seconds = seconds * double(rows_of(group_[i])) / double(rows);
    b = e;
  }
}

// Rows [from, to) of the last draft lm_head (order_) to their requests, with the picks of those whose pickers
// pick alone: a sampled pick builds a distribution over the vocabulary (0.1-0.6 ms a row at 32-129k tokens),
// which 64 sequences' rounds would otherwise make one after another between the GPU's steps.
template <class Stack>
void ChainedDraftDriver<Stack>::hand_over_rows(Stack& model, int64_t from, int64_t to) {
  const int64_t V = model.facts().vocab_size;
  int64_t picks = 0;
  for (int64_t r = from; r < to; ++r) picks += order_[r]->picker != nullptr;
  ThreadPool* pool = picks > 1 ? pool_for_work(model.host_pool(), picks * V * kSampledWorkPerLogit) : nullptr;
  parallel_for(pool, to - from, 1, [&](int64_t begin, int64_t end, int) {
    for (int64_t r = from + begin; r < from + end; ++r) {
      DraftRequest& q = *order_[r];
      std::copy(logits_.begin() + r * V, logits_.begin() + (r + 1) * V, q.logits);
      q.picked = -1;
      if (!q.picker || !all_finite(q.logits, V)) continue;  // (a non-finite row: the round names it)
      try {
        q.picked = q.picker->pick(q.step, q.logits);
      } catch (...) {
        q.error = std::current_exception();
      }
    }
  });
}

}  // namespace nextn
