// The nextn command line: help, usage errors (exit 2), load errors (exit 1), outputs.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/safetensors.h"
#include "io/tokenizer.h"
#include "ops/cpu_target.h"
#include "ops/cuda/cuda_ops.h"
#include "test_util.h"

namespace nextn {
namespace {

struct Run {
  int status;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs `[env] nextn args` (env: variable assignments for the shell, e.g. "NEXTN_CPU_TARGET=scalar").
Run nextn_with(const std::string& env, const std::string& args) {
  // One stderr file per call and process: ctest runs these tests in parallel processes.
  static int calls = 0;
  const std::string err_file = ::testing::TempDir() + "/nextn_cli_stderr_" + std::to_string(::getpid()) + "_" +
                               std::to_string(calls++) + ".txt";
  const std::string cmd = env + " " + std::string(NEXTN_CLI_PATH) + " " + args + " 2>" + err_file + " </dev/null";
  Run r{};
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {-1, "", "popen failed"};
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  if (FILE* f = fopen(err_file.c_str(), "r")) {
    while ((n = fread(buf.data(), 1, buf.size(), f)) > 0) r.err.append(buf.data(), n);
    fclose(f);
  }
  std::remove(err_file.c_str());
  return r;
}

Run nextn(const std::string& args) { return nextn_with("", args); }

const std::string kFixture = testing::fixture_dir("a_fp32");
const std::string kBundled = std::string(NEXTN_SOURCE_DIR) + "/models/nextn-hy4-tiny";

// Expects exit status 2 (a usage error) with `message` on stderr.
void expect_usage_error(const std::string& args, const std::string& message) {
  const Run r = nextn(args);
  EXPECT_EQ(r.status, 2) << args << "\n" << r.err;
  EXPECT_NE(r.err.find(message), std::string::npos) << args << "\nstderr: " << r.err;
}

// A scratch copy of the a_fp32 fixture checkpoint (config + weights), for tests that add files to it.
std::string fixture_copy(const std::string& name) {
  namespace fs = std::filesystem;
  const std::string dir = ::testing::TempDir() + "/nextn_cli_" + name + "_" + std::to_string(::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(kFixture + "/" + f, dir + "/" + f);
  return dir;
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

std::string ids_arg(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(ids[i]);
  }
  return s;
}

TEST(Cli, HelpExitsZeroAndListsCommands) {
  auto r = nextn("--help");
  EXPECT_EQ(r.status, 0);
  for (const char* cmd : {"generate", "logits", "inspect", "bench", "tokenize"})
    EXPECT_NE(r.out.find(cmd), std::string::npos) << cmd;
  for (const char* cmd : {"generate", "logits", "inspect", "bench", "tokenize", "detokenize"}) {
    auto h = nextn(std::string(cmd) + " --help");
    EXPECT_EQ(h.status, 0) << cmd;
    EXPECT_NE(h.out.find("usage"), std::string::npos) << cmd;
  }
}

TEST(Cli, BadArgumentsExitTwoWithUsage) {
  EXPECT_EQ(nextn("").status, 2);
  auto r = nextn("frobnicate");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("unknown command"), std::string::npos);
  r = nextn("generate --model " + kFixture + " --ids 1,x");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("not a token id"), std::string::npos);
  // (the message, then where the options are: not the whole usage, which would bury it)
  EXPECT_NE(r.err.find("(`nextn generate --help` lists the options)"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("usage:"), std::string::npos) << r.err;
  r = nextn("bench --dtype fp4");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("(`nextn bench --help` lists the options)"), std::string::npos) << r.err;
  EXPECT_EQ(nextn("generate --bogus-flag").status, 2);
  EXPECT_EQ(nextn("generate --model " + kFixture + " --ids 1,2 --speculative-tokens 9").status, 2);
  EXPECT_EQ(nextn("generate --model " + kFixture + " --ids 1,2 --temperature -1").status, 2);
  EXPECT_EQ(nextn("logits --model " + kFixture + " --ids 1,2").status, 2);  // no --output
  r = nextn("generate --model " + kFixture + " --ids 1,2 --speculative-tokens auto --adaptive 0.3");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("alternatives"), std::string::npos) << r.err;
}

// A --model that is no checkpoint folder is said as such (exit 1), before any question about its tokenizer.
TEST(Cli, ModelThatIsNoCheckpointFolderIsSaidFirst) {
  namespace fs = std::filesystem;
  const std::string base = ::testing::TempDir() + "/nextn_cli_not_a_model_" + std::to_string(::getpid());
  fs::remove_all(base);
  fs::create_directories(base + "/empty");
  fs::create_directories(base + "/other");
  std::ofstream(base + "/other/config.json") << R"({"model_type": "deepseek_v3"})";
  std::ofstream(base + "/file.safetensors") << "x";
  const std::pair<std::string, std::string> cases[] = {
      {base + "/missing", base + "/missing: no such folder"},
      {base + "/file.safetensors", base + "/file.safetensors is a file: a model is the checkpoint's folder"},
      {base + "/empty", base + "/empty has no config.json: not a HuggingFace checkpoint folder"},
      {base + "/other", base + "/other/config.json: unsupported model_type 'deepseek_v3' (nextn supports: hy_v4"},
  };
  for (const auto& [dir, message] : cases)
    for (const std::string command : {"generate --prompt hi --model ", "generate --ids 1 --model ", "serve --model "}) {
      const auto r = nextn(command + dir);
      EXPECT_EQ(r.status, 1) << command << dir << "\n" << r.err;
      EXPECT_NE(r.err.find("nextn: error: " + message), std::string::npos) << command << dir << "\n" << r.err;
    }
  fs::remove_all(base);
}

// Greedy decoding tunes k by default (and with --speculative-tokens auto); a given K fixes it.
// --device: a bad value is a usage error; cuda without a usable GPU (or for a family the CUDA backend does not
// run) is an error saying why; auto runs where it can, and the tokens are the target's either way.
TEST(Cli, DeviceOptionSaysWhereTheModelRunsOrWhyNot) {
  expect_usage_error("generate --model " + kFixture + " --ids 1,2 -n 2 --device tpu", "--device must be cpu, cuda or auto");
  const std::string args = "generate --model " + kFixture + " --ids 1,2,3 -n 4 --json --no-speculate";
  const auto cpu = nextn(args + " --device cpu");
  const auto automatic = nextn(args);
  ASSERT_EQ(cpu.status, 0) << cpu.err;
  ASSERT_EQ(automatic.status, 0) << automatic.err;
  EXPECT_EQ(nlohmann::json::parse(cpu.out)["ids"], nlohmann::json::parse(automatic.out)["ids"]);
  const auto qwen = nextn("generate --model " + testing::qwen4_exp_fixture_dir("a_fp32") + " --ids 1,2 -n 2 --device cuda");
  EXPECT_EQ(qwen.status, 1);
  std::string why;
  if (!cuda::available(&why)) {
    const auto r = nextn(args + " --device cuda");
    EXPECT_EQ(r.status, 1) << r.err;
    EXPECT_NE(r.err.find("--device cuda: "), std::string::npos) << r.err;
  } else {
    EXPECT_NE(qwen.err.find("does not run this family"), std::string::npos) << qwen.err;
  }
}

TEST(Cli, GreedyTunesKUnlessKIsGiven) {
  testing::Reference ref(kFixture);
  auto ids = ref.ids("input_ids");
  auto greedy = ref.ids("greedy_ids");
  const int n = static_cast<int>(std::min<size_t>(greedy.size(), 8));
  for (const char* mode : {"", "--speculative-tokens auto"}) {
    auto r = nextn("generate --model " + kFixture + " --ids " + ids_arg(ids) + " -n " + std::to_string(n) +
                   " --json --ignore-eos " + mode);
    ASSERT_EQ(r.status, 0) << r.err;
    auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["ids"].get<std::vector<int32_t>>(), std::vector<int32_t>(greedy.begin(), greedy.begin() + n)) << mode;
    EXPECT_FALSE(j["stats"]["rounds_at_k"].empty()) << mode;
    EXPECT_NE(r.err.find("steps per k"), std::string::npos) << mode;
  }
  auto fixed = nextn("generate --model " + kFixture + " --ids " + ids_arg(ids) + " -n 4 --json --speculative-tokens 2");
  ASSERT_EQ(fixed.status, 0) << fixed.err;
  EXPECT_TRUE(nlohmann::json::parse(fixed.out)["stats"]["rounds_at_k"].empty());
}

// A random-weight fixture's drafts are never accepted: a round at k > 0 yields one token for more time than a
// plain step, so the tuner keeps plain decoding and the stats say so.
TEST(Cli, StatsSayWhenTheTunerKeptPlainDecoding) {
  testing::Reference ref(kFixture);
  auto ids = ref.ids("input_ids");
  auto r = nextn("generate --model " + kFixture + " --ids " + ids_arg(ids) + " -n 48 --ignore-eos");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("plain decoding for "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("the tuner kept it off"), std::string::npos) << r.err;
  // A generation too short to pay for a probe does not draft, and says why.
  r = nextn("generate --model " + kFixture + " --ids " + ids_arg(ids) + " -n 12 --ignore-eos");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("plain decoding for all 11 steps: a generation this short"), std::string::npos) << r.err;
}

TEST(Cli, LoadErrorsExitOneAndNameThePath) {
  auto r = nextn("generate --model /nonexistent/model --ids 1,2");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("/nonexistent/model"), std::string::npos) << r.err;
}

TEST(Cli, LogitsWritesTargetAndDraftLogits) {
  testing::Reference ref(kFixture);
  auto ids = ref.ids("input_ids");
  const std::string out = ::testing::TempDir() + "/nextn_cli_logits.safetensors";
  auto r = nextn("logits --model " + kFixture + " --ids " + ids_arg(ids) + " --output " + out + " --draft --threads 1");
  ASSERT_EQ(r.status, 0) << r.err;
  SafetensorsFile f(out);
  const TensorView* l = f.find("logits");
  const TensorView* d = f.find("draft_logits");
  ASSERT_TRUE(l && d);
  const int64_t T = ids.size();
  EXPECT_EQ(l->shape, (std::vector<int64_t>{T, 256}));
  EXPECT_EQ(d->shape, (std::vector<int64_t>{T - 1, 256}));
  auto want = ref.f32("logits");
  auto diff = testing::compare(static_cast<const float*>(l->data), want.data(), T, 256);
  EXPECT_LE(diff.rel(), 1e-4);
  auto dwant = ref.f32("draft_logits");
  auto ddiff = testing::compare(static_cast<const float*>(d->data), dwant.data(), T - 1, 256);
  EXPECT_LE(ddiff.rel(), 1e-4);
  std::filesystem::remove(out);
}

TEST(Cli, GenerateJsonHasIdsAndStats) {
  testing::Reference ref(kFixture);
  auto ids = ref.ids("input_ids");
  auto greedy = ref.ids("greedy_ids");
  // (a fixed k: a tuned one may still be measuring k = 0 after 6 tokens, and then drafts nothing)
  auto r = nextn("generate --model " + kFixture + " --ids " + ids_arg(ids) +
                 " -n 6 --json --ignore-eos --speculative-tokens 2");
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  auto got = j["ids"].get<std::vector<int32_t>>();
  EXPECT_EQ(got, std::vector<int32_t>(greedy.begin(), greedy.begin() + 6));
  for (const char* k : {"num_drafts", "num_draft_tokens", "num_accepted_tokens", "per_position_acceptance",
                        "mean_acceptance_length", "tokens_per_second"})
    EXPECT_TRUE(j["stats"].contains(k)) << k;
  // Decode time split: the verify forwards, the MTP catch-up and the draft steps fit inside decode time.
  const auto& st = j["stats"];
  EXPECT_GT(st["verify_seconds"].get<double>(), 0.0);
  EXPECT_GT(st["catch_up_seconds"].get<double>(), 0.0);
  EXPECT_GT(st["draft_seconds"].get<double>(), 0.0);
  EXPECT_LE(st["verify_seconds"].get<double>() + st["catch_up_seconds"].get<double>() + st["draft_seconds"].get<double>(),
            st["decode_seconds"].get<double>());
  EXPECT_NE(r.err.find("mean acceptance length"), std::string::npos);
  // logprobs: the chosen (greedy) token is the best alternative, and logprobs are <= 0
  auto l = nextn("generate --model " + kFixture + " --ids " + ids_arg(ids) + " -n 3 --json --logprobs 2");
  ASSERT_EQ(l.status, 0) << l.err;
  auto jl = nlohmann::json::parse(l.out);
  ASSERT_EQ(jl["logprobs"].size(), 3u);
  for (const auto& e : jl["logprobs"]) {
    EXPECT_LE(e["logprob"].get<double>(), 0.0);
    ASSERT_EQ(e["top"].size(), 2u);
    EXPECT_EQ(e["top"][0]["token"], e["token"]);
    EXPECT_GE(e["top"][0]["logprob"].get<double>(), e["top"][1]["logprob"].get<double>());
  }
}

// `bench --json` prints the object the P6 issue specifies (values are measurements: only their shape and
// the bounds that hold on any machine are checked): a 1-row step is the unit of both verify ratios, and a
// k+1-row step reads at least the bytes of one row (each row's own experts are among those read).
TEST(Cli, BenchJsonHasTheSpecifiedKeys) {
  const std::string model = testing::fixture_dir("b_fp32");  // 2 MTP layers
  auto r = nextn("bench --model " + model + " --json --tokens 8 --prompt-tokens 8 --repeats 1 --threads 1");
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  for (const char* k : {"read_bandwidth_gbps", "decode_gbps", "bandwidth_fraction", "baseline_tokens_per_s"}) {
    ASSERT_TRUE(j.contains(k)) << k;
    EXPECT_GT(j[k].get<double>(), 0.0) << k;
  }
  // Whether the checkpoint fits in the last-level cache (then decode does not read DRAM).
  EXPECT_GT(j["checkpoint_bytes"].get<double>(), 0.0);
  const double llc = j["llc_bytes"].get<double>();
  EXPECT_EQ(j["fits_in_llc"].get<bool>(), llc > 0 && j["checkpoint_bytes"].get<double>() <= llc);
  // The kernels' target: this process's, since the child inherits NEXTN_CPU_TARGET (unset: the best one).
  EXPECT_EQ(j["cpu_target"].get<std::string>(), ops::cpu_target_name());
  EXPECT_EQ(j["cpu_target_forced"].get<bool>(), ops::cpu_target_forced());
  EXPECT_EQ(j["draft_head"], "auto");  // (the default)
  // (measured in the child, which may choose otherwise than this process on a noisy machine: either is exact)
  const std::string fp8 = j["cpu_fp8_decode"].get<std::string>();
  EXPECT_TRUE(fp8 == "bits" || fp8 == "f16") << fp8;
  // How the weights were held: as NEXTN_WEIGHTS (inherited) asks, mapped when unset.
  const char* held = std::getenv("NEXTN_WEIGHTS");
  EXPECT_EQ(j["weights"].get<std::string>(), held && std::string(held) == "memory" ? "memory" : "mapped");
  EXPECT_EQ(j["verify_cost"]["1"].get<double>(), 1.0);
  EXPECT_EQ(j["verify_bytes"]["1"].get<double>(), 1.0);
  for (int rows = 2; rows <= 8; ++rows) {
    const std::string key = std::to_string(rows);
    EXPECT_GT(j["verify_cost"][key].get<double>(), 0.0) << key;
    EXPECT_GE(j["verify_bytes"][key].get<double>(), 1.0 - 1e-12) << key;
    // Against the bytes' time at the run's bandwidth: the same steps, so relative to the one-row step's it
    // is the time ratio over the bytes ratio.
    const double floor = j["verify_floor_ratio"][key].get<double>(), floor1 = j["verify_floor_ratio"]["1"].get<double>();
    EXPECT_GT(floor, 0.0) << key;
    EXPECT_NEAR(floor / floor1, j["verify_cost"][key].get<double>() / j["verify_bytes"][key].get<double>(),
                1e-9 * floor / floor1) << key;
  }
  EXPECT_FALSE(j.contains("concurrency"));  // only with --concurrency
  ASSERT_EQ(j["speculative"].size(), 4u);
  for (int k = 1; k <= 4; ++k) {
    const auto& e = j["speculative"][k - 1];
    EXPECT_EQ(e["k"].get<int>(), k);
    EXPECT_GT(e["tokens_per_s"].get<double>(), 0.0);
    EXPECT_GE(e["mean_acceptance_length"].get<double>(), 1.0);
    EXPECT_GT(e["speedup"].get<double>(), 0.0);
    // The shares of decode time: verify, catch-up and draft steps are parts of it (the rest is other work).
    double parts = 0;
    for (const char* p : {"verify", "catch_up", "draft"}) {
      const double f = e["decode_split"][p].get<double>();
      EXPECT_GE(f, 0.0) << p;
      parts += f;
    }
    EXPECT_GT(e["decode_split"]["verify"].get<double>(), 0.0);
    EXPECT_LE(parts, 1.0 + 1e-9);
  }
}

// `bench --concurrency` on the bundled model (2 MTP layers): one entry per N, in order, with positive speeds
// and ratios (measurements: no speed is asserted), and the bytes a step reads behind the bandwidth ceiling.
TEST(Cli, BenchConcurrencyReportsEveryBatchSize) {
  auto r = nextn("bench --concurrency 1,2 --tokens 8 --repeats 1 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.contains("concurrency"));
  ASSERT_EQ(j["concurrency"].size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const auto& e = j["concurrency"][i];
    EXPECT_EQ(e["sequences"].get<int>(), i + 1);
    for (const char* k : {"plain_tokens_per_s", "speculative_tokens_per_s", "plain_vs_single", "speculative_vs_plain",
                          "plain_bytes_per_step", "plain_ceiling_tokens_per_s", "plain_bandwidth_fraction",
                          "plain_all_in_flight_tokens_per_s", "speculative_all_in_flight_tokens_per_s",
                          "speculative_vs_plain_all_in_flight"}) {
      ASSERT_TRUE(e[k].is_number()) << k << ": " << e.dump();
      EXPECT_GT(e[k].get<double>(), 0.0) << k;
    }
    EXPECT_GE(e["mean_acceptance_length"].get<double>(), 1.0);
    // Plain greedy requests of one length finish in one step: their window with all N decoding is the whole run
    // (up to the loop's own bookkeeping after the last step).
    EXPECT_NEAR(e["plain_all_in_flight_tokens_per_s"].get<double>() / e["plain_tokens_per_s"].get<double>(), 1.0, 0.05);
  }
  EXPECT_EQ(j["concurrency"][0]["plain_vs_single"].get<double>(), 1.0);  // N = 1 is the single sequence
  EXPECT_GT(j["concurrency_single_tokens_per_s"].get<double>(), 0.0);
  // A bad list is a usage error, before anything is measured.
  expect_usage_error("bench --concurrency 1,0", "--concurrency must be in 1..256, got 0");
  expect_usage_error("bench --concurrency 2 --tokens 1", "--tokens >= 2");
}

// `bench --concurrency-temperature / --concurrency-top-p`: the requests are sampled (the JSON says how), every
// run still generates all its tokens; the options need --concurrency and valid values.
TEST(Cli, BenchConcurrencySamplesWhenAsked) {
  auto r = nextn("bench --concurrency 4 --tokens 8 --repeats 1 --json --concurrency-temperature 0.8 "
                 "--concurrency-top-p 0.9");
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_FLOAT_EQ(j["concurrency_temperature"].get<float>(), 0.8f);
  EXPECT_FLOAT_EQ(j["concurrency_top_p"].get<float>(), 0.9f);
  ASSERT_EQ(j["concurrency"].size(), 1u);
  for (const char* k : {"plain_tokens_per_s", "speculative_tokens_per_s"})
    EXPECT_GT(j["concurrency"][0][k].get<double>(), 0.0) << k;
  expect_usage_error("bench --concurrency-temperature 0.5", "--concurrency-temperature applies to --concurrency");
  expect_usage_error("bench --concurrency 2 --concurrency-top-p 0", "--concurrency-top-p must be");
  expect_usage_error("bench --concurrency 2 --concurrency-temperature -1", "--concurrency-temperature");
}

TEST(Cli, GenerateTextWithBundledModelAndStopString) {
  auto r = nextn("generate --prompt 'def add(a, b):' -n 24 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_FALSE(j["text"].get<std::string>().empty());
  const std::string text = j["text"];
  // stop before the first newline the model writes
  auto s = nextn("generate --prompt 'def add(a, b):' -n 24 --json --stop '\n'");
  ASSERT_EQ(s.status, 0) << s.err;
  auto js = nlohmann::json::parse(s.out);
  const std::string stopped = js["text"];
  EXPECT_EQ(stopped.find('\n'), std::string::npos);
  EXPECT_EQ(text.substr(0, stopped.size()), stopped);
  EXPECT_EQ(js["finish_reason"], "stop");
}

TEST(Cli, TensorParallelGeneratesTheSameTextOnTheBundledModel) {
  // (not equal bits in general: the ranks' partial sums add in another order; on the bundled model the greedy
  // tokens agree, with speculation on, and the option is range checked like the others)
  const std::string args = "generate --prompt 'def add(a, b):' -n 32 --json";
  const auto one = nextn(args), two = nextn(args + " --tensor-parallel 2");
  const auto three = nextn(args + " --tensor-parallel 3");
  ASSERT_EQ(one.status, 0) << one.err;
  ASSERT_EQ(two.status, 0) << two.err;
  ASSERT_EQ(three.status, 0) << three.err;
  const auto ids = nlohmann::json::parse(one.out)["ids"];
  EXPECT_EQ(nlohmann::json::parse(two.out)["ids"], ids);
  EXPECT_EQ(nlohmann::json::parse(three.out)["ids"], ids);
  expect_usage_error(args + " --tensor-parallel 0", "--tensor-parallel must be in 1..64, got 0");
  // Qwen4-Exp's bundled model too.
  const std::string qwen = "generate --model " + std::string(NEXTN_SOURCE_DIR) +
                           "/models/nextn-qwen4exp-tiny --prompt 'def add(a, b):' -n 32 --json";
  const auto q1 = nextn(qwen), q2 = nextn(qwen + " --tensor-parallel 2");
  ASSERT_EQ(q1.status, 0) << q1.err;
  ASSERT_EQ(q2.status, 0) << q2.err;
  EXPECT_EQ(nlohmann::json::parse(q2.out)["ids"], nlohmann::json::parse(q1.out)["ids"]);
}

TEST(Cli, TensorParallelRankThatVanishesStopsTheCommandWithItsStatus) {
  // The ranks are processes of this executable: one that ends without a word (here at its first forward, by the
  // test seam; a crash or a kill alike) is found by rank 0 while it waits, and the command ends with an error
  // naming it.
  const auto r =
      nextn_with("NEXTN_TEST_TP_EXIT_RANK=1", "generate --prompt 'def add(a, b):' -n 16 --tensor-parallel 2");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("tensor parallel rank 1 exited with status 3"), std::string::npos) << r.err;
}

// --weights memory reads the files into memory at load: the same tokens as mapped files; it overrides
// NEXTN_WEIGHTS, for the tensor-parallel ranks too (they inherit the environment the option sets).
TEST(Cli, WeightsOptionHoldsTheFilesEitherWayWithTheSameTokens) {
  const std::string args = "generate --prompt 'def add(a, b):' -n 16 --json";
  const auto mapped = nextn(args + " --weights mapped"), memory = nextn(args + " --weights memory");
  ASSERT_EQ(mapped.status, 0) << mapped.err;
  ASSERT_EQ(memory.status, 0) << memory.err;
  const auto ids = nlohmann::json::parse(mapped.out)["ids"];
  EXPECT_EQ(nlohmann::json::parse(memory.out)["ids"], ids);
  expect_usage_error(args + " --weights disk", "--weights must be mapped or memory, got 'disk'");
  const auto bad_env = nextn_with("NEXTN_WEIGHTS=disk", args);
  EXPECT_EQ(bad_env.status, 1);
  EXPECT_NE(bad_env.err.find("NEXTN_WEIGHTS='disk'"), std::string::npos) << bad_env.err;
  const auto ranks = nextn_with("NEXTN_WEIGHTS=disk", args + " --weights memory --tensor-parallel 2");
  ASSERT_EQ(ranks.status, 0) << ranks.err;
  EXPECT_EQ(nlohmann::json::parse(ranks.out)["ids"], ids);
}

// --draft-head: the drafts' lm_head (an FP8 copy, or the target's own) never changes the tokens.
TEST(Cli, DraftHeadOptionKeepsTheTokens) {
  const std::string args = "generate --prompt 'def add(a, b):' -n 24 --json --speculative-tokens 3";
  const auto fp8 = nextn(args + " --draft-head fp8"), own = nextn(args + " --draft-head target");
  ASSERT_EQ(fp8.status, 0) << fp8.err;
  ASSERT_EQ(own.status, 0) << own.err;
  const auto f = nlohmann::json::parse(fp8.out), o = nlohmann::json::parse(own.out);
  EXPECT_EQ(f["ids"], o["ids"]);
  EXPECT_GT(f["stats"]["num_draft_tokens"].get<int>(), 0);
  expect_usage_error(args + " --draft-head int4", "--draft-head must be auto, fp8 or target, got 'int4'");
}

// MTP layers whose drafts are never accepted (the fixture's are random) are named on stderr, not left to look
// like speculation that happens not to pay; a trained layer's (the bundled model's) are not.
TEST(Cli, DraftsThatAreNeverAcceptedAreNamed) {
  const std::string warning = "warning: the MTP layers' drafts were accepted";
  const auto random =
      nextn("generate --model " + kFixture + " --ids 1,2,3,4 -n 80 --ignore-eos --speculative-tokens 3");
  ASSERT_EQ(random.status, 0) << random.err;
  EXPECT_NE(random.err.find(warning), std::string::npos) << random.err;
  const auto trained = nextn("generate --prompt 'def add(a, b):' -n 96 --ignore-eos --speculative-tokens 3");
  ASSERT_EQ(trained.status, 0) << trained.err;
  EXPECT_NE(trained.err.find("speculation:"), std::string::npos) << trained.err;
  EXPECT_EQ(trained.err.find(warning), std::string::npos) << trained.err;
}

TEST(Cli, TokenizeMatchesTheLibrary) {
  const std::string dir = std::string(NEXTN_SOURCE_DIR) + "/models/nextn-hy4-tiny";
  auto r = nextn("tokenize --model " + dir + " --text 'for i in range(10):'");
  ASSERT_EQ(r.status, 0) << r.err;
  Tokenizer tok = Tokenizer::from_dir(dir);
  auto want = tok.encode("for i in range(10):");
  EXPECT_EQ(nlohmann::json::parse(r.out).get<std::vector<int32_t>>(), want);
  auto d = nextn("detokenize --tokenizer " + dir + "/tokenizer.json --ids " + ids_arg(want));
  ASSERT_EQ(d.status, 0) << d.err;
  EXPECT_EQ(d.out, "for i in range(10):\n");
}

TEST(Cli, InspectExitCodeTellsLoadability) {
  auto ok = nextn("inspect " + kFixture);
  EXPECT_EQ(ok.status, 0) << ok.err;
  const std::string broken = ::testing::TempDir() + "/nextn_cli_broken";
  std::filesystem::create_directories(broken);
  std::filesystem::copy_file(kFixture + "/config.json", broken + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  SafetensorsWriter w;  // a checkpoint holding one tensor only
  std::vector<float> e(256 * 64, 0.0f);
  w.add_f32("model.embed_tokens.weight", {256, 64}, e.data());
  w.write(broken + "/model.safetensors");
  auto bad = nextn("inspect " + broken);
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE((bad.out + bad.err).find("model.layers.0.self_attn.q_a_proj.weight"), std::string::npos);
  EXPECT_NE((bad.out + bad.err).find("lacks"), std::string::npos);
  std::filesystem::remove_all(broken);
}

// Every integer option is range-checked as a 64-bit value: nothing is cut to 32 bits on the way (-n 4294967297
// once generated 1 token, --speculative-tokens 4294967298 ran with k = 2).
TEST(Cli, IntegerOptionsAreRangeChecked) {
  const std::string gen = "generate --model " + kFixture + " --ids 1,2 ";
  expect_usage_error(gen + "-n 4294967297", "--max-tokens must be in 0..2147483647, got 4294967297");
  expect_usage_error(gen + "-n 2147483648", "--max-tokens must be in 0..2147483647, got 2147483648");
  expect_usage_error(gen + "--max-tokens 99999999999999999999999", "--max-tokens must be in 0..2147483647");
  expect_usage_error(gen + "-n 5x", "--max-tokens expects an integer, got '5x'");
  expect_usage_error(gen + "--speculative-tokens 4294967298", "--speculative-tokens must be in 1..8, got 4294967298");
  expect_usage_error(gen + "--logprobs 4294967299", "--logprobs must be in 0..20, got 4294967299");
  expect_usage_error(gen + "--top-k -1", "--top-k must be in 0..");
  expect_usage_error(gen + "--top-k 4294967296", "--top-k must be in 0..2147483647, got 4294967296");
  expect_usage_error(gen + "--seed -1", "--seed must be in 0..18446744073709551615, got -1");
  expect_usage_error(gen + "--seed 18446744073709551616", "--seed must be in 0..18446744073709551615");
  expect_usage_error(gen + "--relaxed-acceptance 4294967297,0.1", "--relaxed-acceptance N must be in 1..");
  expect_usage_error(gen + "--relaxed-acceptance 3,x", "--relaxed-acceptance DELTA expects a number, got 'x'");
  expect_usage_error(gen + "--relaxed-acceptance 3,nan", "--relaxed-acceptance DELTA must be a finite number");
  for (const char* cmd : {"generate --ids 1,2", "logits --ids 1,2 --output /tmp/x.safetensors", "bench"}) {
    const std::string c = std::string(cmd) + " --model " + kFixture;
    expect_usage_error(c + " --threads -3", "--threads must be in 0..");
    expect_usage_error(c + " --threads 100000", "--threads must be in 0..");
    expect_usage_error(c + " --threads 4294967298", "--threads must be in 0..");
  }
  // The whole seed range is accepted, and --threads 0 means all cores (as --help says).
  auto r = nextn(gen + "-n 2 --temperature 1 --seed 18446744073709551615 --threads 0 --json");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(nextn("generate --help").out.find("0: every CPU this process may use"), std::string::npos);
}

TEST(Cli, RealOptionsAreRangeChecked) {
  const std::string gen = "generate --model " + kFixture + " --ids 1,2 ";
  expect_usage_error(gen + "--top-p 2", "--top-p must be a finite number in (0, 1], got 2");
  expect_usage_error(gen + "--top-p 0", "--top-p must be a finite number in (0, 1], got 0");
  expect_usage_error(gen + "--temperature -1", "--temperature must be a finite number >= 0, got -1");
  expect_usage_error(gen + "--temperature nan", "--temperature must be a finite number >= 0, got nan");
  expect_usage_error(gen + "--temperature inf", "--temperature must be a finite number >= 0, got inf");
  expect_usage_error(gen + "--temperature 1e39", "--temperature must be a finite number >= 0, got 1e39");
  expect_usage_error(gen + "--min-p -0.5", "--min-p must be a finite number in [0, 1]");
  expect_usage_error(gen + "--repetition-penalty 0", "--repetition-penalty must be a finite number > 0");
  expect_usage_error(gen + "--presence-penalty 3", "--presence-penalty must be a finite number in [-2, 2]");
  expect_usage_error(gen + "--adaptive 2", "--adaptive must be a finite number in [0, 1]");
  expect_usage_error(gen + "--temperature 0.5x", "--temperature expects a number, got '0.5x'");
}

// A temperature so small that logit / T overflows float behaves as its limit: the greedy tokens.
TEST(Cli, TinyTemperatureGivesTheGreedyTokens) {
  testing::Reference ref(kFixture);
  auto ids = ref.ids("input_ids");
  auto greedy = ref.ids("greedy_ids");
  for (const char* t : {"1e-38", "1e-45"}) {
    auto r = nextn("generate --model " + kFixture + " --ids " + ids_arg(ids) + " -n 6 --json --ignore-eos --temperature " +
                   t + " --seed 3");
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out)["ids"].get<std::vector<int32_t>>(),
              std::vector<int32_t>(greedy.begin(), greedy.begin() + 6)) << t;
  }
}

// bench checks every option before it measures anything (the bad --oracle-acceptance came after ~10 s).
TEST(Cli, BenchRefusesBadOptionsBeforeAnyWork) {
  const std::string bench = "bench --model " + kFixture + " ";
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"--oracle-acceptance 2", "--oracle-acceptance must be a finite number in [0, 1], got 2"},
           {"--oracle-acceptance 0.9,1.5", "--oracle-acceptance must be a finite number in [0, 1], got 1.5"},
           {"--oracle-acceptance 0.9,", "--oracle-acceptance expects a list like 0.9,0.8,0.7"},
           {"--repeats 0", "--repeats must be in 1..100, got 0"},
           {"--tokens 4294967297", "--tokens must be in 1.."},
           {"--prompt-tokens 0", "--prompt-tokens must be in 1.."},
           {"--tokens 300000", "max_position_embeddings"},
           {"--dtype fp8", "--dtype applies to --synthetic checkpoints only"},
           {"--mlp dense", "--mlp applies to --synthetic"},
           {"--layers 48", "--layers applies to --synthetic"},
           {"stray", "unexpected argument 'stray'"}}) {
    const auto r = nextn(bench + args + " --json");
    EXPECT_EQ(r.status, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << args << "\nstderr: " << r.err;
    EXPECT_EQ(r.out, "") << args;  // nothing measured
  }
  expect_usage_error("bench --synthetic --mlp wide", "--mlp must be moe or dense, got 'wide'");
  expect_usage_error("bench --synthetic --layers 0", "--layers must be in 1..128, got 0");
  expect_usage_error("bench --synthetic --layers 129", "--layers must be in 1..128, got 129");
}

// detokenize: an id outside the vocabulary is an error naming it and the vocabulary size (it was dropped).
TEST(Cli, DetokenizeRefusesIdsOutsideTheVocabulary) {
  auto r = nextn("detokenize --model " + kBundled + " --ids 71,99999");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("token id 99999"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("vocabulary size 2048"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
}

// A tokenizer.json whose ids run far past its entries is refused by name (it once allocated 16 GB).
TEST(Cli, TokenizerWithAnAbsurdIdIsALoadError) {
  auto j = nlohmann::json::parse(read_text(kBundled + "/tokenizer.json"));
  ASSERT_GE(j["added_tokens"].size(), 1u);
  j["added_tokens"][0]["id"] = 1000000000;
  const std::string path = ::testing::TempDir() + "/nextn_cli_bad_tokenizer_" + std::to_string(::getpid()) + ".json";
  write_text(path, j.dump());
  auto r = nextn("tokenize --tokenizer " + path + " --text hi");
  EXPECT_EQ(r.status, 1);
  for (const char* part : {"added_tokens[0].id", "1000000000", "far beyond the vocabulary"})
    EXPECT_NE(r.err.find(part), std::string::npos) << part << "\n" << r.err;
  std::filesystem::remove(path);
}

// logits --output never overwrites the checkpoint it reads, nor adds a .safetensors file to its folder.
TEST(Cli, LogitsRefusesToWriteIntoTheCheckpoint) {
  namespace fs = std::filesystem;
  const std::string dir = fixture_copy("logits_out");
  const std::string weights = read_text(dir + "/model.safetensors");
  const std::string link = dir + "_link.safetensors";
  fs::remove(link);
  fs::create_symlink(dir + "/model.safetensors", link);
  for (const auto& [out, message] : std::vector<std::pair<std::string, std::string>>{
           {dir + "/model.safetensors", "checkpoint folder"},
           {dir + "/extra.safetensors", "checkpoint folder"},
           {dir + "/config.json", "checkpoint's own file"},
           {link, "checkpoint's own file"}})
    expect_usage_error("logits --model " + dir + " --ids 1,2 --output " + out, message);
  EXPECT_EQ(read_text(dir + "/model.safetensors"), weights);
  EXPECT_FALSE(fs::exists(dir + "/extra.safetensors"));
  fs::remove(link);
  fs::remove_all(dir);
}

// An unusable generation_config.json is not fatal but is reported, naming the file and what is wrong.
TEST(Cli, MalformedGenerationConfigWarns) {
  const std::string dir = fixture_copy("gen_config");
  for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
           {"{\"num_speculative_tokens\": ", "not valid JSON"},
           {"[1, 2]", "not a JSON object"},
           {"{\"num_speculative_tokens\": \"4\"}", "num_speculative_tokens is \"4\", not an integer"},
           {"{\"num_speculative_tokens\": 4294967299}", "num_speculative_tokens 4294967299 is outside 1..8"}}) {
    write_text(dir + "/generation_config.json", text);
    auto r = nextn("generate --model " + dir + " --ids 1,2 -n 1 --json");
    EXPECT_EQ(r.status, 0) << text << "\n" << r.err;
    EXPECT_NE(r.err.find("warning: " + dir + "/generation_config.json: " + message), std::string::npos)
        << text << "\nstderr: " << r.err;
  }
  write_text(dir + "/generation_config.json", "{\"num_speculative_tokens\": 2}");
  auto ok = nextn("generate --model " + dir + " --ids 1,2 -n 1 --json");
  EXPECT_EQ(ok.status, 0) << ok.err;
  EXPECT_EQ(ok.err.find("warning"), std::string::npos) << ok.err;
  std::filesystem::remove_all(dir);
}

// Every command that runs or describes kernels says which SIMD target they use, and whether
// NEXTN_CPU_TARGET forced it.
TEST(Cli, CommandsReportTheCpuTarget) {
  const auto plain = nextn("generate --model " + kBundled + " --prompt 'def f' -n 2 --json");
  ASSERT_EQ(plain.status, 0) << plain.err;
  const auto stats = nlohmann::json::parse(plain.out)["stats"];
  EXPECT_EQ(stats["cpu_target"].get<std::string>(), ops::cpu_target_name());
  EXPECT_EQ(stats["cpu_target_forced"].get<bool>(), ops::cpu_target_forced());
  EXPECT_NE(plain.err.find(std::string("CPU kernels ") + ops::cpu_target_name()), std::string::npos) << plain.err;

  const auto forced = nextn_with("NEXTN_CPU_TARGET=scalar", "generate --model " + kBundled + " --prompt 'def f' -n 2 --json");
  ASSERT_EQ(forced.status, 0) << forced.err;
  const auto fstats = nlohmann::json::parse(forced.out)["stats"];
  const std::string scalar = fstats["cpu_target"].get<std::string>();
  EXPECT_TRUE(scalar == "SCALAR" || scalar == "EMU128") << scalar;
  EXPECT_TRUE(fstats["cpu_target_forced"].get<bool>());
  EXPECT_NE(forced.err.find("CPU kernels " + scalar + " (NEXTN_CPU_TARGET)"), std::string::npos) << forced.err;
  // The same tokens whichever target ran them (greedy; the kernels are exact to the fixtures on each).
  EXPECT_EQ(nlohmann::json::parse(forced.out)["ids"], nlohmann::json::parse(plain.out)["ids"]);

  const auto text = nextn_with("NEXTN_CPU_TARGET=scalar", "inspect " + kBundled);
  EXPECT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("CPU kernels:   " + scalar + " (NEXTN_CPU_TARGET)"), std::string::npos) << text.out;
  const auto json = nextn_with("NEXTN_CPU_TARGET=scalar", "inspect " + kBundled + " --json");
  ASSERT_EQ(json.status, 0) << json.err;
  const auto j = nlohmann::json::parse(json.out);
  EXPECT_EQ(j["cpu_target"].get<std::string>(), scalar);
  EXPECT_TRUE(j["cpu_target_forced"].get<bool>());
}

// --requests: many requests through the scheduler at once; one JSON line per request in input order, each the
// same as that request run alone with generate --json (greedy and seeded sampling), bad lines reported in
// place with their line number while the others run; a request larger than --kv-cache-mb is refused.
TEST(Cli, GenerateRequestsRunsManyAtOnceInInputOrder) {
  const std::string file = ::testing::TempDir() + "/nextn_requests_" + std::to_string(::getpid()) + ".jsonl";
  {
    std::ofstream f(file);
    f << R"({"prompt": "def fibonacci(n):", "max_tokens": 12})" << "\n"
      << R"({"ids": [1, 5, 9, 200, 31], "max_tokens": 8, "temperature": 0.8, "seed": 3})" << "\n"
      << "\n"
      << R"({"prompt": "The quick brown fox", "max_tokens": 10, "speculative_tokens": 0})" << "\n"
      << R"({"prompt": 5})" << "\n"
      << R"({"prompt": "import numpy as np", "max_tokens": 10, "speculative_tokens": 2, "ignore_eos": true})" << "\n";
  }
  const nextn::Run r = nextn("generate --model " + kBundled + " --requests " + file);
  EXPECT_EQ(r.status, 1) << "one request is invalid\n" << r.err;
  std::vector<nlohmann::json> lines;
  std::istringstream out(r.out);
  for (std::string l; std::getline(out, l);) lines.push_back(nlohmann::json::parse(l));
  ASSERT_EQ(lines.size(), 5u) << r.out;
  EXPECT_EQ(lines[3]["line"], 5);
  EXPECT_NE(lines[3]["error"].get<std::string>().find(":5: field 'prompt' must be a string"), std::string::npos);
  const char* alone[] = {"--prompt 'def fibonacci(n):' -n 12", "--ids 1,5,9,200,31 -n 8 --temperature 0.8 --seed 3",
                         "--prompt 'The quick brown fox' -n 10 --no-speculate",
                         "--prompt 'import numpy as np' -n 10 --speculative-tokens 2 --ignore-eos"};
  const int at[] = {0, 1, 2, 4};
  for (int i = 0; i < 4; ++i) {
    const nextn::Run one = nextn("generate --model " + kBundled + " --json " + alone[i]);
    ASSERT_EQ(one.status, 0) << one.err;
    const auto want = nlohmann::json::parse(one.out);
    EXPECT_EQ(lines[at[i]]["ids"], want["ids"]) << alone[i];
    EXPECT_EQ(lines[at[i]]["finish_reason"], want["finish_reason"]) << alone[i];
    if (want.contains("text")) {
      EXPECT_EQ(lines[at[i]]["text"], want["text"]) << alone[i];
    }
    EXPECT_TRUE(lines[at[i]]["stats"].contains("mean_acceptance_length"));
  }
  EXPECT_NE(r.err.find("5 requests (1 failed)"), std::string::npos) << r.err;

  // A pool of 1 MiB cannot hold a 3000-token request of the bundled model: refused, naming the flag.
  {
    std::ofstream f(file);
    f << R"({"prompt": "hello", "max_tokens": 3000})" << "\n" << R"({"prompt": "hello", "max_tokens": 4})" << "\n";
  }
  const nextn::Run small = nextn("generate --model " + kBundled + " --kv-cache-mb 1 --requests " + file);
  EXPECT_EQ(small.status, 1) << small.err;
  std::istringstream out2(small.out);
  std::string first, second;
  std::getline(out2, first);
  std::getline(out2, second);
  const auto e = nlohmann::json::parse(first);
  EXPECT_NE(e["error"].get<std::string>().find("more than the whole pool holds"), std::string::npos) << first;
  EXPECT_NE(e["error"].get<std::string>().find("--kv-cache-mb"), std::string::npos) << first;
  EXPECT_EQ(nlohmann::json::parse(second)["ids"].size(), 4u) << second;
  std::remove(file.c_str());
}

// OpenAI's logit_bias in --requests lines (the server parses it the same way): it changes the output (token 223
// starts the unbiased text; banned, it never appears), greedy speculation still gives plain decoding's tokens
// (drafts are biased alike), and a bad map is the line's error.
TEST(Cli, LogitBiasChangesTheOutputAndSpeculationKeepsIt) {
  const std::string file = ::testing::TempDir() + "/nextn_logit_bias_" + std::to_string(::getpid()) + ".jsonl";
  {
    const std::string base = R"("prompt": "def fibonacci(n):", "max_tokens": 32, "ignore_eos": true)";
    const std::string bias = R"(, "logit_bias": {"223": -100, "288": 1.5})";
    std::ofstream f(file);
    f << "{" << base << R"(, "speculative_tokens": 0)" << "}\n"
      << "{" << base << R"(, "speculative_tokens": 0)" << bias << "}\n"
      << "{" << base << R"(, "speculative_tokens": 3)" << bias << "}\n"
      << R"({"prompt": "x", "logit_bias": {"99999": 1}})" << "\n";
  }
  const nextn::Run r = nextn("generate --model " + kBundled + " --requests " + file);
  EXPECT_EQ(r.status, 1) << r.err;
  std::vector<nlohmann::json> lines;
  std::istringstream out(r.out);
  for (std::string l; std::getline(out, l);) lines.push_back(nlohmann::json::parse(l));
  ASSERT_EQ(lines.size(), 4u) << r.out;
  const auto plain = lines[0]["ids"].get<std::vector<int32_t>>(), biased = lines[1]["ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(plain.size(), 32u);
  ASSERT_EQ(plain[0], 223) << "the unbiased text starts with the token the bias bans";
  EXPECT_EQ(std::count(biased.begin(), biased.end(), 223), 0);
  EXPECT_EQ(lines[2]["ids"], lines[1]["ids"]) << "greedy speculation with a bias gives plain decoding's tokens";
  EXPECT_GT(lines[2]["stats"]["num_accepted_tokens"].get<int>(), 0);
  EXPECT_NE(lines[3]["error"].get<std::string>().find("'logit_bias' token id 99999 is outside the vocabulary"),
            std::string::npos) << lines[3];
  std::remove(file.c_str());
}

// --min-tokens: the stop id (981, the third token of the greedy text) cannot come before that many tokens; greedy
// speculation keeps plain decoding's tokens under it (drafts are banned alike); more than -n is a usage error.
TEST(Cli, MinTokensHoldsTheStopIdsBack) {
  const std::string args = "generate --model " + kBundled + " --prompt 'def fibonacci(n):' -n 24 --stop-id 981 --json";
  const auto stopped = nextn(args + " --no-speculate");
  ASSERT_EQ(stopped.status, 0) << stopped.err;
  const auto early = nlohmann::json::parse(stopped.out)["ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(early.size(), 3u) << stopped.out;
  ASSERT_EQ(early.back(), 981);
  const auto plain = nextn(args + " --min-tokens 10 --no-speculate");
  const auto spec = nextn(args + " --min-tokens 10 --speculative-tokens 3");
  ASSERT_EQ(plain.status, 0) << plain.err;
  ASSERT_EQ(spec.status, 0) << spec.err;
  const auto ids = nlohmann::json::parse(plain.out)["ids"].get<std::vector<int32_t>>();
  ASSERT_GE(ids.size(), 10u);
  EXPECT_EQ(std::count(ids.begin(), ids.begin() + 9, 981), 0);
  EXPECT_EQ(nlohmann::json::parse(spec.out)["ids"], nlohmann::json::parse(plain.out)["ids"]);
  expect_usage_error(args + " --min-tokens 30", "--min-tokens 30 is more than --max-tokens 24");
}

// Structured output from the CLI: generate --json-schema FILE equals the same request's line in a --requests
// file with response_format (and --json-schema is the default of the lines that have none); a schema keyword
// that would not be enforced is a usage error naming it, before the model loads.
TEST(Cli, StructuredOutputFromGenerateAndFromARequestsFile) {
  const std::string dir = ::testing::TempDir();
  const std::string schema_file = dir + "/nextn_schema_" + std::to_string(::getpid()) + ".json";
  const char* schema = R"({"type":"object","properties":{"name":{"type":"string","maxLength":8},"n":{"type":"integer"}},
    "required":["name","n"]})";
  std::ofstream(schema_file) << schema;
  const nextn::Run one = nextn("generate --model " + kBundled + " --json --prompt 'settings = ' -n 30 --json-schema " +
                               schema_file);
  ASSERT_EQ(one.status, 0) << one.err;
  const auto alone = nlohmann::json::parse(one.out);
  const std::string text = alone["text"].get<std::string>();
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text[0], '{') << text;
  if (alone["finish_reason"] == "stop") {
    EXPECT_TRUE(nlohmann::json::accept(text)) << text;
  }
  const std::string file = dir + "/nextn_requests_json_" + std::to_string(::getpid()) + ".jsonl";
  {
    std::ofstream f(file);
    nlohmann::ordered_json line = {{"prompt", "settings = "}, {"max_tokens", 30},
                                   {"response_format", {{"type", "json_schema"},
                                                        {"json_schema", {{"schema", nlohmann::ordered_json::parse(schema)}}}}}};
    f << line.dump() << "\n" << R"({"prompt": "settings = ", "max_tokens": 30})" << "\n"
      << R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"schema": {"pattern": "a"}}}})"
      << "\n";
  }
  const nextn::Run many = nextn("generate --model " + kBundled + " --requests " + file + " --json-schema " + schema_file);
  std::vector<nlohmann::json> lines;
  std::istringstream out(many.out);
  for (std::string l; std::getline(out, l);) lines.push_back(nlohmann::json::parse(l));
  ASSERT_EQ(lines.size(), 3u) << many.out << many.err;
  EXPECT_EQ(lines[0]["ids"], alone["ids"]);
  EXPECT_EQ(lines[1]["ids"], alone["ids"]) << "--json-schema is the default of a line without response_format";
  EXPECT_NE(lines[2]["error"].get<std::string>().find("'pattern' is not supported"), std::string::npos) << lines[2];
  std::ofstream(schema_file) << R"({"type":"integer","minimum":0})";
  const nextn::Run bad = nextn("generate --model " + kBundled + " --prompt x --json-schema " + schema_file);
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.err.find("at /minimum: the keyword 'minimum' is not supported"), std::string::npos) << bad.err;
  std::remove(file.c_str());
  std::remove(schema_file.c_str());
}

}  // namespace
}  // namespace nextn
