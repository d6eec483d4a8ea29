// Tensor-parallel ranks on GPUs (docs/parallel.md, P12): HY V4's and Qwen4-Exp's shards on the CUDA backend,
// their collectives on device memory. On one GPU the ranks share it and exchange rows through host memory (the
// host-staged form); with a GPU per rank and NCCL, over NCCL. Either way: logits within the fixtures' tolerance of one
// GPU (fp32: 1e-4 relative; the ranks' partial sums are added in another order), identical argmax, greedy
// speculation equal to plain greedy on the same ranks, decode steps bit-identical to one forward over the same
// rows, and the kernels the ranks add (the rank-ordered sum, compact column slices) against the CPU.
// Without a usable GPU every test reports itself skipped, with the reason.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "core/communicator.h"
#include "core/threadpool.h"
#include "engine/generator.h"
#include "models/registry.h"
#include "ops/cuda/cuda_collectives.h"
#include "ops/cuda/cuda_nn.h"
#include "ops/cuda/cuda_test_util.h"
#include "test_util.h"

namespace nextn {
namespace {

using testing::compare;

std::vector<int32_t> random_prompt(int64_t len, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> p(static_cast<size_t>(len));
  for (auto& t : p) t = static_cast<int32_t>(3 + rng() % uint64_t(vocab - 3));
  return p;
}

// `ranks` ranks (1: the plain model) of the checkpoint in dir, on the GPU.
std::unique_ptr<Model> load_on_gpu(const std::string& dir, ThreadPool& pool, int ranks) {
  auto m = load_model(dir, &pool, ranks);
  m->use_device(Device::kCuda);
  EXPECT_EQ(m->device(), Device::kCuda);
  return m;
}

TEST(CudaTensorParallel, SumRanksAddsInRankOrderAsTheCpuDoes) {
  NEXTN_SKIP_WITHOUT_CUDA();
  const int ranks = 3;
  const int64_t count = 1000;
  const auto parts = cuda_test::normal(size_t(ranks * count), 5);
  auto dev = cuda_test::to_device(parts);
  cuda::DeviceBuffer out(size_t(count) * sizeof(float));
  cuda::sum_ranks(dev.f32(), ranks, count, out.f32());
  std::vector<float> got(static_cast<size_t>(count));
  out.download(got.data(), got.size() * sizeof(float));
  for (int64_t i = 0; i < count; ++i) {
    float want = parts[size_t(i)];
    for (int r = 1; r < ranks; ++r) want += parts[size_t(r * count + i)];
    ASSERT_EQ(got[size_t(i)], want) << i;
  }
}

TEST(CudaTensorParallel, ColumnSlicesUploadCompactAndMultiplyAsOnTheCpu) {
  NEXTN_SKIP_WITHOUT_CUDA();
  // An FP8 matrix of 6 scale blocks of columns, cut after its second: the slice's rows and scale columns only.
  const int64_t out = 40, in = 6 * 32, M = 3;
  std::vector<uint8_t> w(size_t(out * in));
  std::mt19937 rng(3);
  for (auto& b : w) b = uint8_t(rng() % 0x78);  // (finite E4M3 values of either sign below 0x78 | sign)
  for (size_t i = 0; i < w.size(); i += 3) w[i] |= 0x80;
  const auto scales = cuda_test::normal(size_t((out + 31) / 32 * 6), 4, 0.1f);
  Linear whole;
  whole.dtype = DType::F8_E4M3;
  whole.out = out;
  whole.in = in;
  whole.row_stride = in;
  whole.data = w.data();
  whole.scale = scales.data();
  whole.block_out = whole.block_in = 32;
  whole.scale_cols = 6;
  const Linear part = whole.columns(64, 96);
  const auto x = cuda_test::normal(size_t(M * 96), 6);
  std::vector<float> want(size_t(M * out));
  ops::matmul(nullptr, x.data(), M, part, want.data());
  const cuda::DeviceLinear d = cuda::upload(part);
  EXPECT_EQ(d.w.row_stride, 96);
  EXPECT_EQ(d.w.scale_cols, 3);
  EXPECT_EQ(d.data.bytes(), size_t(out * 96));
  auto dx = cuda_test::to_device(x);
  cuda::DeviceBuffer dy(want.size() * sizeof(float));
  cuda::matmul(dx.f32(), M, d.w, dy.f32());
  std::vector<float> got(want.size());
  dy.download(got.data(), got.size() * sizeof(float));
  const auto diff = compare(got.data(), want.data(), M, out);
  EXPECT_LE(diff.rel(), 1e-4) << "max|Δ| " << diff.max_abs;  // (the FP8 path splits x in f16 halves)
}

struct Case {
  const char* fixture;  // under tests/fixtures
  int ranks;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.fixture << " on " << c.ranks << " ranks"; }

class CudaTensorParallelParity : public ::testing::TestWithParam<Case> {
 protected:
  ThreadPool pool_{2};
};

TEST_P(CudaTensorParallelParity, LogitsMatchOneGpu) {
  NEXTN_SKIP_WITHOUT_CUDA();
  const std::string dir = testing::fixture_path(GetParam().fixture);
  auto one = load_on_gpu(dir, pool_, 1);
  auto tp = load_on_gpu(dir, pool_, GetParam().ranks);
  const auto& f = one->facts();
  const auto prompt = random_prompt(2 * f.sparse_budget + 7, f.vocab_size, 17);  // (across the sparse window)
  const int64_t T = int64_t(prompt.size()), V = f.vocab_size, H = f.hidden_width;
  std::vector<float> l1, h1, lt, ht;
  testing::run_prompt(*one, prompt, l1, h1);
  testing::run_prompt(*tp, prompt, lt, ht);
  const auto d = compare(lt.data(), l1.data(), T, V);
  EXPECT_LE(d.rel(), 1e-4) << "max|Δ| " << d.max_abs << " max|ref| " << d.max_ref << " (" << tp->collectives() << ")";
  EXPECT_EQ(d.argmax_mismatches, 0) << "first at row " << d.first_mismatch_row;
  const auto dh = compare(ht.data(), h1.data(), T, H);
  EXPECT_LE(dh.rel(), 1e-4) << "hidden max|Δ| " << dh.max_abs;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaTensorParallelParity,
                         ::testing::Values(Case{"hy_v4/a_fp32", 2}, Case{"hy_v4/a_fp32", 3}, Case{"hy_v4/b_fp32", 2},
                                           Case{"hy_v4_fp8/fp8_ue8m0", 2}, Case{"qwen4_exp/a_fp32", 2},
                                           Case{"qwen4_exp/b_fp32", 2}, Case{"qwen4_exp/d_fp8", 2}),
                         [](const auto& param_info) {
                           return testing::fixture_test_name(param_info.param.fixture) + "_" +
                                  std::to_string(param_info.param.ranks) + "_ranks";
                         });

void decode_steps_equal_one_forward(Model& tp) {
  const auto& f = tp.facts();
  const int64_t V = f.vocab_size;
  const auto p = random_prompt(f.sparse_budget + 9, V, 5);
  const int64_t T = int64_t(p.size());
  std::vector<float> whole(size_t(T * V)), steps(size_t(T * V));
  {
    auto seq = tp.new_sequence(T);
    const BatchSegment seg{seq.get(), p.data(), T, true, nullptr};
    tp.forward(&seg, 1, whole.data(), nullptr);
  }
  auto seq = tp.new_sequence(T);
  const int64_t head = T - 4;
  BatchSegment seg{seq.get(), p.data(), head, true, nullptr};
  tp.forward(&seg, 1, steps.data(), nullptr);
  for (int64_t t = head; t < T; ++t) {
    seg = {seq.get(), p.data() + t, 1, true, nullptr};
    tp.forward(&seg, 1, steps.data() + t * V, nullptr);
  }
  EXPECT_EQ(0, std::memcmp(whole.data(), steps.data(), whole.size() * sizeof(float)));
}

// (Qwen4-Exp's steps also carry each rank's share of the recurrent state on its GPU from step to step)
TEST(CudaTensorParallel, DecodeStepsEqualOneForwardBitForBit) {
  NEXTN_SKIP_WITHOUT_CUDA();
  ThreadPool pool(2);
  for (const char* fixture : {"hy_v4/a_fp32", "qwen4_exp/b_fp32"}) {
    SCOPED_TRACE(fixture);
    decode_steps_equal_one_forward(*load_on_gpu(testing::fixture_path(fixture), pool, 2));
  }
}

TEST(CudaTensorParallel, GreedySpeculationEqualsPlainGreedy) {
  NEXTN_SKIP_WITHOUT_CUDA();
  ThreadPool pool(2);
  for (const char* fixture : {"hy_v4/a_fp32", "hy_v4/c_bf16", "qwen4_exp/a_fp32", "qwen4_exp/b_fp32"}) {
    auto tp = load_on_gpu(testing::fixture_path(fixture), pool, 2);
    const auto& f = tp->facts();
    ASSERT_GE(f.num_mtp_layers, 1);
    const auto prompt = random_prompt(f.sparse_budget + 5, f.vocab_size, 9);
    SamplingParams sp;
    sp.max_tokens = int(f.sparse_budget) + 8;
    SpecOptions plain;
    plain.enabled = false;
    const auto ref = Generator(*tp).generate(prompt, sp, plain);
    for (int k : {1, 2, 3, 5, 7}) {
      SpecOptions so;
      so.num_speculative_tokens = k;
      const auto got = Generator(*tp).generate(prompt, sp, so);
      EXPECT_EQ(got.ids, ref.ids) << fixture << " k " << k;
      EXPECT_GT(got.stats.num_draft_tokens, 0);
    }
  }
}

// The bundled models on 2 ranks: HY V4's, and Qwen4-Exp's, whose FP8 blocks of 128 columns hold all of a GDN
// layer's value heads and all of its shared expert's features, so that rank 0 has neither (its parts of those
// sums are zeros) and rank 1 has both.
TEST(CudaTensorParallel, BundledModelsOnTwoRanksMatchOneGpuAndSpeculateLosslessly) {
  NEXTN_SKIP_WITHOUT_CUDA();
  ThreadPool pool(2);
  for (const char* name : {"nextn-qwen4exp-tiny", "nextn-hy4-tiny"}) {
    SCOPED_TRACE(name);
    const std::string dir = std::string(NEXTN_SOURCE_DIR) + "/models/" + name;
    auto one = load_on_gpu(dir, pool, 1);
    auto tp = load_on_gpu(dir, pool, 2);
    const auto& f = one->facts();
    const auto prompt = random_prompt(f.sparse_budget + 9, f.vocab_size, 23);
    const int64_t T = int64_t(prompt.size()), V = f.vocab_size, H = f.hidden_width;
    std::vector<float> l1, h1, lt, ht;
    testing::run_prompt(*one, prompt, l1, h1);
    testing::run_prompt(*tp, prompt, lt, ht);
    const auto d = compare(lt.data(), l1.data(), T, V);
    EXPECT_LE(d.rel(), 1e-4) << "max|Δ| " << d.max_abs;
    EXPECT_EQ(d.argmax_mismatches, 0) << "first at row " << d.first_mismatch_row;
    EXPECT_LE(compare(ht.data(), h1.data(), T, H).rel(), 1e-4);
    SamplingParams sp;
    sp.max_tokens = 48;
    SpecOptions plain;
    plain.enabled = false;
    const auto ref = Generator(*tp).generate(prompt, sp, plain);
    for (int k : {1, 3}) {
      SpecOptions so;
      so.num_speculative_tokens = k;
      const auto got = Generator(*tp).generate(prompt, sp, so);
      EXPECT_EQ(got.ids, ref.ids) << "k " << k;
      EXPECT_GT(got.stats.num_accepted_tokens, 0) << "k " << k;
    }
  }
}

// Steps whose every row is read as its argmax: each rank's best (value, id) per row of its vocabulary part is
// gathered, never the logits (the logits buffer keeps its NaNs); the ids are those of the whole rows.
TEST(CudaTensorParallel, GreedyRowsComeAsIdsWithoutGatheringTheLogits) {
  NEXTN_SKIP_WITHOUT_CUDA();
  ThreadPool pool(2);
  for (const auto& [fixture, ranks] : {std::pair{"hy_v4/b_fp32", 3}, std::pair{"qwen4_exp/b_fp32", 2}}) {
    SCOPED_TRACE(fixture);
    auto tp = load_on_gpu(testing::fixture_path(fixture), pool, ranks);
    testing::expect_greedy_ids_without_logits(*tp, random_prompt(50, tp->facts().vocab_size, 11), 40);
  }
}

TEST(CudaTensorParallel, OneGpuRanksShareItThroughHostMemory) {
  NEXTN_SKIP_WITHOUT_CUDA();
  if (cuda::device_count() > 1) GTEST_SKIP() << "several GPUs: the ranks get one each";
  ThreadPool pool(2);
  for (const char* fixture : {"hy_v4/a_fp32", "qwen4_exp/a_fp32"}) {
    auto tp = load_on_gpu(testing::fixture_path(fixture), pool, 2);
    EXPECT_EQ(tp->collectives(), "through host memory") << fixture;
    EXPECT_FALSE(tp->runs_on(Device::kCuda)) << fixture;  // (not chosen by --device auto: two ranks, one GPU)
  }
}

TEST(CudaTensorParallel, NcclGathersAcrossRanksWhenEachHasAGpu) {
  NEXTN_SKIP_WITHOUT_CUDA();
  std::string why;
  if (!cuda::nccl_available(&why)) GTEST_SKIP() << why;
  const int ranks = cuda::device_count();
  if (ranks < 2) GTEST_SKIP() << "NCCL needs a GPU per rank: this machine has " << ranks;
  LocalGroup group(ranks);
  group.run([&](Communicator& host) {
    cuda::use_gpu(host.rank());
    auto comm = cuda::device_communicator(host);
    EXPECT_EQ(comm->describe().rfind("NCCL", 0), 0u) << comm->describe();
    const int64_t n = 257;
    std::vector<float> mine(size_t(n), float(host.rank() + 1));
    auto in = cuda_test::to_device(mine);
    cuda::DeviceBuffer all(size_t(ranks * n) * sizeof(float));
    comm->all_gather(in.get(), n * int64_t(sizeof(float)), all.get());
    std::vector<float> got(size_t(ranks * n));
    all.download(got.data(), got.size() * sizeof(float));
    for (int r = 0; r < ranks; ++r) EXPECT_EQ(got[size_t(r * n + n - 1)], float(r + 1));
  });
}

}  // namespace
}  // namespace nextn
