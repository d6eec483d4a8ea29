#include "engine/generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "engine/k_tuner.h"

namespace nextn {

void SpecOptions::validate() const {
  if (num_speculative_tokens < 1 || num_speculative_tokens > 8)
    throw Error("speculative: num_speculative_tokens must be in 1..8, got " + std::to_string(num_speculative_tokens));
  if (relaxed && (relaxed_top_n < 1 || !(relaxed_delta >= 0.0f)))
    throw Error("speculative: relaxed acceptance needs top_n >= 1 and delta >= 0");
  if (adaptive && (adaptive_window < 1 || adaptive_probe_interval < 1 || !(adaptive_threshold >= 0.0f)))
    throw Error("speculative: adaptive needs window >= 1, probe interval >= 1, threshold >= 0");
  if (adaptive && tune_k) throw Error("speculative: choose either adaptive k or tuned k, not both");
}

std::string SpecStats::rounds_at_k_text() const {
  std::string out;
  for (size_t k = 0; k < rounds_at_k.size(); ++k) {
    out += ' ';
    out += std::to_string(k);
    out += ':';
    out += std::to_string(rounds_at_k[k]);
  }
  return out;
}

SpecStats::DecodeShares SpecStats::decode_shares() const {
  if (!(decode_seconds > 0)) return {0, 0, 0, 0};
  const double d = decode_seconds;
  return {verify_seconds / d, catch_up_seconds / d, draft_seconds / d,
          (d - verify_seconds - catch_up_seconds - draft_seconds) / d};
}

std::string SpecStats::round_split_text() const {
  const DecodeShares s = decode_shares();
  char buf[160];
  std::snprintf(buf, sizeof buf, "verify %.1f%%, MTP catch-up %.1f%%, draft steps %.1f%%, other %.1f%%",
                100 * s.verify, 100 * s.catch_up, 100 * s.draft, 100 * s.other);
  return buf;
}

double SpecStats::mean_acceptance_length() const {
  return num_drafts ? 1.0 + double(num_accepted_tokens) / double(num_drafts) : 1.0;
}

std::vector<double> SpecStats::per_position_acceptance() const {
  std::vector<double> r;
  for (int64_t a : accepted_per_position) r.push_back(num_drafts ? double(a) / double(num_drafts) : 0.0);
  return r;
}

double SpecStats::tokens_per_second() const {
  // decode speed: tokens after the first (which prefill produces) over the time after it
  return decode_seconds > 0 && num_generated > 1 ? double(num_generated - 1) / decode_seconds : 0.0;
}

void SpecStats::add_round(int drafted, int accepted) {
  ++num_drafts;
  num_draft_tokens += drafted;
  num_accepted_tokens += accepted;
  if (accepted_per_position.size() < size_t(drafted)) accepted_per_position.resize(drafted, 0);
  for (int i = 0; i < accepted; ++i) ++accepted_per_position[i];
}

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// log-softmax of raw logits: the chosen token's logprob and the top-n alternatives.
TokenLogprob make_logprob(const float* logits, int64_t V, int32_t token, int top_n) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < V; ++i) mx = std::max(mx, logits[i]);
  double z = 0;
  for (int64_t i = 0; i < V; ++i) z += std::exp(double(logits[i]) - mx);
  const float lz = static_cast<float>(std::log(z)) + mx;
  TokenLogprob lp{token, logits[token] - lz, {}};
  if (top_n > 0) {
    std::vector<int32_t> idx(V);
    for (int64_t i = 0; i < V; ++i) idx[i] = static_cast<int32_t>(i);
    const int64_t n = std::min<int64_t>(top_n, V);
    std::partial_sort(idx.begin(), idx.begin() + n, idx.end(),
                      [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    for (int64_t i = 0; i < n; ++i) lp.top.emplace_back(idx[i], logits[idx[i]] - lz);
  }
  return lp;
}

}  // namespace

Generator::Generator(HYV4Model& model) : model_(model) {}

GenerationResult Generator::generate(const std::vector<int32_t>& prompt, const SamplingParams& params,
                                     const SpecOptions& spec_in, const std::function<bool(int32_t)>& on_token) {
  params.validate();
  SpecOptions spec = spec_in;
  spec.validate();
  if (prompt.empty()) throw Error("generate: the prompt is empty");
  const HYV4Config& c = model_.config();
  const int64_t V = c.vocab_size, H = c.hidden_size;
  for (int32_t t : prompt)
    if (t < 0 || t >= V) throw Error("generate: prompt token " + std::to_string(t) + " outside the vocabulary");

  const int nL = model_.num_mtp_layers();
  const bool speculate = spec.enabled && nL > 0;
  const int k_max = speculate ? spec.num_speculative_tokens : 0;
  const int64_t n = prompt.size();
  // Prompt and output share the model's context (as OpenAI-style servers count it): a longer prompt is an
  // error, a max_tokens past the context is cut to what is left, so no cache outgrows the context.
  const int64_t context = c.max_position_embeddings;
  if (n > context)
    throw Error("generate: the prompt has " + std::to_string(n) + " tokens, more than the model's context of " +
                std::to_string(context) + " (max_position_embeddings)");
  const int64_t max_tokens = std::min<int64_t>(params.max_tokens, context - n);
  if (max_tokens < params.max_tokens)
    std::fprintf(stderr, "nextn: note: max_tokens %lld is more than the context leaves (%lld of %lld after the prompt's "
                 "%lld tokens): generating at most %lld tokens\n", (long long)params.max_tokens,
                 (long long)(context - n), (long long)context, (long long)n, (long long)max_tokens);
  // The last position a forward reads is n + max_tokens - 2 (the last token is emitted, never fed back); the
  // slack past it is for the verify and draft rows of a round.
  const int64_t capacity = std::min<int64_t>(n + max_tokens + k_max + 2, context);

  GenerationResult res;
  SpecStats& st = res.stats;
  st.prompt_tokens = n;
  if (max_tokens == 0) {
    res.finish_reason = "length";
    return res;
  }

  Sampler sampler(V, params);
  TokenHistory history;
  history.reset(V, prompt);
  KVCache target = model_.new_cache(capacity);
  std::vector<KVCache> dcache;
  for (int j = 0; j < nL && speculate; ++j) {
    dcache.push_back(model_.new_draft_cache(capacity));
    dcache.back().set_base_position(j);  // layer j's chained entries start at position j
  }

  // Buffers, sized once: the decode loop does not allocate (beyond the result vectors).
  // Rounds with k = 0 (tuned or adaptive k) leave the MTP layers' catch-up for later, up to kDeferRows
  // positions, so that it runs as one batched draft forward when drafting resumes (a layer's outputs do
  // not depend on how many rows share its forward, so the drafts are the same).
  constexpr int64_t kDeferRows = 64;
  const int64_t rows_max = std::max<int64_t>(n, k_max + 1);
  const int64_t catch_max = std::max(rows_max, kDeferRows);  // rows of one catch-up
  std::vector<float> logits(rows_max * V), hidden(rows_max * H);
  std::vector<float> pending_h(catch_max * H);  // target hidden of positions [c0, m-1] not yet seen by layer 0
  int64_t pending_rows = 0;
  std::vector<std::vector<float>> g(nL, std::vector<float>((catch_max + 1) * H));  // layer outputs this round
  std::vector<int64_t> g_start(nL, 0), g_rows(nL, 0);
  std::vector<std::vector<float>> g_last(nL, std::vector<float>(H));  // layer j's last canonical output
  std::vector<int64_t> canon(nL, 0);
  std::vector<bool> stale(nL, false);
  std::vector<float> stage((catch_max + 1) * H);  // chained inputs of a draft layer's catch-up
  std::vector<int32_t> tokens_buf(catch_max + 1), topk0, forced_slots;
  // (filled per round: no growth in the loop; a selection never holds more positions than the cache)
  const int64_t topk_max = std::min<int64_t>(std::max<int64_t>(c.index_topk, 1), capacity);
  topk0.reserve(topk_max);
  forced_slots.reserve(topk_max);
  double catch_seconds = 0;  // draft catch-up forwards of the current round
  std::vector<float> step_h(H), draft_logits(V), q((k_max + 1) * V), p(V), resid(V);
  std::vector<int32_t> drafts(k_max + 1);
  std::vector<int32_t> seq = prompt;
  seq.reserve(capacity);

  bool stop = false;
  auto emit = [&](int32_t t, const float* raw_logits) {
    seq.push_back(t);
    history.push(t);
    res.ids.push_back(t);
    ++st.num_generated;
    if (params.logprobs >= 0) res.logprobs.push_back(make_logprob(raw_logits, V, t, params.logprobs));
    if (on_token && !on_token(t)) {
      stop = true;
      res.finish_reason = "stop";
    }
    if (std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), t) != params.stop_token_ids.end()) {
      stop = true;
      res.finish_reason = "stop";
    }
    if (!stop && int64_t(res.ids.size()) >= max_tokens) {
      stop = true;
      res.finish_reason = "length";
    }
  };
  // NaN or inf in a row of logits (a non-finite weight, or one that overflows) would be sampled as token 0 or
  // as garbage: generation stops at the first such row the sampler is about to read, naming the forward.
  auto require_finite_target = [&](const float* raw, int64_t pos) {
    if (!all_finite(raw, V))
      throw Error("generate: the target forward at position " + std::to_string(pos) +
                  " produced non-finite logits (NaN or inf); check the checkpoint with `nextn inspect --scan`");
  };
  auto require_finite_draft = [&](const float* raw, int step, int layer, int64_t pos) {
    if (!all_finite(raw, V))
      throw Error("generate: MTP draft step " + std::to_string(step) + " (MTP layer " + std::to_string(layer) +
                  ", position " + std::to_string(pos) +
                  ") produced non-finite logits (NaN or inf); check the checkpoint with `nextn inspect --scan`");
  };
  // Target choice for one row of raw logits (penalties from the current history).
  auto target_dist = [&](const float* raw, float* probs) {
    std::copy(raw, raw + V, resid.data());
    sampler.apply_penalties(resid.data(), history);
    sampler.distribution(resid.data(), probs);
  };

  // Draft steps >= 1 attend to the positions step 0 selected (the seed's shared top-k buffer): those of
  // layer j's canonical rows, positions [base, end), as slots of its cache. Fills forced_slots.
  auto step0_selection = [&](int j, int64_t end) {
    forced_slots.clear();
    const int64_t base = dcache[j].base_position();
    for (int32_t ps : topk0)
      if (ps >= base && ps < end) forced_slots.push_back(static_cast<int32_t>(ps - base));
    return TopkOverride{forced_slots.data(), int64_t(forced_slots.size())};
  };

  // Catch-up of MTP layer j on the positions the target has verified, [cj, m-1]: row q gets token
  // seq[q+1] and layer j-1's output at q-1 (the target's hidden state for j = 0). With `extra`, the same
  // forward also runs one speculative row at position m (layer j's draft step j, which extends the chain
  // by one: token d_j, layer j-1's output at m-1, attending to step 0's selection); its output lands in
  // extra->out and its cache row is dropped with the other draft rows at the end of the round.
  struct ExtraRow {
    int32_t token;
    const float* h;
    float* out;
  };
  auto catch_up = [&](int j, int64_t m, const ExtraRow* extra) {
    if (stale[j]) {
      dcache[j].truncate(0);
      dcache[j].set_base_position(std::max<int64_t>(j, g_start[j - 1] + 1));
      stale[j] = false;
    }
    const int64_t cj = dcache[j].base_position() + dcache[j].length();
    const int64_t rows = m - cj;
    g_start[j] = cj;
    g_rows[j] = std::max<int64_t>(rows, 0);
    if (rows <= 0 && !extra) return;
    const float* h_in;
    if (j == 0) {
      if (rows != pending_rows) throw Error("internal: draft catch-up out of step");
      for (int64_t r = 0; r < rows; ++r) tokens_buf[r] = seq[cj + r + 1];
      h_in = pending_h.data();
    } else {
      // row q needs layer j-1's output at q-1: this round's rows, or its last canonical one before them
      // (g_last[j-1] is still last round's: the caller updates it after every layer ran)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t qp = cj + r - 1;
        if (qp < g_start[j - 1] - 1) throw Error("internal: chained draft input missing");
        const float* src = qp >= g_start[j - 1] ? g[j - 1].data() + (qp - g_start[j - 1]) * H
                                                : g_last[j - 1].data();
        std::copy(src, src + H, stage.data() + r * H);
        tokens_buf[r] = seq[cj + r + 1];
      }
      h_in = stage.data();
    }
    const int64_t n_rows = std::max<int64_t>(rows, 0) + (extra ? 1 : 0);
    TopkOverride ov{nullptr, 0};
    if (extra) {
      if (j == 0) throw Error("internal: layer 0 has no speculative catch-up row");
      tokens_buf[n_rows - 1] = extra->token;
      std::copy(extra->h, extra->h + H, stage.data() + (n_rows - 1) * H);
      h_in = stage.data();
      ov = step0_selection(j, m);  // (this layer's canonical rows end at m once caught up)
      ov.first_row = n_rows - 1;
    }
    const auto t0 = Clock::now();
    model_.draft_forward(j, tokens_buf.data(), h_in, n_rows, cj, dcache[j], nullptr, g[j].data(),
                         extra ? &ov : nullptr, j == 0 ? &topk0 : nullptr);
    catch_seconds += seconds_since(t0);
    ++st.draft_forwards;
    canon[j] = dcache[j].length() - (extra ? 1 : 0);
    if (extra) {
      const float* o = g[j].data() + (n_rows - 1) * H;
      std::copy(o, o + H, extra->out);
    }
  };
  // Catches up the active layers from `first` on, then remembers every active layer's output at position
  // m-1 (canonical: the next round's chain). Done after all of them ran: layer j+1 reads layer j's
  // previous last output.
  auto finish_catch_up = [&](int first, int active, int64_t m) {
    for (int j = first; j < active; ++j) catch_up(j, m, nullptr);
    for (int j = 0; j < active; ++j)
      if (g_rows[j] > 0) {
        const float* last = g[j].data() + (g_rows[j] - 1) * H;
        std::copy(last, last + H, g_last[j].begin());
      }
  };

  // Prefill: the target over the prompt, then (once the first token is out) the MTP layers over it, so
  // that decoding starts with every draft layer caught up. Both count as prefill time.
  auto t0 = Clock::now();
  model_.forward(prompt.data(), n, target, logits.data(), hidden.data(), /*all_logits=*/false);
  ++st.target_forwards;
  {
    require_finite_target(logits.data(), n - 1);
    target_dist(logits.data(), p.data());
    const int32_t t = params.greedy() ? Sampler::argmax(p.data(), V) : sampler.sample(p.data());
    emit(t, logits.data());
  }
  if (speculate && !stop) {
    std::copy(hidden.begin(), hidden.begin() + n * H, pending_h.begin());
    pending_rows = n;
    const int active = std::max(1, std::min(nL, k_max));
    finish_catch_up(0, active, n);
    for (int j = active; j < nL; ++j) stale[j] = true;
    pending_rows = 0;
  }
  st.prefill_seconds = seconds_since(t0);
  auto t_decode = Clock::now();

  // Tuned k (greedy): KTuner picks each round's k from measured speed.
  const bool tuned = speculate && spec.tune_k && params.greedy();
  KTuner tuner(k_max);
  double deferred_row_seconds = 0;  // tuned k: what catching up one position left by a k = 0 round cost
  // Adaptive k state.
  int k_cur = k_max;
  std::vector<std::pair<int, int>> window;  // (drafted, accepted) of recent rounds
  int64_t since_probe = 0;

  while (!stop) {
    const int64_t m = int64_t(seq.size()) - 1;  // seq[m] is the newest token; the target has seen [0, m)
    const auto t_round = Clock::now();
    const int64_t emitted_before = int64_t(res.ids.size());
    const int k_chosen = tuned ? tuner.next() : k_cur;
    int k = k_chosen;
    if (speculate && spec.adaptive && k_cur == 0 && ++since_probe >= spec.adaptive_probe_interval) {
      k = 1;  // probe
      since_probe = 0;
    }
    // Never draft past max_tokens: the round emits at most k+1 tokens.
    k = std::min<int64_t>(k, max_tokens - int64_t(res.ids.size()) - 1);
    if (k < 0) k = 0;

    // ---- Draft: catch every MTP layer up on the verified positions, then k draft steps. Step s uses
    // layer s mod nL. Layer 1's catch-up waits for step 0's token and runs step 1 in the same forward.
    const bool defer = k == 0 && pending_rows < kDeferRows;
    // A catch-up longer than one round's own rows (positions deferred by k = 0 rounds) is a one-off; the
    // tuner does not charge it to this round's k.
    const bool backlog = pending_rows > k_max + 1;
    const int64_t backlog_rows = backlog ? pending_rows : 0;
    catch_seconds = 0;
    const bool catching = speculate && !defer;
    // Layers this round's steps use. An unused layer drops its chain and restarts it when next needed,
    // from the first position this round's outputs of layer j-1 allow.
    const int active = std::max(1, std::min(nL, k));
    const bool merge_step1 = catching && !spec.unmerged_catch_up_for_tests && k >= 2 && active >= 2;
    if (catching) {
      for (int j = active; j < nL; ++j) {
        dcache[j].truncate(0);
        stale[j] = true;
        g_rows[j] = 0;
        canon[j] = 0;
      }
      catch_up(0, m, nullptr);
      if (!merge_step1) finish_catch_up(1, active, m);
      pending_rows = 0;
    }

    int drafted = 0;
    bool merged = false;
    // Layer 0 has run position m-1: this round (its catch-up's last row) or before (right after prefill).
    const bool layer0_ready = speculate && dcache[0].base_position() + dcache[0].length() == m;
    if (k > 0 && layer0_ready) {
      // Step 0: layer 0's row at position m-1 (token seq[m]) drafts position m+1.
      const float* h = g_rows[0] > 0 ? g[0].data() + (g_rows[0] - 1) * H : g_last[0].data();
      std::copy(h, h + H, step_h.begin());
      for (int s = 0; s < k; ++s) {
        if (s == 1 && merge_step1) {
          const ExtraRow extra{drafts[0], step_h.data(), step_h.data()};
          catch_up(1, m, &extra);
          finish_catch_up(2, active, m);
          merged = true;
        } else if (s > 0) {
          const int j = s % nL;
          const int64_t pos = m - 1 + s;
          const TopkOverride ov = step0_selection(j, dcache[j].base_position() + canon[j]);
          model_.draft_forward(j, &drafts[s - 1], step_h.data(), 1, pos, dcache[j], nullptr, step_h.data(), &ov);
          ++st.draft_forwards;
        }
        model_.lm_head(step_h.data(), 1, draft_logits.data());
        require_finite_draft(draft_logits.data(), s, s % nL, m - 1 + s);
        float* qs = q.data() + s * V;
        sampler.apply_penalties(draft_logits.data(), history);
        sampler.distribution(draft_logits.data(), qs);
        if (spec.draft_dist_hook) {
          std::vector<int32_t> ctx = seq;
          ctx.insert(ctx.end(), drafts.begin(), drafts.begin() + s);
          spec.draft_dist_hook(ctx, qs);
        }
        int32_t d = params.greedy() ? Sampler::argmax(qs, V) : sampler.sample(qs);
        if (spec.draft_hook) {  // test seam: replace the drafted token (greedy only)
          d = spec.draft_hook(int64_t(seq.size()) + s, d);
          std::fill(qs, qs + V, 0.0f);
          qs[d] = 1.0f;
        }
        if (!spec.use_draft_probs) {  // one-hot q at the drafted token
          std::fill(qs, qs + V, 0.0f);
          qs[d] = 1.0f;
        }
        drafts[s] = d;
        history.push(d);
        ++drafted;
      }
      for (int s = drafted - 1; s >= 0; --s) history.pop(drafts[s]);
      for (int j = 0; j < nL; ++j) dcache[j].truncate(canon[j]);  // drop speculative draft rows
    }
    if (merge_step1 && !merged) finish_catch_up(1, active, m);  // (no draft step ran: the others catch up)
    const double backlog_seconds = backlog ? catch_seconds : 0.0;

    // ---- Verify: one target forward over [seq[m], d_1..d_k].
    const int64_t rows = drafted + 1;
    tokens_buf[0] = seq[m];
    for (int s = 0; s < drafted; ++s) tokens_buf[s + 1] = drafts[s];
    const auto t_verify = Clock::now();
    if (speculate) {
      st.catch_up_seconds += catch_seconds;
      st.draft_seconds += std::chrono::duration<double>(t_verify - t_round).count() - catch_seconds;
    }
    model_.forward(tokens_buf.data(), rows, target, logits.data(), hidden.data(), /*all_logits=*/true);
    ++st.target_forwards;
    if (speculate) st.verify_seconds += seconds_since(t_verify);

    int accepted = 0;
    for (int i = 0; i < drafted && !stop; ++i) {
      const float* raw = logits.data() + int64_t(i) * V;
      require_finite_target(raw, m + i);
      target_dist(raw, p.data());
      const int32_t d = drafts[i];
      bool ok;
      if (params.greedy()) {
        ok = Sampler::argmax(p.data(), V) == d;
      } else {
        const float qd = q[int64_t(i) * V + d];
        ok = qd > 0 && sampler.uniform() < std::min(1.0f, p[d] / qd);
      }
      if (spec.broken_accept_all_for_tests) ok = true;
      if (!ok && spec.relaxed) {
        // Lossy opt-in: d within the target's top-N and close to its best probability (T = 1).
        std::copy(raw, raw + V, resid.data());
        sampler.apply_penalties(resid.data(), history);
        float mx = -INFINITY;
        for (int64_t v = 0; v < V; ++v) mx = std::max(mx, resid[v]);
        double z = 0;
        for (int64_t v = 0; v < V; ++v) z += std::exp(double(resid[v]) - mx);
        int rank = 0;
        for (int64_t v = 0; v < V; ++v) rank += resid[v] > resid[d];
        const double pd = std::exp(double(resid[d]) - mx) / z, ptop = 1.0 / z;
        ok = rank < spec.relaxed_top_n && pd >= ptop - spec.relaxed_delta;
      }
      if (!ok) {
        // Correction: the target's token (greedy), or a draw from normalize(max(p - q, 0)).
        int32_t t;
        if (params.greedy()) {
          t = Sampler::argmax(p.data(), V);
        } else {
          const float* qs = q.data() + int64_t(i) * V;
          double z = 0;
          for (int64_t v = 0; v < V; ++v) {
            resid[v] = std::max(p[v] - qs[v], 0.0f);
            z += resid[v];
          }
          if (z <= 0) {
            t = sampler.sample(p.data());
          } else {
            for (int64_t v = 0; v < V; ++v) resid[v] = static_cast<float>(resid[v] / z);
            t = sampler.sample(resid.data());
          }
        }
        emit(t, raw);
        break;
      }
      ++accepted;
      emit(d, raw);
    }
    if (!stop && accepted == drafted) {  // bonus token from the last row
      const float* raw = logits.data() + int64_t(drafted) * V;
      require_finite_target(raw, m + drafted);
      target_dist(raw, p.data());
      const int32_t t = params.greedy() ? Sampler::argmax(p.data(), V) : sampler.sample(p.data());
      emit(t, raw);
    }
    if (drafted > 0) st.add_round(drafted, accepted);

    // Keep the target cache for positions m..m+accepted; their hidden states feed the next draft round.
    const int64_t kept = std::min<int64_t>(accepted + 1, rows);
    target.truncate(m + kept);
    if (speculate) {
      if (pending_rows + kept > catch_max) throw Error("internal: draft catch-up backlog overflow");
      std::copy(hidden.begin(), hidden.begin() + kept * H, pending_h.begin() + pending_rows * H);
      pending_rows += kept;
    }
    if (!stop && int64_t(seq.size()) != m + kept + 1) throw Error("internal: sequence and cache out of step");

    if (tuned) {
      const int emitted = static_cast<int>(int64_t(res.ids.size()) - emitted_before);
      // A k = 0 round leaves its position to a later batched catch-up of the MTP layers (the backlog,
      // kept out of that later round's time): it is charged that catch-up's last measured cost per row.
      if (backlog_rows > 0 && catching) deferred_row_seconds = backlog_seconds / double(backlog_rows);
      const double seconds = seconds_since(t_round) - backlog_seconds + (k == 0 ? deferred_row_seconds : 0.0);
      tuner.record(k_chosen, spec.round_seconds_for_tests ? spec.round_seconds_for_tests(k_chosen, emitted) : seconds,
                   emitted, /*drafts_judged=*/k == k_chosen && drafted == k && !stop);
    }
    if (speculate && spec.adaptive && drafted > 0) {
      window.emplace_back(drafted, accepted);
      if (int(window.size()) > spec.adaptive_window) window.erase(window.begin());
      int64_t dsum = 0, asum = 0;
      for (auto [dd, aa] : window) dsum += dd, asum += aa;
      const double rate = double(asum) / double(dsum);
      if (int(window.size()) >= std::min(spec.adaptive_window, 2)) {
        if (rate < spec.adaptive_threshold && k_cur > 0) {
          --k_cur;
          window.clear();
        } else if (rate >= spec.adaptive_threshold && k_cur < k_max && accepted == drafted) {
          ++k_cur;
        }
      }
    }
  }
  st.decode_seconds = seconds_since(t_decode);
  if (tuned) st.rounds_at_k = tuner.rounds();
  if (res.finish_reason.empty()) res.finish_reason = "length";
  return res;
}

}  // namespace nextn
