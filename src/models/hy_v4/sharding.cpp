#include "models/hy_v4/sharding.h"

#include <numeric>
#include <string>

#include "core/error.h"

namespace nextn {

namespace {

void shard_attention(const HYV4Config& c, UnitRange heads, bool first_rank, AttentionWeights& a) {
  const int64_t qkd = c.qk_head_dim, nope = c.qk_nope_head_dim, vd = c.v_head_dim, n = heads.size();
  a.sinks.assign(a.sinks.begin() + heads.begin, a.sinks.begin() + heads.end);
  if (n == 0) {  // a rank without heads computes no attention (its part of the sum is zero)
    a.q_b_proj = a.kv_b_proj = a.o_proj = a.gate_proj = Linear{};
    return;
  }
  a.q_b_proj = a.q_b_proj.rows(heads.begin * qkd, n * qkd);
  a.kv_b_proj = a.kv_b_proj.rows(heads.begin * (nope + vd), n * (nope + vd));
  a.gate_proj = a.gate_proj.rows(heads.begin * vd, n * vd);
  const Linear o = a.o_proj;
  a.o_proj = o.columns(heads.begin * vd, n * vd);
  if (first_rank) a.o_proj.bias = o.bias;  // (added once, by rank 0)
}

void shard_ffn(UnitRange experts, int rank, int ranks, FfnWeights& f) {
  if (f.gate_proj.out > 0) {  // the dense MLP, or the shared experts
    shard_swiglu(f.gate_proj, f.up_proj, f.down_proj, rank, ranks);
    if (f.has_shared) f.has_shared = f.gate_proj.out > 0;
  }
  if (!f.sparse) return;
  for (size_t e = 0; e < f.expert_gate.size(); ++e)
    if (int64_t(e) < experts.begin || int64_t(e) >= experts.end)
      f.expert_gate[e] = f.expert_up[e] = f.expert_down[e] = Linear{};  // (another rank's)
}

}  // namespace

HYV4Shard shard_target(const HYV4Config& c, const HYV4Weights& w, int rank, int ranks) {
  if (ranks < 1 || rank < 0 || rank >= ranks)
    throw Error("tensor parallel: rank " + std::to_string(rank) + " of " + std::to_string(ranks));
  if (ranks > c.num_attention_heads)
    throw Error("--tensor-parallel " + std::to_string(ranks) + ": more ranks than the model's " +
                std::to_string(c.num_attention_heads) + " attention heads");
  HYV4Shard s;
  s.rank = rank;
  s.ranks = ranks;
  // Heads split where every layer's o_proj may be cut (FP8: at its scale blocks).
  int64_t align = 1;
  for (const DecoderLayerWeights& L : w.layers) align = std::lcm(align, column_align(L.attn.o_proj));
  s.heads = split_units(c.num_attention_heads, c.v_head_dim, align, ranks)[size_t(rank)];
  s.experts = split_units(c.n_routed_experts, 1, 1, ranks)[size_t(rank)];
  s.vocab = split_units(c.vocab_size, 1, 1, ranks);
  s.config = c;
  s.config.num_attention_heads = static_cast<int>(s.heads.size());
  s.config.num_key_value_heads = s.config.num_attention_heads;

  HYV4Weights& t = s.weights;
  const UnitRange v = s.vocab[size_t(rank)];
  t.embed = w.embed.rows(v.begin, v.size());
  t.lm_head = w.lm_head.rows(v.begin, v.size());
  t.hc_head_fn = w.hc_head_fn;
  t.hc_head_base = w.hc_head_base;
  t.hc_head_scale = w.hc_head_scale;
  t.final_norm = w.final_norm;
  t.layers = w.layers;
  for (DecoderLayerWeights& L : t.layers) {
    shard_attention(c, s.heads, rank == 0, L.attn);
    shard_ffn(s.experts, rank, ranks, L.ffn);
  }
  return s;
}

}  // namespace nextn
