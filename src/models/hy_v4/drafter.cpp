#include "models/hy_v4/drafter.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "core/finite.h"

namespace nextn {
namespace {

// Rounds with k = 0 leave the MTP layers' catch-up for later, up to this many positions.
constexpr int64_t kDeferRows = 64;

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

HYV4DraftSession::HYV4DraftSession(HYV4Model& model, int64_t capacity, const DraftOptions& options)
    : model_(model), layers_(model.num_mtp_layers()), H_(model.config().hidden_size), V_(model.config().vocab_size),
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
  grow_rows(std::max<int64_t>(kDeferRows, options.k_max + 1));
  // (filled per round: no growth; a selection never holds more positions than the cache)
  const int64_t topk_max = std::min<int64_t>(std::max<int64_t>(model.config().index_topk, 1), capacity);
  topk0_.reserve(topk_max);
  forced_slots_.reserve(topk_max);
  step_h_.resize(H_);
  draft_logits_.resize(V_);
}

// Catch-up buffers for `rows` positions (a prompt, or the deferred backlog): sized at prefill, never in decode.
void HYV4DraftSession::grow_rows(int64_t rows) {
  if (rows <= rows_cap_) return;
  rows_cap_ = rows;
  pending_h_.resize(rows * H_);
  for (auto& g : g_) g.resize((rows + 1) * H_);
  stage_.resize((rows + 1) * H_);
  tokens_buf_.resize(rows + 1);
}

void HYV4DraftSession::push_verified(const float* hidden, int64_t rows) {
  grow_rows(pending_rows_ + rows);
  std::copy(hidden, hidden + rows * H_, pending_h_.begin() + pending_rows_ * H_);
  pending_rows_ += rows;
}

// Draft steps >= 1 attend to the positions step 0 selected (the seed's shared top-k buffer): those of layer
// j's canonical rows, positions [base, end), as slots of its cache. Fills forced_slots_.
TopkOverride HYV4DraftSession::step0_selection(int j, int64_t end) {
  forced_slots_.clear();
  const int64_t base = dcache_[j].base_position();
  for (int32_t ps : topk0_)
    if (ps >= base && ps < end) forced_slots_.push_back(static_cast<int32_t>(ps - base));
  return TopkOverride{forced_slots_.data(), int64_t(forced_slots_.size())};
}

// Catch-up of MTP layer j on the positions the target has verified, [cj, m-1]: row q gets token tokens[q+1]
// and layer j-1's output at q-1 (the target's hidden state for j = 0). With `extra`, the same forward also
// runs one speculative row at position m (layer j's draft step j, which extends the chain by one: token d_j,
// layer j-1's output at m-1, attending to step 0's selection); its output lands in extra->out and its cache
// row is dropped with the other draft rows at the end of the round.
void HYV4DraftSession::catch_up(int j, int64_t m, const ExtraRow* extra) {
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
  if (rows <= 0 && !extra) return;
  const float* h_in;
  if (j == 0) {
    if (rows != pending_rows_) throw Error("internal: draft catch-up out of step");
    for (int64_t r = 0; r < rows; ++r) tokens_buf_[r] = seq[cj + r + 1];
    h_in = pending_h_.data();
  } else {
    // row q needs layer j-1's output at q-1: this round's rows, or its last canonical one before them
    // (g_last_[j-1] is still last round's: the caller updates it after every layer ran)
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
  TopkOverride ov{nullptr, 0};
  if (extra) {
    if (j == 0) throw Error("internal: layer 0 has no speculative catch-up row");
    tokens_buf_[n_rows - 1] = extra->token;
    std::copy(extra->h, extra->h + H_, stage_.data() + (n_rows - 1) * H_);
    h_in = stage_.data();
    ov = step0_selection(j, m);  // (this layer's canonical rows end at m once caught up)
    ov.first_row = n_rows - 1;
  }
  const auto t0 = Clock::now();
  model_.draft_forward(j, tokens_buf_.data(), h_in, n_rows, cj, dcache_[j], nullptr, g_[j].data(),
                       extra ? &ov : nullptr, j == 0 ? &topk0_ : nullptr);
  catch_seconds_ += seconds_since(t0);
  ++forwards_;
  canon_[j] = dcache_[j].length() - (extra ? 1 : 0);
  if (extra) {
    const float* o = g_[j].data() + (n_rows - 1) * H_;
    std::copy(o, o + H_, extra->out);
  }
}

// Catches up the active layers from `first` on, then remembers every active layer's output at position m-1
// (canonical: the next round's chain). Done after all of them ran: layer j+1 reads layer j's previous last
// output.
void HYV4DraftSession::finish_catch_up(int first, int active, int64_t m) {
  for (int j = first; j < active; ++j) catch_up(j, m, nullptr);
  for (int j = 0; j < active; ++j)
    if (g_rows_[j] > 0) {
      const float* last = g_[j].data() + (g_rows_[j] - 1) * H_;
      std::copy(last, last + H_, g_last_[j].begin());
    }
}

void HYV4DraftSession::catch_up_prompt(const std::vector<int32_t>& tokens, int k_max) {
  tokens_ = &tokens;
  const int64_t n = int64_t(tokens.size()) - 1;  // the prompt; tokens[n] is the first generated token
  const int active = std::max(1, std::min(layers_, k_max));
  finish_catch_up(0, active, n);
  for (int j = active; j < layers_; ++j) stale_[j] = 1;
  pending_rows_ = 0;
}

bool HYV4DraftSession::begin_round(const std::vector<int32_t>& tokens, int k) {
  tokens_ = &tokens;
  m_ = int64_t(tokens.size()) - 1;  // tokens[m] is the newest token; the target has seen [0, m)
  catch_seconds_ = 0;
  merged_ = false;
  const bool defer = k == 0 && pending_rows_ < kDeferRows;
  const bool catching = !defer;
  // Layers this round's steps use. An unused layer drops its chain and restarts it when next needed, from
  // the first position this round's outputs of layer j-1 allow.
  active_ = std::max(1, std::min(layers_, k));
  merge_step1_ = catching && merge_ && k >= 2 && active_ >= 2;
  if (catching) {
    for (int j = active_; j < layers_; ++j) {
      dcache_[j].truncate(0);
      stale_[j] = 1;
      g_rows_[j] = 0;
      canon_[j] = 0;
    }
    catch_up(0, m_, nullptr);
    if (!merge_step1_) finish_catch_up(1, active_, m_);
    pending_rows_ = 0;
  }
  // Layer 0 has run position m-1: this round (its catch-up's last row) or before (right after prefill).
  drafting_ = k > 0 && dcache_[0].base_position() + dcache_[0].length() == m_;
  if (drafting_) {
    // Step 0: layer 0's row at position m-1 (token tokens[m]) drafts position m+1.
    const float* h = g_rows_[0] > 0 ? g_[0].data() + (g_rows_[0] - 1) * H_ : g_last_[0].data();
    std::copy(h, h + H_, step_h_.begin());
  }
  return drafting_;
}

float* HYV4DraftSession::step(int s, int32_t prev_draft) {
  if (!drafting_) throw Error("internal: draft step outside a drafting round");
  if (s == 1 && merge_step1_) {
    const ExtraRow extra{prev_draft, step_h_.data(), step_h_.data()};
    catch_up(1, m_, &extra);
    finish_catch_up(2, active_, m_);
    merged_ = true;
  } else if (s > 0) {
    const int j = s % layers_;
    const TopkOverride ov = step0_selection(j, dcache_[j].base_position() + canon_[j]);
    model_.draft_forward(j, &prev_draft, step_h_.data(), 1, m_ - 1 + s, dcache_[j], nullptr, step_h_.data(), &ov);
    ++forwards_;
  }
  model_.lm_head(step_h_.data(), 1, draft_logits_.data());
  // NaN or inf would be drafted as token 0 or as garbage: stop, naming the layer.
  if (!all_finite(draft_logits_.data(), V_))
    throw Error("generate: MTP draft step " + std::to_string(s) + " (MTP layer " + std::to_string(s % layers_) +
                ", position " + std::to_string(m_ - 1 + s) +
                ") produced non-finite logits (NaN or inf); check the checkpoint with `nextn inspect --scan`");
  return draft_logits_.data();
}

void HYV4DraftSession::end_round() {
  if (drafting_)
    for (int j = 0; j < layers_; ++j) dcache_[j].truncate(canon_[j]);  // drop speculative draft rows
  if (merge_step1_ && !merged_) finish_catch_up(1, active_, m_);  // (no draft step ran: the others catch up)
  drafting_ = false;
}

}  // namespace nextn
