// Tensor parallelism on the CPU (P12, docs/parallel.md): ranks as threads of this process (LocalGroup), each
// over its shard of the weights, driven by TensorParallelModel. What several GPUs will run, checked here where
// CI can: logits against transformers and against one rank, the exactness rules on a fixed rank count (decode
// steps equal to one forward bit for bit, sequences batched equal to each alone, greedy speculation equal to
// plain greedy), and errors that leave the group working or say why it stopped.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "core/error.h"
#include "core/threadpool.h"
#include "engine/generator.h"
#include "models/common/tensor_parallel.h"
#include "models/common/tensor_split.h"
#include "models/registry.h"
#include "ops/cuda/cuda_ops.h"
#include "test_util.h"

namespace nextn {
namespace {

using testing::compare;

TEST(TensorSplit, RangesCoverTheUnitsInRankOrderAtAlignedBoundaries) {
  for (int64_t units : {1, 4, 7, 96, 120832})
    for (int64_t cols : {1, 16, 96, 128})
      for (int64_t align : {1, 128})
        for (int ranks : {1, 2, 3, 4, 8}) {
          const auto r = split_units(units, cols, align, ranks);
          ASSERT_EQ(int(r.size()), ranks);
          int64_t next = 0, largest = 0, smallest = units;
          for (const UnitRange& u : r) {
            EXPECT_EQ(u.begin, next);
            EXPECT_GE(u.size(), 0);
            if (u.begin < units) {
              EXPECT_EQ(u.begin * cols % align, 0) << units << " " << cols << " " << align;
            }
            next = u.end;
            largest = std::max(largest, u.size());
            smallest = std::min(smallest, u.size());
          }
          EXPECT_EQ(next, units);
          const int64_t group = align / std::gcd(cols, align);
          EXPECT_LE(largest - smallest, group) << "as even as the alignment allows";
        }
  // 4 heads of 16 columns, 128-column FP8 blocks: all on the last rank (rank 0 also drafts); with 2 heads of
  // 128 columns, one each.
  EXPECT_EQ(split_units(4, 16, 128, 2)[0].size(), 0);
  EXPECT_EQ(split_units(4, 16, 128, 2)[1].size(), 4);
  EXPECT_EQ(split_units(2, 128, 128, 2)[1].size(), 1);
}

TEST(LinearColumns, RowParallelPartsAddUpToTheWholeProduct) {
  // A bf16 [3, 8] matrix: the products over columns [0, 4) and [4, 8) add up to the whole one's.
  std::vector<uint16_t> w(24);
  std::vector<float> wf(24);
  for (int i = 0; i < 24; ++i) {
    wf[size_t(i)] = float(i % 7) - 3.0f;
    uint32_t bits;
    std::memcpy(&bits, &wf[size_t(i)], 4);
    w[size_t(i)] = uint16_t(bits >> 16);  // (small integers: exact in bf16)
  }
  Linear l;
  l.dtype = DType::BF16;
  l.out = 3;
  l.in = 8;
  l.data = w.data();
  l.row_stride = 8;
  const float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  float whole[3], a[3], b[3];
  ops::matmul(nullptr, x, 1, l, whole);
  ops::matmul(nullptr, x, 1, l.columns(0, 4), a);
  ops::matmul(nullptr, x + 4, 1, l.columns(4, 4), b);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(a[r] + b[r], whole[r]);
  EXPECT_THROW(l.columns(6, 4), Error);
  // FP8: a slice must start a scale block.
  Linear f = l;
  f.dtype = DType::F8_E4M3;
  f.block_in = 4;
  EXPECT_NO_THROW(f.columns(4, 4));
  EXPECT_THROW(f.columns(2, 4), Error);
}

// A model of `ranks` tensor-parallel ranks (1: the plain model).
std::unique_ptr<Model> load(const std::string& dir, ThreadPool& pool, int ranks) {
  return load_model(dir, &pool, ranks);
}

struct Case {
  const char* fixture;  // under tests/fixtures
  int ranks;
  bool reference_exact;  // the reference holds fp32 logits to 1e-4 ("logits", or "logits_f32up" for bf16)
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.fixture << " on " << c.ranks << " ranks"; }

class TensorParallelParity : public ::testing::TestWithParam<Case> {
 protected:
  ThreadPool pool_{2};
};

TEST_P(TensorParallelParity, LogitsMatchTransformersAndOneRank) {
  const std::string dir = testing::fixture_path(GetParam().fixture);
  testing::Reference ref(dir);
  const auto prompt = ref.ids("input_ids");
  auto one = load(dir, pool_, 1);
  auto tp = load(dir, pool_, GetParam().ranks);
  ASSERT_GT(int64_t(prompt.size()), one->facts().sparse_budget) << "the prompt must cross the sparse window";
  const int64_t T = int64_t(prompt.size()), V = one->facts().vocab_size, H = one->facts().hidden_width;
  std::vector<float> l1, h1, lt, ht;
  testing::run_prompt(*one, prompt, l1, h1);
  testing::run_prompt(*tp, prompt, lt, ht);
  // Against one rank: the same math with the heads' and experts' partial sums added in another order.
  const auto d = compare(lt.data(), l1.data(), T, V);
  EXPECT_LE(d.rel(), 1e-4) << "max|Δ| " << d.max_abs << " max|ref| " << d.max_ref;
  EXPECT_EQ(d.argmax_mismatches, 0) << "first at row " << d.first_mismatch_row;
  const auto dh = compare(ht.data(), h1.data(), T, H);
  EXPECT_LE(dh.rel(), 1e-4) << "hidden max|Δ| " << dh.max_abs;
  // Against transformers, where the fixture has fp32 reference logits.
  const std::string name = ref.has("logits_f32up") ? "logits_f32up" : "logits";
  if (GetParam().reference_exact && ref.has(name)) {
    const auto r = ref.f32(name);
    const auto dr = compare(lt.data(), r.data(), T, V);
    EXPECT_LE(dr.rel(), 1e-4) << "vs transformers: max|Δ| " << dr.max_abs;
    EXPECT_EQ(dr.argmax_mismatches, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TensorParallelParity,
                         ::testing::Values(Case{"hy_v4/a_fp32", 2, true}, Case{"hy_v4/a_fp32", 3, true},
                                           Case{"hy_v4/a_fp32", 4, true}, Case{"hy_v4/b_fp32", 2, true},
                                           Case{"hy_v4/c_bf16", 2, true}, Case{"hy_v4/c_bf16", 3, true},
                                           Case{"hy_v4_fp8/fp8_bf16_mtp", 2, false},
                                           Case{"hy_v4_fp8/fp8_f32scale", 3, false},
                                           Case{"hy_v4_fp8/fp8_ue8m0", 2, false}, Case{"qwen4_exp/a_fp32", 2, true},
                                           Case{"qwen4_exp/b_fp32", 2, true}, Case{"qwen4_exp/d_fp8", 2, false}),
                         [](const auto& param_info) {
                           return testing::fixture_test_name(param_info.param.fixture) + "_" +
                                  std::to_string(param_info.param.ranks) + "_ranks";
                         });

std::vector<int32_t> random_prompt(int64_t len, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> p(static_cast<size_t>(len));
  for (auto& t : p) t = static_cast<int32_t>(3 + rng() % uint64_t(vocab - 3));
  return p;
}

TEST(TensorParallel, DecodeStepsEqualOneForwardBitForBit) {
  // The collectives add in rank order per element, whatever the rows: a row's logits do not depend on how many
  // rows share its forward, as on one rank (what lossless speculation stands on). Qwen4-Exp's steps also carry
  // each rank's share of the recurrent state from step to step.
  ThreadPool pool(2);
  for (const auto& [fixture, ranks] : {std::pair{"hy_v4/a_fp32", 3}, std::pair{"qwen4_exp/b_fp32", 2}}) {
    auto tp = load(testing::fixture_path(fixture), pool, ranks);
    const int64_t V = tp->facts().vocab_size, T = tp->facts().sparse_budget + 9;
    const auto prompt = random_prompt(T, V, 3);
    std::vector<float> whole, hidden;
    testing::run_prompt(*tp, prompt, whole, hidden);
    auto seq = tp->new_sequence(T);
    std::vector<float> step(size_t(3 * V));
    for (int64_t pos = 0; pos < T;) {
      const int64_t rows = std::min<int64_t>(1 + pos % 3, T - pos);  // steps of 1, 2 and 3 rows
      const BatchSegment seg{seq.get(), prompt.data() + pos, rows, true, nullptr};
      tp->forward(&seg, 1, step.data(), nullptr);
      ASSERT_EQ(0, std::memcmp(step.data(), whole.data() + pos * V, size_t(rows * V) * sizeof(float)))
          << fixture << " at " << pos;
      pos += rows;
    }
  }
}

TEST(TensorParallel, SequencesBatchedEqualEachAloneAndArgmaxRowsMatch) {
  ThreadPool pool(2);
  auto tp = load(testing::fixture_path("hy_v4/b_fp32"), pool, 2);
  const int64_t V = tp->facts().vocab_size;
  MemoryOptions mem;
  mem.kv_cache_bytes = int64_t(64) << 20;
  tp->configure_memory(mem);
  const std::vector<std::vector<int32_t>> prompts = {random_prompt(40, V, 1), random_prompt(7, V, 2),
                                                     random_prompt(90, V, 4)};
  std::vector<std::vector<float>> alone;
  for (const auto& p : prompts) {
    std::vector<float> l, h;
    testing::run_prompt(*tp, p, l, h);
    alone.push_back(l);
  }
  std::vector<std::unique_ptr<SequenceState>> seqs;
  std::vector<BatchSegment> segs;
  int64_t rows = 0;
  for (const auto& p : prompts) {
    seqs.push_back(tp->new_sequence(int64_t(p.size())));
    segs.push_back({seqs.back().get(), p.data(), int64_t(p.size()), true, nullptr});
    rows += int64_t(p.size());
  }
  std::vector<int32_t> argmax(size_t(prompts[1].size()));
  segs[1].argmax = argmax.data();
  std::vector<float> batched(size_t(rows * V));
  tp->forward(segs.data(), segs.size(), batched.data(), nullptr);
  int64_t row = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int64_t n = int64_t(prompts[i].size());
    if (i != 1) {
      EXPECT_EQ(0, std::memcmp(batched.data() + row * V, alone[i].data(), size_t(n * V) * sizeof(float))) << i;
    }
    row += n;
  }
  for (size_t r = 0; r < argmax.size(); ++r) {
    const float* l = alone[1].data() + r * V;
    EXPECT_EQ(argmax[r], std::max_element(l, l + V) - l) << r;
  }
}

TEST(TensorParallel, GreedyRowsComeAsIdsWithoutGatheringTheLogits) {
  // Steps whose every row is read as its argmax: each rank sends its part's best (value, id) per row, and the
  // logits buffer is never written (it keeps its NaNs); the ids are those of the whole rows.
  ThreadPool pool(2);
  for (const auto& [fixture, ranks] : {std::pair{"hy_v4/b_fp32", 3}, std::pair{"qwen4_exp/b_fp32", 2}}) {
    SCOPED_TRACE(fixture);
    auto tp = load(testing::fixture_path(fixture), pool, ranks);
    testing::expect_greedy_ids_without_logits(*tp, random_prompt(50, tp->facts().vocab_size, 11), 40);
  }
}

TEST(TensorParallel, RollbackThenTheSameTokensGiveTheSameLogits) {
  ThreadPool pool(2);
  for (const char* fixture : {"hy_v4/a_fp32", "qwen4_exp/a_fp32"}) {
    auto tp = load(testing::fixture_path(fixture), pool, 2);
    const int64_t V = tp->facts().vocab_size;
    const auto p = random_prompt(30, V, 5);
    auto seq = tp->new_sequence(40);
    std::vector<float> first(size_t(4 * V)), again(size_t(4 * V));
    BatchSegment seg{seq.get(), p.data(), 26, false, nullptr};
    tp->forward(&seg, 1, nullptr, nullptr);
    seg = {seq.get(), p.data() + 26, 4, true, nullptr};
    tp->forward(&seg, 1, first.data(), nullptr);
    seq->rollback(27);  // (three rows rejected: every rank forgets them, its KV rows and its state slots)
    EXPECT_EQ(seq->length(), 27);
    seg = {seq.get(), p.data() + 27, 3, true, nullptr};
    tp->forward(&seg, 1, again.data(), nullptr);
    EXPECT_EQ(0, std::memcmp(first.data() + V, again.data(), size_t(3 * V) * sizeof(float))) << fixture;
  }
}

TEST(TensorParallel, GreedySpeculationEqualsPlainGreedy) {
  ThreadPool pool(2);
  for (const char* fixture : {"hy_v4/a_fp32", "hy_v4/c_bf16", "qwen4_exp/a_fp32", "qwen4_exp/b_fp32"}) {
    auto tp = load(testing::fixture_path(fixture), pool, 2);
    const auto& f = tp->facts();
    ASSERT_GE(f.num_mtp_layers, 1);
    for (uint64_t seed : {1, 2, 3}) {
      const auto prompt = random_prompt(1 + int64_t(seed) * f.sparse_budget / 2, f.vocab_size, seed);
      SamplingParams sp;
      sp.max_tokens = int(f.sparse_budget) + 8;
      SpecOptions plain;
      plain.enabled = false;
      const auto ref = Generator(*tp).generate(prompt, sp, plain);
      for (int k : {1, 2, 3, 5}) {
        SpecOptions so;
        so.num_speculative_tokens = k;
        const auto got = Generator(*tp).generate(prompt, sp, so);
        EXPECT_EQ(got.ids, ref.ids) << fixture << " seed " << seed << " k " << k;
        EXPECT_GT(got.stats.num_draft_tokens, 0);
      }
    }
  }
}

TEST(TensorParallel, BadInputIsRefusedBeforeAnyRankStartsAndTheGroupGoesOn) {
  ThreadPool pool(2);
  auto tp = load(testing::fixture_path("hy_v4/a_fp32"), pool, 2);
  const int64_t V = tp->facts().vocab_size;
  auto seq = tp->new_sequence(8);
  const int32_t bad[2] = {1, int32_t(V)};
  BatchSegment seg{seq.get(), bad, 2, true, nullptr};
  std::vector<float> logits(size_t(9 * V));
  EXPECT_THROW(tp->forward(&seg, 1, logits.data(), nullptr), Error);
  const auto p = random_prompt(9, V, 8);
  seg = {seq.get(), p.data(), 9, true, nullptr};
  EXPECT_THROW(tp->forward(&seg, 1, logits.data(), nullptr), Error);  // (past the sequence's capacity)
  EXPECT_THROW(tp->new_sequence(tp->facts().context + 1), Error);
  // ... and the group still works.
  seg.rows = 8;
  EXPECT_NO_THROW(tp->forward(&seg, 1, logits.data(), nullptr));
  EXPECT_EQ(seq->length(), 8);
}

// A rank's model that fails on its own (as an allocation on one GPU would) once armed.
class FailingRank final : public Model {
 public:
  FailingRank(std::unique_ptr<Model> inner, const bool* armed) : inner_(std::move(inner)), armed_(armed) {}
  const ModelFacts& facts() const override { return inner_->facts(); }
  void prefault(bool progress) const override { inner_->prefault(progress); }
  void make_tensor_parallel_rank(Communicator& comm) override { inner_->make_tensor_parallel_rank(comm); }
  void check_tensor_parallel(int ranks) const override { inner_->check_tensor_parallel(ranks); }
  void configure_memory(const MemoryOptions& o) override { inner_->configure_memory(o); }
  bool can_admit(int64_t c, bool d) const override { return inner_->can_admit(c, d); }
  bool could_ever_admit(int64_t c, bool d) const override { return inner_->could_ever_admit(c, d); }
  std::string memory_summary() const override { return inner_->memory_summary(); }
  double kv_usage() const override { return inner_->kv_usage(); }
  std::unique_ptr<SequenceState> new_sequence(int64_t c) override { return inner_->new_sequence(c); }
  std::unique_ptr<DraftSession> new_draft_session(SequenceState& s, const DraftOptions& o) override {
    return inner_->new_draft_session(s, o);
  }
  void reserve_batch(int64_t r, int64_t p) override { inner_->reserve_batch(r, p); }
  void forward(const BatchSegment* s, size_t n, float* logits, float* hidden) override {
    if (*armed_) throw Error("a rank ran out of device memory");
    inner_->forward(s, n, logits, hidden);
  }
  void run_draft_rounds(DraftRound* const* r, size_t n) override { inner_->run_draft_rounds(r, n); }
  void prompt_draft_logits(const int32_t* t, int64_t T, const float* h, float* l) override {
    inner_->prompt_draft_logits(t, T, h, l);
  }
  size_t checkpoint_bytes() const override { return inner_->checkpoint_bytes(); }
  size_t weight_bytes_total() const override { return inner_->weight_bytes_total(); }
  size_t last_forward_weight_bytes() const override { return inner_->last_forward_weight_bytes(); }
  int64_t kv_bytes_per_position(bool d) const override { return inner_->kv_bytes_per_position(d); }
  int64_t memory_bytes_for(int64_t s, int64_t c, int64_t p) const override { return inner_->memory_bytes_for(s, c, p); }

 private:
  std::unique_ptr<Model> inner_;
  const bool* armed_;
};

TEST(TensorParallel, ARankThatFailsAloneStopsTheGroupWithItsErrorInsteadOfAHang) {
  ThreadPool pool(2);
  const std::string dir = testing::fixture_path("hy_v4/a_fp32");
  for (int failing : {0, 1, 2}) {
    bool armed = false;
    std::vector<std::unique_ptr<Model>> ranks;
    for (int r = 0; r < 3; ++r) {
      auto m = load_model(dir, &pool);
      ranks.push_back(r == failing ? std::make_unique<FailingRank>(std::move(m), &armed) : std::move(m));
    }
    TensorParallelModel tp(std::move(ranks));
    const int64_t V = tp.facts().vocab_size;
    const auto p = random_prompt(12, V, 9);
    auto seq = tp.new_sequence(12);
    std::vector<float> logits(size_t(12 * V));
    BatchSegment seg{seq.get(), p.data(), 6, true, nullptr};
    tp.forward(&seg, 1, logits.data(), nullptr);
    EXPECT_EQ(tp.failure(), "");
    armed = true;
    seg.tokens = p.data() + 6;
    try {
      tp.forward(&seg, 1, logits.data(), nullptr);
      ADD_FAILURE() << "rank " << failing << "'s failure went unnoticed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("ran out of device memory"), std::string::npos) << e.what();
    }
    try {
      tp.forward(&seg, 1, logits.data(), nullptr);
      ADD_FAILURE() << "a failed group went on";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("failed earlier: "), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("ran out of device memory"), std::string::npos) << e.what();
    }
    EXPECT_NE(tp.failure().find("ran out of device memory"), std::string::npos) << tp.failure();  // (/health)
    seq.reset();  // (dropping a sequence of a failed group is quiet)
  }
}

// The CLI starts ranks 1.. as this program again; run through an explicit dynamic loader (a packaged copy),
// /proc/self/exe is the loader, and the ranks need its options and the program too.
TEST(TensorParallel, RanksStartAsThisProgramDidUnderALoaderToo) {
  using V = std::vector<std::string>;
  EXPECT_EQ(rank_launcher("/usr/bin/nextn", V{"nextn", "generate"}), V{"/usr/bin/nextn"});
  const std::string ld = "/opt/x/lib/ld-linux-x86-64.so.2";
  EXPECT_EQ(rank_launcher(ld, V{ld, "--library-path", "/opt/x/lib", "/opt/x/nextn", "bench", "--json"}),
            (V{ld, "--library-path", "/opt/x/lib", "/opt/x/nextn"}));
  EXPECT_EQ(rank_launcher(ld, V{"ld.so", "--inhibit-cache", "--argv0", "nextn", "/opt/x/nextn", "serve"}),
            (V{ld, "--inhibit-cache", "--argv0", "nextn", "/opt/x/nextn"}));
  EXPECT_THROW(rank_launcher(ld, V{ld, "--library-path", "/opt/x/lib"}), Error);
}

TEST(TensorParallel, RefusesWhatItCannotShard) {
  ThreadPool pool(2);
  try {
    load(testing::fixture_path("hy_v4/a_fp32"), pool, 5);  // (4 heads)
    ADD_FAILURE() << "5 ranks over 4 heads";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attention heads"), std::string::npos) << e.what();
  }
  try {
    load(testing::fixture_path("qwen4_exp/a_fp32"), pool, 3);  // (2 Gated DeltaNet key heads)
    ADD_FAILURE() << "3 ranks over 2 GDN key heads";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Gated DeltaNet key heads"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load(testing::fixture_path("hy_v4/a_fp32"), pool, 0), Error);
}

// Moving the ranks to a device they cannot use is refused before anything reaches them: the group stays on the
// CPU and goes on (on a GPU machine both families' ranks do move: cuda_tensor_parallel_test).
TEST(TensorParallel, ADeviceTheRanksCannotUseIsRefusedAndTheGroupGoesOn) {
  std::string why;
  if (cuda::available(&why)) GTEST_SKIP() << "a usable GPU: the ranks move to it (cuda_tensor_parallel_test)";
  ThreadPool pool(2);
  for (const char* fixture : {"qwen4_exp/a_fp32", "hy_v4/a_fp32"}) {
    auto tp = load(testing::fixture_path(fixture), pool, 2);
    EXPECT_FALSE(tp->runs_on(Device::kCuda));
    try {
      tp->use_device(Device::kCuda);
      ADD_FAILURE() << fixture << ": moved to a device its ranks cannot use";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--device cuda"), std::string::npos) << e.what();
    }
    EXPECT_EQ(tp->device(), Device::kCpu);
    EXPECT_EQ(tp->failure(), "");
    std::vector<float> logits, hidden;
    testing::run_prompt(*tp, random_prompt(9, tp->facts().vocab_size, 4), logits, hidden);
    EXPECT_TRUE(std::all_of(logits.begin(), logits.end(), [](float v) { return std::isfinite(v); })) << fixture;
  }
}

}  // namespace
}  // namespace nextn
