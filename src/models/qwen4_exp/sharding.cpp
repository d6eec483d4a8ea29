#include "models/qwen4_exp/sharding.h"

#include <numeric>
#include <string>

#include "core/error.h"

namespace nextn {

namespace {

// The rows [r0, r0 + n) of a [rows, width] float table (conv kernels, per-head vectors), copied.
std::vector<float> rows_of(const std::vector<float>& table, int64_t width, int64_t r0, int64_t n) {
  return std::vector<float>(table.begin() + r0 * width, table.begin() + (r0 + n) * width);
}

// Query heads [h0, h1) and KV heads of `rank`: whole KV groups while there are no more ranks than KV heads,
// else each KV group's query heads split over the ranks that share it.
void qsa_heads(const Qwen4ExpConfig& c, int64_t align, int rank, int ranks, Qwen4Shard& s) {
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, group = nh / nkv, hd = c.head_dim;
  if (ranks <= nkv) {
    s.kv_heads = split_units(nkv, group * hd, align, ranks)[size_t(rank)];
    s.heads = {s.kv_heads.begin * group, s.kv_heads.end * group};
    return;
  }
  const int64_t share = ranks / nkv;  // ranks per KV head
  if (ranks % nkv != 0 || group % share != 0)
    throw Error("--tensor-parallel " + std::to_string(ranks) + ": the " + std::to_string(nkv) + " KV heads of " +
                std::to_string(group) + " query heads each do not split over the ranks (more ranks than KV heads " +
                "must be a multiple of them that divides a group)");
  const int64_t per = group / share, kv = rank / share;
  s.kv_heads = {kv, kv + 1};
  s.heads = {kv * group + (rank % share) * per, kv * group + (rank % share + 1) * per};
  if (s.heads.begin * hd % align != 0)
    throw Error("--tensor-parallel " + std::to_string(ranks) + ": QSA heads of " + std::to_string(hd) +
                " columns do not split on o_proj's FP8 blocks of " + std::to_string(align));
}

void shard_gdn(const Qwen4ExpConfig& c, UnitRange kh, GdnWeights& g) {
  const int64_t dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
  const int64_t group = c.linear_num_value_heads / c.linear_num_key_heads, K = c.linear_conv_kernel_dim;
  const int64_t Kd = c.linear_key_dim(), n = kh.size(), v0 = kh.begin * group, nv = n * group;
  if (n == 0) {
    g.in_q = g.in_k = g.in_v = g.in_z = g.in_b = g.in_a = g.out_proj = Linear{};
    g.conv.clear();
    g.neg_A.clear();
    g.dt_bias.clear();
    return;
  }
  g.in_q = g.in_q.rows(kh.begin * dk, n * dk);
  g.in_k = g.in_k.rows(kh.begin * dk, n * dk);
  g.in_v = g.in_v.rows(v0 * dv, nv * dv);
  g.in_z = g.in_z.rows(v0 * dv, nv * dv);
  g.in_b = g.in_b.rows(v0, nv);
  g.in_a = g.in_a.rows(v0, nv);
  g.out_proj = g.out_proj.columns(v0 * dv, nv * dv);  // (GDN's out_proj has no bias)
  // conv channels: q, k, v of the whole model in that order; this rank's of each.
  std::vector<float> conv = rows_of(g.conv, K, kh.begin * dk, n * dk);
  const std::vector<float> k = rows_of(g.conv, K, Kd + kh.begin * dk, n * dk);
  const std::vector<float> v = rows_of(g.conv, K, 2 * Kd + v0 * dv, nv * dv);
  conv.insert(conv.end(), k.begin(), k.end());
  conv.insert(conv.end(), v.begin(), v.end());
  g.conv = std::move(conv);
  g.neg_A = rows_of(g.neg_A, 1, v0, nv);
  g.dt_bias = rows_of(g.dt_bias, 1, v0, nv);
}

void shard_qsa(const Qwen4ExpConfig& c, const Qwen4Shard& s, bool first_rank, QsaWeights& a) {
  const int64_t hd = c.head_dim, n = s.heads.size(), nkv = s.kv_heads.size();
  if (n == 0) {
    a.q_proj = a.k_proj = a.v_proj = a.o_proj = Linear{};
    return;
  }
  // (attention_bias: a row slice keeps its rows' bias; the bias vectors stay the whole model's, which own them)
  a.q_proj = a.q_proj.rows(s.heads.begin * 2 * hd, n * 2 * hd);
  a.k_proj = a.k_proj.rows(s.kv_heads.begin * hd, nkv * hd);
  a.v_proj = a.v_proj.rows(s.kv_heads.begin * hd, nkv * hd);
  const Linear o = a.o_proj;
  a.o_proj = o.columns(s.heads.begin * hd, n * hd);
  if (first_rank) a.o_proj.bias = o.bias;  // (added once, by rank 0)
}

void shard_moe(UnitRange experts, int rank, int ranks, MoeWeights& m) {
  if (m.shared_gate.out > 0) shard_swiglu(m.shared_gate, m.shared_up, m.shared_down, rank, ranks);
  for (size_t e = 0; e < m.gate.size(); ++e)
    if (int64_t(e) < experts.begin || int64_t(e) >= experts.end) m.gate[e] = m.up[e] = m.down[e] = Linear{};
}

}  // namespace

Qwen4Shard shard_qwen4_target(const Qwen4ExpConfig& c, const Qwen4ExpWeights& w, int rank, int ranks) {
  if (ranks < 1 || rank < 0 || rank >= ranks)
    throw Error("tensor parallel: rank " + std::to_string(rank) + " of " + std::to_string(ranks));
  Qwen4Shard s;
  s.rank = rank;
  s.ranks = ranks;
  int64_t gdn_align = 1, qsa_align = 1, shared_cols = 0;
  bool has_gdn = false, has_qsa = false;
  for (const Qwen4LayerWeights& L : w.layers) {
    if (L.kind == Qwen4LayerKind::Linear) {
      has_gdn = true;
      gdn_align = std::lcm(gdn_align, column_align(L.gdn.out_proj));
    } else {
      has_qsa = true;
      qsa_align = std::lcm(qsa_align, column_align(L.attn.o_proj));
    }
  }
  if (has_gdn && ranks > c.linear_num_key_heads)
    throw Error("--tensor-parallel " + std::to_string(ranks) + ": more ranks than the model's " +
                std::to_string(c.linear_num_key_heads) + " Gated DeltaNet key heads");
  const int64_t vgroup = c.linear_num_value_heads / c.linear_num_key_heads;
  s.key_heads = split_units(c.linear_num_key_heads, vgroup * c.linear_value_head_dim, gdn_align, ranks)[size_t(rank)];
  if (has_qsa) qsa_heads(c, qsa_align, rank, ranks, s);
  s.experts = split_units(c.num_experts, 1, 1, ranks)[size_t(rank)];
  s.vocab = split_units(c.vocab_size, 1, 1, ranks);
  s.config = c;
  s.config.linear_num_key_heads = static_cast<int>(s.key_heads.size());
  s.config.linear_num_value_heads = static_cast<int>(s.key_heads.size() * vgroup);
  if (has_qsa) {
    s.config.num_attention_heads = static_cast<int>(s.heads.size());
    s.config.num_key_value_heads = static_cast<int>(s.kv_heads.size());
  }
  Qwen4ExpWeights& t = s.weights;
  const UnitRange v = s.vocab[size_t(rank)];
  t.embed = w.embed.rows(v.begin, v.size());
  t.lm_head = w.lm_head.rows(v.begin, v.size());
  t.mixer = w.mixer;
  t.layers = w.layers;
  for (Qwen4LayerWeights& L : t.layers) {
    if (L.kind == Qwen4LayerKind::Linear)
      shard_gdn(c, s.key_heads, L.gdn);
    else
      shard_qsa(c, s, rank == 0, L.attn);
    shard_moe(s.experts, rank, ranks, L.moe);
    shared_cols = L.moe.shared_down.in;  // (this rank's features of the shared expert: the same in every layer)
  }
  s.config.shared_expert_intermediate_size = shared_cols;
  return s;
}

}  // namespace nextn
