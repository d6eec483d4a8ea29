// QSA's CUDA ops (cuda_sparse_attention.h: pool_block_keys, block_scores, expand_selection, sparse_gqa_attention;
// and cuda_nn.h's topk_rows over candidate counts, which picks the kept blocks) against host references written
// as models/qwen4_exp/cpu_blocks.cpp's qsa computes them, over paged caches: pools of pages of 5, 3 and 16 slots
// (sizes that do not divide the lengths), two pools shared by two sequences, pages in shuffled order, and a
// forward of a decode row, a verify of 4 rows, a prefill of 23 and rows of two more sequences. Values within
// 1e-5 relative (dot products: of their magnitude), selections and counts exact, and every row's bits those of a
// one-row call. Without a usable device every test reports itself skipped, saying why.
#include "ops/cuda/cuda_sparse_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ops/cuda/cuda_nn.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/cuda_test_util.h"
#include "ops/ops.h"

namespace nextn {
namespace {

using namespace cuda_test;

const int32_t* i32(const cuda::DeviceBuffer& b) { return static_cast<const int32_t*>(b.get()); }
int32_t* i32(cuda::DeviceBuffer& b) { return static_cast<int32_t*>(b.get()); }

// ---- paged caches

struct PoolSpec {
  int64_t page_tokens, pages;
};
struct CacheSpec {
  size_t pool;
  int64_t slots, base_position;  // (a cache's slot i holds position base_position + i)
};

// The caches of a forward's sequences on the device (RowCaches' span s is cache s): pools whose planes, of the
// given widths, hold random floats (every row distinct: a row read from the wrong page, plane or column changes
// the result), and for each cache pages of its pool taken in a shuffled order.
struct Caches {
  std::vector<PoolSpec> pools;
  std::vector<CacheSpec> caches;
  std::vector<int64_t> widths;
  std::vector<std::vector<int32_t>> pages;            // [cache] its page table
  std::vector<std::vector<std::vector<float>>> init;  // [pool][plane] the contents before the op
  std::vector<std::vector<cuda::DeviceBuffer>> dev;   // [pool][plane]
  std::vector<cuda::DeviceBuffer> plane_ptrs;         // [pool] the device addresses of its planes
  cuda::DeviceBuffer dtables, doffsets, dpage_tokens, dplanes;

  Caches(std::vector<PoolSpec> p, std::vector<CacheSpec> c, std::vector<int64_t> w, uint32_t seed)
      : pools(std::move(p)), caches(std::move(c)), widths(std::move(w)) {
    std::mt19937 rng(seed);
    std::vector<std::vector<int32_t>> free_pages(pools.size());
    for (size_t q = 0; q < pools.size(); ++q) {
      for (int64_t i = 0; i < pools[q].pages; ++i) free_pages[q].push_back(int32_t(i));
      std::shuffle(free_pages[q].begin(), free_pages[q].end(), rng);
      init.emplace_back();
      dev.emplace_back();
      std::vector<float*> ptrs;
      for (size_t pl = 0; pl < widths.size(); ++pl) {
        init[q].push_back(normal(size_t(pools[q].pages * pools[q].page_tokens * widths[pl]), uint32_t(rng())));
        dev[q].push_back(to_device(init[q][pl]));
        ptrs.push_back(dev[q][pl].f32());
      }
      plane_ptrs.push_back(to_device(ptrs));
    }
    std::vector<int32_t> tables, page_tokens;
    std::vector<int64_t> offsets;
    std::vector<float* const*> planes;
    for (const CacheSpec& cs : caches) {
      const int64_t pt = pools[cs.pool].page_tokens, n = (cs.slots + pt - 1) / pt;
      std::vector<int32_t>& avail = free_pages[cs.pool];
      if (int64_t(avail.size()) < n) throw std::runtime_error("test pools too small");
      pages.emplace_back(avail.end() - n, avail.end());
      avail.resize(avail.size() - size_t(n));
      offsets.push_back(int64_t(tables.size()));
      tables.insert(tables.end(), pages.back().begin(), pages.back().end());
      page_tokens.push_back(int32_t(pt));
      planes.push_back(static_cast<float* const*>(plane_ptrs[cs.pool].get()));
    }
    dtables = to_device(tables);
    doffsets = to_device(offsets);
    dpage_tokens = to_device(page_tokens);
    dplanes = to_device(planes);
  }
  int64_t physical(size_t cache, int64_t slot) const {
    const int64_t pt = pools[caches[cache].pool].page_tokens;
    return int64_t(pages[cache][size_t(slot / pt)]) * pt + slot % pt;
  }
  const float* row(size_t cache, size_t plane, int64_t slot) const {
    return init[caches[cache].pool][plane].data() + physical(cache, slot) * widths[plane];
  }
  void reset() {
    for (size_t q = 0; q < pools.size(); ++q)
      for (size_t pl = 0; pl < widths.size(); ++pl) dev[q][pl].upload(init[q][pl].data(), init[q][pl].size() * 4);
  }
  std::vector<float> plane_now(size_t pool, size_t plane) const {
    return to_host<float>(dev[pool][plane], init[pool][plane].size());
  }
};

// A forward's rows over the caches: rows[i] of cache `cache` at slot `slot`.
struct Row {
  size_t cache;
  int64_t slot;
};
struct Rows {
  std::vector<Row> rows;
  std::vector<int32_t> position;
  cuda::DeviceBuffer dspan, dslot, dposition;
  cuda::RowCaches rc;
  Rows(const Caches& c, std::vector<Row> r) : rows(std::move(r)) {
    std::vector<int32_t> span, slot;
    for (const Row& x : rows) {
      span.push_back(int32_t(x.cache));
      slot.push_back(int32_t(x.slot));
      position.push_back(int32_t(c.caches[x.cache].base_position + x.slot));
    }
    dspan = to_device(span), dslot = to_device(slot), dposition = to_device(position);
    rc.span = i32(dspan);
    rc.slot = i32(dslot);
    rc.position = i32(dposition);
    rc.table_offset = static_cast<const int64_t*>(c.doffsets.get());
    rc.page_tokens = i32(c.dpage_tokens);
    rc.tables = i32(c.dtables);
    rc.planes = static_cast<float* const* const*>(c.dplanes.get());
  }
  int64_t size() const { return int64_t(rows.size()); }
};

// The pools and caches of every test, and its forward: cache 0 decodes 1 row at slot 39, cache 1 (positions
// from 1000, a cache that starts past the sequence's start) verifies 4 rows at 60..63, cache 2 prefills 23 rows
// from slot 0, caches 3 and 4 have 2 and 5 rows. Caches 0 and 1 share pool 0 (pages of 5), caches 2 and 4
// pool 1 (pages of 3); cache 3 has pool 2 (pages of 16) to itself.
const std::vector<PoolSpec> kPools = {{5, 40}, {3, 30}, {16, 10}};
const std::vector<CacheSpec> kCaches = {{0, 40, 0}, {0, 64, 1000}, {1, 23, 0}, {2, 100, 7}, {1, 16, 0}};
std::vector<Row> forward_rows() {
  struct Span {
    size_t cache;
    int64_t slot0, rows;
  };
  std::vector<Row> rows;
  for (const Span& s : {Span{0, 39, 1}, Span{1, 60, 4}, Span{2, 0, 23}, Span{3, 98, 2}, Span{4, 11, 5}})
    for (int64_t i = 0; i < s.rows; ++i) rows.push_back({s.cache, s.slot0 + i});
  return rows;
}

std::vector<float> inv_freqs(int64_t rope_dim) {
  std::vector<float> f(size_t(rope_dim / 2));
  for (size_t i = 0; i < f.size(); ++i) f[i] = std::pow(10000.f, -2.f * float(i) / float(rope_dim));
  return f;
}

// ---- pool_block_keys

// cpu_blocks.cpp's pooled key of the block ending at `last`: the raw keys' sum in slot order over ratio, RMSNorm,
// RoPE ("rotate half" of the first rope_dim) at the block's first position.
std::vector<float> pooled_key(const Caches& c, size_t cache, size_t plane, int64_t last, int64_t dim, int64_t ratio,
                              const std::vector<float>& norm, float eps, int64_t rope_dim,
                              const std::vector<float>& inv_freq, float af, int64_t first_position) {
  std::vector<float> pooled(size_t(dim), 0.0f);
  for (int64_t t = last + 1 - ratio; t <= last; ++t) {
    const float* raw = c.row(cache, plane, t);
    for (int64_t d = 0; d < dim; ++d) pooled[size_t(d)] += raw[d];
  }
  for (float& v : pooled) v /= static_cast<float>(ratio);
  ops::rms_norm(pooled.data(), 1, dim, norm.data(), eps, pooled.data());
  const int64_t half = rope_dim / 2;
  std::vector<float> tab(size_t(2 * half));
  ops::rope_tables(inv_freq.data(), half, first_position, af, tab.data(), tab.data() + half);
  ops::rope_rotate_half(pooled.data(), 2 * half, tab.data(), tab.data() + half);
  return pooled;
}

// Every row of the forward whose slot completes a block gets the block's pooled key in the block's first slot,
// columns [dim, 2·dim) of the index plane (plane 1 here: plane 0 is another layer's, to be left alone); every
// other float of every plane keeps its bits. Index heads of Qwen4-Exp (128, RoPE on 64) and of the tiny fixture
// (16, RoPE on 8), blocks of 4 and 8 slots. Each completing row alone writes the bits the forward wrote.
TEST(CudaSparseAttention, PoolBlockKeysPoolTheBlocksTheRowsComplete) {
  NEXTN_SKIP_WITHOUT_CUDA();
  const float eps = 1e-6f, af = 1.3f;
  struct Shape {
    int64_t dim, rope_dim;
  };
  for (const Shape& sh : {Shape{128, 64}, Shape{16, 8}}) {
    for (int64_t ratio : {4, 8}) {
      const int64_t dim = sh.dim, W = 2 * dim;
      const std::string at = "dim " + std::to_string(dim) + " ratio " + std::to_string(ratio);
      Caches c(kPools, kCaches, {24, W}, 31);
      const Rows fwd(c, forward_rows());
      std::vector<int32_t> block_position;
      for (int64_t r = 0; r < fwd.size(); ++r) block_position.push_back(int32_t(fwd.position[size_t(r)] + 1 - ratio));
      const auto dblock_position = to_device(block_position);
      auto norm = normal(size_t(dim), 32, 0.2f);
      for (float& v : norm) v += 1.f;
      const auto inv_freq = inv_freqs(sh.rope_dim);
      const auto dnorm = to_device(norm), dfreq = to_device(inv_freq);
      cuda::pool_block_keys(fwd.rc, 1, fwd.size(), dim, ratio, dnorm.f32(), eps, sh.rope_dim, dfreq.f32(), af,
                            i32(dblock_position));
      // (pool, physical row) -> the pooled key it should hold
      std::map<std::pair<size_t, int64_t>, std::vector<float>> want;
      std::vector<int64_t> completing;
      for (int64_t r = 0; r < fwd.size(); ++r) {
        const Row& x = fwd.rows[size_t(r)];
        if ((x.slot + 1) % ratio != 0) continue;
        completing.push_back(r);
        const int64_t first = x.slot + 1 - ratio;
        want[{c.caches[x.cache].pool, c.physical(x.cache, first)}] = pooled_key(
            c, x.cache, 1, x.slot, dim, ratio, norm, eps, sh.rope_dim, inv_freq, af, block_position[size_t(r)]);
      }
      ASSERT_GE(completing.size(), 5u) << at;  // (blocks completed in 4 or 5 caches, 2 in one sequence)
      std::vector<std::vector<float>> batch;  // [pool] plane 1 after the forward
      for (size_t q = 0; q < c.pools.size(); ++q) {
        EXPECT_TRUE(same_bits(c.plane_now(q, 0).data(), c.init[q][0].data(), c.init[q][0].size()))
            << at << " pool " << q << ": plane 0 was written";
        batch.push_back(c.plane_now(q, 1));
        const std::vector<float>& before = c.init[q][1];
        for (int64_t p = 0; p < c.pools[q].pages * c.pools[q].page_tokens; ++p) {
          const float* got = batch[q].data() + p * W;
          const auto it = want.find({q, p});
          const std::string where = at + " pool " + std::to_string(q) + " physical row " + std::to_string(p);
          if (it == want.end()) {
            ASSERT_TRUE(same_bits(got, before.data() + p * W, size_t(W))) << where << ": written, not a block's";
            continue;
          }
          EXPECT_TRUE(same_bits(got, before.data() + p * W, size_t(dim))) << where << ": its raw key was written";
          EXPECT_TRUE(near_all(got + dim, it->second.data(), size_t(dim), 1e-5)) << where;
        }
      }
      for (int64_t r : completing) {  // each completing row alone
        const Row& x = fwd.rows[size_t(r)];
        c.reset();
        const Rows one(c, {x});
        const auto dpos = to_device(std::vector<int32_t>{block_position[size_t(r)]});
        cuda::pool_block_keys(one.rc, 1, 1, dim, ratio, dnorm.f32(), eps, sh.rope_dim, dfreq.f32(), af, i32(dpos));
        const size_t q = c.caches[x.cache].pool;
        const int64_t p = c.physical(x.cache, x.slot + 1 - ratio);
        EXPECT_TRUE(same_bits(c.plane_now(q, 1).data() + p * W, batch[q].data() + p * W, size_t(W)))
            << at << " row " << r << " alone";
      }
    }
  }
}

// ---- block_scores

// Every complete block of each row scored as cpu_blocks.cpp's qsa does, scale · Σ_h relu(q_h · pooled_b), within
// 1e-5 of the terms' magnitude scale · Σ_h Σ |q_h,e · pooled_b,e| (the sums may run in another order); q rows
// strided as the indexer's projection leaves them (the heads, then the raw key). max_blocks is exactly the most
// blocks a row has. Each row alone gets the bits it got in the forward.
TEST(CudaSparseAttention, BlockScoresScoreEveryCompleteBlock) {
  NEXTN_SKIP_WITHOUT_CUDA();
  struct Shape {
    int64_t heads, dim;
  };
  const int64_t ratio = 4;
  for (const Shape& sh : {Shape{4, 16}, Shape{16, 128}}) {
    const int64_t heads = sh.heads, dim = sh.dim, q_stride = (heads + 1) * dim;
    const std::string at = "heads " + std::to_string(heads) + " dim " + std::to_string(dim);
    Caches c(kPools, kCaches, {2 * dim, 2 * dim}, 41);
    const Rows fwd(c, forward_rows());
    int64_t max_blocks = 0;
    for (const Row& x : fwd.rows) max_blocks = std::max(max_blocks, (x.slot + 1) / ratio);
    const int64_t out_stride = max_blocks + 3;
    const auto q = normal(size_t(fwd.size() * q_stride), 42);
    const auto dq = to_device(q);
    const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
    cuda::DeviceBuffer dout(size_t(fwd.size() * out_stride) * 4);
    cuda::block_scores(dq.f32(), q_stride, fwd.size(), heads, dim, fwd.rc, 1, ratio, max_blocks, scale, dout.f32(),
                       out_stride);
    const auto got = to_host<float>(dout, size_t(fwd.size() * out_stride));
    for (int64_t r = 0; r < fwd.size(); ++r) {
      const Row& x = fwd.rows[size_t(r)];
      const int64_t nb = (x.slot + 1) / ratio;
      for (int64_t b = 0; b < nb; ++b) {
        const float* pooled = c.row(x.cache, 1, b * ratio) + dim;
        float acc = 0;
        double mag = 0;
        for (int64_t h = 0; h < heads; ++h) {
          const float* qh = q.data() + r * q_stride + h * dim;
          float dot = 0;
          for (int64_t e = 0; e < dim; ++e) dot += qh[e] * pooled[e], mag += std::fabs(double(qh[e]) * pooled[e]);
          acc += std::max(dot, 0.0f);
        }
        const float want = acc * scale;
        ASSERT_NEAR(got[size_t(r * out_stride + b)], want, 1e-5 * (1 + mag * scale))
            << at << " row " << r << " block " << b;
      }
      const Rows one(c, {x});
      cuda::DeviceBuffer done(size_t(out_stride) * 4);
      cuda::block_scores(dq.f32() + r * q_stride, q_stride, 1, heads, dim, one.rc, 1, ratio, nb, scale, done.f32(),
                         out_stride);
      if (nb > 0) {
        EXPECT_TRUE(same_bits(to_host<float>(done, size_t(nb)).data(), got.data() + r * out_stride, size_t(nb)))
            << at << " row " << r << " alone";
      }
    }
  }
}

// ---- topk_rows over candidates

// The kept blocks: the host's top-k (ops::topk_ascending) of each row's first candidates[r] scores, ties (many:
// integer scores on some rows) to the lower index, for k below, at and above the candidates; 0 candidates give
// none, and the scores past a row's candidates (huge here) are never taken.
TEST(CudaSparseAttention, TopkRowsOverCandidatesPicksTheHostsBlocksTiesIncluded) {
  NEXTN_SKIP_WITHOUT_CUDA();
  const int64_t rows = 40, stride = 700;
  std::mt19937 rng(5);
  std::vector<float> scores(size_t(rows * stride), 1e30f);
  std::vector<int32_t> candidates(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    candidates[size_t(r)] = r == 0 ? 0 : r == 1 ? int32_t(stride) : int32_t(r * 17 % stride);
    for (int64_t j = 0; j < candidates[size_t(r)]; ++j)
      scores[size_t(r * stride + j)] = r % 3 == 0 ? float(int(rng() % 5)) - 1.f : std::ldexp(float(rng() % 1000), -7);
  }
  const auto ds = to_device(scores), dc = to_device(candidates);
  for (int64_t k : {1, 3, 7, 64, 300, 700}) {
    cuda::DeviceBuffer dtopk(size_t(rows * k) * 4), dcount(size_t(rows) * 4);
    cuda::topk_rows(ds.f32(), rows, stride, i32(dc), k, i32(dtopk), i32(dcount));
    const auto topk = to_host<int32_t>(dtopk, size_t(rows * k));
    const auto count = to_host<int32_t>(dcount, size_t(rows));
    std::vector<float> scratch(static_cast<size_t>(stride));
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<int32_t> want(static_cast<size_t>(k));
      const int64_t n = ops::topk_ascending(scores.data() + r * stride, candidates[size_t(r)], k, want.data(),
                                            scratch.data());
      ASSERT_EQ(count[size_t(r)], n) << "row " << r << " k " << k;
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(topk[size_t(r * k + i)], want[size_t(i)]) << "row " << r << " k " << k;
    }
  }
}

// ---- expand_selection

// cpu_blocks.cpp's selection of a row (the loop in qsa's row_task), capped at cap slots as its sel_cap caps it:
// forced (forced_count >= 0), the forced slots <= slot and < from, then from .. slot; else each kept block's
// ratio slots, then the slots after the last complete block.
std::vector<int32_t> want_selection(int64_t slot, int64_t ratio, const int32_t* blocks, int64_t block_count,
                                    const int32_t* forced, int64_t forced_count, int64_t from, int64_t cap) {
  std::vector<int32_t> sel;
  auto add = [&](int64_t s) {
    if (int64_t(sel.size()) < cap) sel.push_back(int32_t(s));
  };
  if (forced_count >= 0) {
    for (int64_t j = 0; j < forced_count; ++j)
      if (forced[j] <= slot && forced[j] < from) add(forced[j]);
    for (int64_t t = from; t <= slot; ++t) add(t);
    return sel;
  }
  for (int64_t b = 0; b < block_count; ++b)
    for (int64_t i = 0; i < ratio; ++i) add(blocks[b] * ratio + i);
  for (int64_t t = (slot + 1) / ratio * ratio; t <= slot; ++t) add(t);
  return sel;
}

// The forward's rows, each keeping up to 3 blocks (all of them when it has no more: the top-k then keeps them
// all) listed ascending, padded with stale values past the count. The verify's rows are forced (step 0's
// selection, with slots past the row and past forced_from that the forced part must skip, then the tail from
// forced_from: none for its first row), the 2 rows of cache 3 forced with no forced slots (the tail alone); the
// others not. Then again with forced null: every row from its blocks. Counts and slots exact.
TEST(CudaSparseAttention, ExpandSelectionListsTheKeptBlocksThenTheTail) {
  NEXTN_SKIP_WITHOUT_CUDA();
  const int64_t keep = 3, blocks_stride = keep + 2, forced_stride = 7;
  const std::vector<int32_t> verify_forced = {2, 9, 30, 61, 62, 70};
  for (int64_t ratio : {4, 8}) {
    const std::string at = "ratio " + std::to_string(ratio);
    const int64_t sel_stride = keep * ratio + ratio - 1 + 1;  // (the most a row selects, and one to spare)
    Caches c(kPools, kCaches, {4}, 51);
    const Rows fwd(c, forward_rows());
    const int64_t rows = fwd.size();
    std::mt19937 rng(52);
    std::vector<int32_t> blocks(size_t(rows * blocks_stride), -7), block_count(static_cast<size_t>(rows));
    std::vector<int32_t> forced(size_t(rows * forced_stride), -5), forced_count(size_t(rows), -1),
        forced_from(size_t(rows), 0);
    for (int64_t r = 0; r < rows; ++r) {
      const Row& x = fwd.rows[size_t(r)];
      const int64_t nb = (x.slot + 1) / ratio;
      std::vector<int32_t> all;
      for (int64_t b = 0; b < nb; ++b) all.push_back(int32_t(b));
      std::shuffle(all.begin(), all.end(), rng);
      all.resize(size_t(std::min(nb, keep)));
      std::sort(all.begin(), all.end());
      block_count[size_t(r)] = int32_t(all.size());
      std::copy(all.begin(), all.end(), blocks.begin() + r * blocks_stride);
      if (x.cache == 1) {
        forced_count[size_t(r)] = int32_t(verify_forced.size());
        std::copy(verify_forced.begin(), verify_forced.end(), forced.begin() + r * forced_stride);
        forced_from[size_t(r)] = 61;
      } else if (x.cache == 3) {
        forced_count[size_t(r)] = 0;
        forced_from[size_t(r)] = 98;
      } else {
        forced_from[size_t(r)] = int32_t(x.slot + 1);  // (unread: forced_count is -1)
      }
    }
    const auto db = to_device(blocks), dbc = to_device(block_count), df = to_device(forced),
               dfc = to_device(forced_count), dff = to_device(forced_from);
    for (bool with_forced : {true, false}) {
      cuda::DeviceBuffer dsel(size_t(rows * sel_stride) * 4), dcount(size_t(rows) * 4);
      cuda::expand_selection(fwd.rc, rows, ratio, i32(db), i32(dbc), blocks_stride, with_forced ? i32(df) : nullptr,
                             with_forced ? i32(dfc) : nullptr, with_forced ? i32(dff) : nullptr, forced_stride,
                             i32(dsel), i32(dcount), sel_stride);
      const auto sel = to_host<int32_t>(dsel, size_t(rows * sel_stride));
      const auto count = to_host<int32_t>(dcount, size_t(rows));
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t fc = with_forced ? forced_count[size_t(r)] : -1;
        const auto want = want_selection(fwd.rows[size_t(r)].slot, ratio, blocks.data() + r * blocks_stride,
                                         block_count[size_t(r)], forced.data() + r * forced_stride, fc,
                                         forced_from[size_t(r)], sel_stride);
        ASSERT_LT(int64_t(want.size()), sel_stride) << at << " row " << r;  // (the cap is the next test's)
        const std::vector<int32_t> got(sel.begin() + r * sel_stride, sel.begin() + r * sel_stride + count[size_t(r)]);
        EXPECT_EQ(got, want) << at << (with_forced ? "" : ", forced null,") << " row " << r << " (cache "
                             << fwd.rows[size_t(r)].cache << ", slot " << fwd.rows[size_t(r)].slot << ")";
      }
    }
  }
}

// "at most sel_stride of them": a forced row whose selection runs past sel_stride keeps its first sel_stride
// slots (as the CPU's sel_cap stops its loops), and the next row's entries are its own.
TEST(CudaSparseAttention, ExpandSelectionKeepsAtMostSelStrideSlots) {
  NEXTN_SKIP_WITHOUT_CUDA();
  const int64_t ratio = 4, sel_stride = 16, forced_stride = 5;
  Caches c(kPools, kCaches, {4}, 61);
  const Rows fwd(c, {{0, 39}, {2, 22}, {4, 15}});
  const std::vector<int32_t> forced = {1, 5, 9, 12, 40, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  const std::vector<int32_t> forced_count = {5, 0, -1}, forced_from = {10, 0, 16};
  const std::vector<int32_t> blocks = {-7, -7, -7, -7, -7, -7, 0, 2, 3}, block_count = {0, 0, 3};
  const auto db = to_device(blocks), dbc = to_device(block_count), df = to_device(forced),
             dfc = to_device(forced_count), dff = to_device(forced_from);
  cuda::DeviceBuffer dsel(size_t(3 * sel_stride) * 4), dcount(3 * 4);
  cuda::expand_selection(fwd.rc, 3, ratio, i32(db), i32(dbc), 3, i32(df), i32(dfc), i32(dff), forced_stride,
                         i32(dsel), i32(dcount), sel_stride);
  const auto sel = to_host<int32_t>(dsel, size_t(3 * sel_stride));
  const auto count = to_host<int32_t>(dcount, 3);
  for (int64_t r = 0; r < 3; ++r) {
    const auto want = want_selection(fwd.rows[size_t(r)].slot, ratio, blocks.data() + r * 3, block_count[size_t(r)],
                                     forced.data() + r * forced_stride, forced_count[size_t(r)],
                                     forced_from[size_t(r)], sel_stride);
    const std::vector<int32_t> got(sel.begin() + r * sel_stride, sel.begin() + r * sel_stride + count[size_t(r)]);
    EXPECT_EQ(got, want) << "row " << r;
  }
  EXPECT_EQ(count[0], sel_stride);  // 1, 5, 9, then 10 .. 22 of 10 .. 39
  EXPECT_EQ(count[1], sel_stride);  // 0 .. 15 of 0 .. 22
}

// ---- sparse_gqa_attention

// cpu_blocks.cpp's attention of one (row, head) over its selected slots: scores q·k as gathered_dots gives them,
// softmax_scaled (max, exp, sum, times the inverse), the probabilities' weighted sum of the values in selection
// order, times sigmoid(gate).
void attention_reference(const float* qh, const float* gate, const Caches& c, size_t cache, int64_t kv_head,
                         int64_t kv_heads, int64_t hd, const int32_t* sel, int64_t n, float scale, float* out) {
  std::vector<float> p(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    const float* k = c.row(cache, 0, sel[j]) + kv_head * hd;
    float dot = 0;
    for (int64_t e = 0; e < hd; ++e) dot += qh[e] * k[e];
    p[size_t(j)] = dot;
  }
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) m = std::max(m, p[size_t(j)] * scale);
  float sum = 0;
  for (int64_t j = 0; j < n; ++j) p[size_t(j)] = std::exp(p[size_t(j)] * scale - m), sum += p[size_t(j)];
  const float inv = 1.0f / sum;
  for (float& v : p) v *= inv;
  std::fill(out, out + hd, 0.0f);
  for (int64_t j = 0; j < n; ++j) {
    const float* v = c.row(cache, 0, sel[j]) + (kv_heads + kv_head) * hd;
    for (int64_t e = 0; e < hd; ++e) out[e] += p[size_t(j)] * v[e];
  }
  ops::mul_sigmoid(out, gate, hd, out);
}

// Each row's heads over a selection of its slots (1 up to 48: the row's own slot and others drawn at random,
// ascending; all of a short prefix's slots for some rows), the KV plane holding [k of every KV head | v of every
// KV head] per slot as cpu_blocks.cpp's cache rows do; past each row's count the selection holds slot 0 again (a
// kernel that read past the count would change the row). Head shapes of the tiny fixture (4 heads over 2 KV
// heads of 16), of Qwen4-Exp (16 over 2 of 256) and 6 over 3 of 64. Within 1e-5 · (1 + |want|); each row alone
// gets the bits it got in the forward.
TEST(CudaSparseAttention, SparseGqaAttentionAttendsOverTheSelectedSlots) {
  NEXTN_SKIP_WITHOUT_CUDA();
  struct Shape {
    int64_t heads, kv_heads, hd;
  };
  const int64_t sel_stride = 48;
  for (const Shape& sh : {Shape{4, 2, 16}, Shape{16, 2, 256}, Shape{6, 3, 64}}) {
    const int64_t heads = sh.heads, kvh = sh.kv_heads, hd = sh.hd, group = heads / kvh;
    const std::string at = "heads " + std::to_string(heads) + " kv heads " + std::to_string(kvh) + " hd " +
                           std::to_string(hd);
    Caches c(kPools, kCaches, {2 * kvh * hd, 8}, 71);
    const Rows fwd(c, forward_rows());
    const int64_t rows = fwd.size();
    std::mt19937 rng(72);
    std::vector<int32_t> sel(size_t(rows * sel_stride), 0), count(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t slot = fwd.rows[size_t(r)].slot;
      std::vector<int32_t> all;
      for (int64_t s = 0; s < slot; ++s) all.push_back(int32_t(s));
      std::shuffle(all.begin(), all.end(), rng);
      const int64_t n = slot < 8 ? slot + 1 : 1 + int64_t(rng() % uint32_t(std::min<int64_t>(slot, sel_stride - 1)));
      all.resize(size_t(n - 1));
      all.push_back(int32_t(slot));
      std::sort(all.begin(), all.end());
      count[size_t(r)] = int32_t(n);
      std::copy(all.begin(), all.end(), sel.begin() + r * sel_stride);
    }
    const auto q = normal(size_t(rows * heads * 2 * hd), 73);
    const auto dq = to_device(q), dsel = to_device(sel), dcount = to_device(count);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    cuda::DeviceBuffer dout(size_t(rows * heads * hd) * 4);
    cuda::sparse_gqa_attention(dq.f32(), rows, heads, kvh, hd, fwd.rc, 0, i32(dsel), i32(dcount), sel_stride, scale,
                               dout.f32());
    const auto got = to_host<float>(dout, size_t(rows * heads * hd));
    std::vector<float> want(static_cast<size_t>(hd));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t h = 0; h < heads; ++h) {
        const float* qh = q.data() + (r * heads + h) * 2 * hd;
        attention_reference(qh, qh + hd, c, fwd.rows[size_t(r)].cache, h / group, kvh, hd, sel.data() + r * sel_stride,
                            count[size_t(r)], scale, want.data());
        EXPECT_TRUE(near_all(got.data() + (r * heads + h) * hd, want.data(), size_t(hd), 1e-5))
            << at << " row " << r << " head " << h << " (" << count[size_t(r)] << " slots)";
      }
      const Rows one(c, {fwd.rows[size_t(r)]});
      cuda::DeviceBuffer done(size_t(heads * hd) * 4);
      cuda::sparse_gqa_attention(dq.f32() + r * heads * 2 * hd, 1, heads, kvh, hd, one.rc, 0,
                                 i32(dsel) + r * sel_stride, i32(dcount) + r, sel_stride, scale, done.f32());
      EXPECT_TRUE(same_bits(to_host<float>(done, size_t(heads * hd)).data(), got.data() + r * heads * hd,
                            size_t(heads * hd)))
          << at << " row " << r << " alone";
    }
  }
}

}  // namespace
}  // namespace nextn
