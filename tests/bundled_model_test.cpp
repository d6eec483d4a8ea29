// The bundled model (models/nextn-hy4-tiny: FP8 block-quantized HY V4 + 2 MTP layers, trained by
// tools/train/train_hy_v4.py) against transformers' fp32 run over the same dequantized weights, and its
// tokenizer against the ids `tokenizers` recorded. References: tests/fixtures/bundled/.
#include <gtest/gtest.h>

#include <malloc.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>

#include "core/threadpool.h"
#include "io/tokenizer.h"
#include "models/hy_v4/model.h"
#include "engine/generator.h"
#include "draft_head_check.h"
#include "resumed_drafting.h"
#include "test_util.h"

namespace nextn {
namespace {

const std::string kModel = std::string(NEXTN_SOURCE_DIR) + "/models/nextn-hy4-tiny";
const std::string kRef = std::string(NEXTN_SOURCE_DIR) + "/tests/fixtures/bundled";

class Bundled : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    pool_ = new ThreadPool(2);
    model_ = new HYV4Model(kModel, pool_);
  }
  static void TearDownTestSuite() {
    delete model_;
    delete pool_;
  }
  static ThreadPool* pool_;
  static HYV4Model* model_;
};
ThreadPool* Bundled::pool_ = nullptr;
HYV4Model* Bundled::model_ = nullptr;

TEST_F(Bundled, CheckpointIsFp8WithTwoMtpLayers) {
  EXPECT_EQ(model_->num_mtp_layers(), 2);
  EXPECT_EQ(model_->weights().layers[1].attn.q_b_proj.dtype, DType::F8_E4M3);
  EXPECT_TRUE(model_->config().quant.present);
}

// fp32 compute over the same dequantized weights: 1e-4 relative, identical argmax.
TEST_F(Bundled, LogitsMatchTransformers) {
  testing::Reference ref(kRef);
  auto ids = ref.ids("input_ids");
  const int64_t T = ids.size(), V = model_->config().vocab_size, H = model_->config().hidden_size;
  ASSERT_GT(T, model_->config().index_topk);
  KVCache cache = model_->new_cache(T);
  std::vector<float> logits(T * V), hidden(T * H);
  model_->forward(ids.data(), T, cache, logits.data(), hidden.data());
  auto r = ref.f32("logits");
  auto d = testing::compare(logits.data(), r.data(), T, V);
  EXPECT_LE(d.rel(), 1e-4) << "max|Δ| " << d.max_abs << " max|ref| " << d.max_ref;
  EXPECT_EQ(d.argmax_mismatches, 0) << "first at row " << d.first_mismatch_row;

  KVCache dc = model_->new_draft_cache(T);
  std::vector<float> dl((T - 1) * V);
  model_->draft_forward(0, ids.data() + 1, hidden.data(), T - 1, 0, dc, dl.data(), nullptr);
  auto rd = ref.f32("draft_logits");
  auto dd = testing::compare(dl.data(), rd.data(), T - 1, V);
  EXPECT_LE(dd.rel(), 1e-4) << "draft max|Δ| " << dd.max_abs;
  EXPECT_EQ(dd.argmax_mismatches, 0);
}

TEST_F(Bundled, GreedyWithAndWithoutSpeculationMatchesTransformers) {
  testing::Reference ref(kRef);
  auto ids = ref.ids("input_ids");
  auto expect = ref.ids("greedy_ids");
  SamplingParams sp;
  sp.max_tokens = static_cast<int>(expect.size());
  for (bool spec : {false, true}) {
    SpecOptions so;
    so.enabled = spec;
    auto res = Generator(*model_).generate(ids, sp, so);
    EXPECT_EQ(res.ids, expect) << (spec ? "speculative" : "plain");
    if (spec) {
      EXPECT_GT(res.stats.mean_acceptance_length(), 1.2) << "the trained MTP layers should draft well";
    }
  }
}

// Drafting resumed after stretches of plain rounds (tests/resumed_drafting.h).
TEST_F(Bundled, DraftingResumedAfterPlainStretchesKeepsItsAcceptance) {
  testing::expect_resumed_drafting_keeps_acceptance(*model_, Tokenizer::from_dir(kModel));
}

// Drafts through an FP8 copy of the bf16 lm_head: the same tokens, nearly the same acceptance
// (tests/draft_head_check.h).
TEST_F(Bundled, Fp8DraftHeadKeepsTheTokensAndTheAcceptance) {
  testing::expect_fp8_draft_head_keeps_tokens_and_acceptance(*model_, Tokenizer::from_dir(kModel));
}

// Every threaded path (column-split MoE over FP8 experts sliced inside their 128-row scale blocks,
// attention over (row, head) pairs, key-split indexer), forced on this FP8 model, gives the default run's
// bits for the target and for speculative greedy generation.
TEST_F(Bundled, ThreadedPathsAreBitIdentical) {
  testing::Reference ref(kRef);
  auto ids = ref.ids("input_ids");
  auto greedy = ref.ids("greedy_ids");
  const int64_t T = ids.size(), V = model_->config().vocab_size, N = std::min<int64_t>(greedy.size(), 6);
  std::vector<int32_t> seq = ids;
  seq.insert(seq.end(), greedy.begin(), greedy.begin() + N);
  KVCache full_cache = model_->new_cache(T + N);
  std::vector<float> full(int64_t(seq.size()) * V);
  model_->forward(seq.data(), seq.size(), full_cache, full.data(), nullptr, true);

  // 2 threads: 2 routed + 1 shared expert per token as whole jobs, whole heads per thread in attention;
  // 3 threads: the shared expert split over the threads after the routed jobs (as large ones run);
  // 4 threads: fewer experts than threads, so the column-split MoE.
  for (int threads : {2, 3, 4}) {
    ThreadPool pool(threads);
    HYV4Model m(kModel, &pool);
    m.cpu_tuning().min_parallel_work = 0;
    if (threads == 3) m.cpu_tuning().shared_split_bytes = 0;
    testing::expect_steps_bit_identical(m, ids, greedy, N, full, std::to_string(threads) + " threads");
    SamplingParams sp;
    sp.max_tokens = static_cast<int>(greedy.size());
    SpecOptions so;
    so.enabled = true;
    EXPECT_EQ(Generator(m).generate(ids, sp, so).ids, greedy) << threads << " threads";
  }
}

// The bytes a target forward reads count each routed expert its rows used once: one row reads what
// weight_bytes_total() says; four rows read whole experts more, at most the experts four rows can pick.
TEST_F(Bundled, LastForwardWeightBytesCountTheExpertsUsed) {
  const HYV4Config& c = model_->config();
  const FfnWeights& f = model_->weights().layers[1].ffn;
  ASSERT_TRUE(f.sparse);
  const size_t expert = f.expert_gate[0].weight_bytes() + f.expert_up[0].weight_bytes() + f.expert_down[0].weight_bytes();
  size_t moe_layers = 0;
  for (const auto& L : model_->weights().layers) moe_layers += L.ffn.sparse;
  const std::vector<int32_t> toks = {17, 901, 33, 1500, 7, 640};
  KVCache cache = model_->new_cache(16);
  model_->forward(toks.data(), 2, cache, nullptr, nullptr);
  model_->forward(toks.data() + 2, 1, cache, nullptr, nullptr);
  const size_t one = model_->last_forward_weight_bytes();
  EXPECT_EQ(one, model_->weight_bytes_total());
  model_->forward(toks.data() + 2, 4, cache, nullptr, nullptr);
  const size_t four = model_->last_forward_weight_bytes();
  EXPECT_GT(four, one);
  EXPECT_EQ((four - one) % expert, 0u);
  const size_t most = std::min<size_t>(4 * c.num_experts_per_tok, c.n_routed_experts) - c.num_experts_per_tok;
  EXPECT_LE(four - one, moe_layers * most * expert);
  // MTP forwards do not change what the last target forward read
  KVCache dc = model_->new_draft_cache(16);
  std::vector<float> h(3 * c.hidden_size, 0.5f);
  model_->draft_forward(0, toks.data() + 1, h.data(), 3, 0, dc, nullptr, nullptr);
  EXPECT_EQ(model_->last_forward_weight_bytes(), four);
}

// FP8 stays FP8: loading copies no large tensor (heap growth is the small fp32 vectors: norms, HC gates,
// router and indexer weights), and after touching every weight the resident bytes of the mapped file
// equal the file size.
TEST(BundledMemory, ResidentWeightBytesMatchTheFile) {
  const size_t file = std::filesystem::file_size(kModel + "/model.safetensors");
  const size_t heap0 = mallinfo2().uordblks;
  HYV4Model m(kModel, nullptr);
  const size_t heap = mallinfo2().uordblks - heap0;
  EXPECT_LT(heap, file / 10) << "loading allocated " << heap << " bytes for a " << file << "-byte checkpoint";
  m.prefault(false);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool in_model = false;
  size_t rss_kb = 0;
  while (std::getline(smaps, line)) {
    if (!line.empty() && std::isxdigit(static_cast<unsigned char>(line[0])) && line.find('-') < 17)
      in_model = line.find("nextn-hy4-tiny/model.safetensors") != std::string::npos;
    else if (in_model && line.rfind("Rss:", 0) == 0)
      rss_kb += std::stoul(line.substr(4));
  }
  const double resident = double(rss_kb) * 1024;
  EXPECT_GT(resident, 0.95 * double(file));
  EXPECT_LT(resident, 1.05 * double(file) + 8192);
}

TEST_F(Bundled, TokenizerMatchesTokenizersLibrary) {
  Tokenizer tok = Tokenizer::from_dir(kModel);
  std::ifstream in(kRef + "/tokenizer_oracle.jsonl");
  ASSERT_TRUE(in.good());
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    const std::string text = j["text"];
    const auto want = j["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(text), want) << "text: " << text;
    ++n;
  }
  EXPECT_GT(n, 300);
}

}  // namespace
}  // namespace nextn
