// Helpers shared by the end-to-end tests: fixture paths and reference tensors.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "models/hy_v4/model.h"

namespace nextn::testing {

inline std::string fixture_dir(const std::string& name) {
  return std::string(NEXTN_SOURCE_DIR) + "/tests/fixtures/hy_v4/" + name;
}
inline std::string qwen4_exp_fixture_dir(const std::string& name) {
  return std::string(NEXTN_SOURCE_DIR) + "/tests/fixtures/qwen4_exp/" + name;
}
// "family/name" under tests/fixtures (test parameters that span both families).
inline std::string fixture_path(const std::string& family_and_name) {
  return std::string(NEXTN_SOURCE_DIR) + "/tests/fixtures/" + family_and_name;
}
// A test name from a fixture path: its last two components, non-alphanumerics as '_'.
inline std::string fixture_test_name(const std::string& path) {
  const size_t last = path.find_last_of('/');
  const size_t prev = last == std::string::npos || last == 0 ? std::string::npos : path.find_last_of('/', last - 1);
  std::string name = prev == std::string::npos ? path : path.substr(prev + 1);
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return name;
}

// Reference tensors recorded by tools/fixtures/make_hy_v4_fixtures.py.
class Reference {
 public:
  explicit Reference(const std::string& dir) : file_(dir + "/reference.safetensors") {}
  bool has(const std::string& name) const { return file_.find(name) != nullptr; }
  std::vector<float> f32(const std::string& name) const {
    const TensorView* t = file_.find(name);
    if (!t) throw std::runtime_error("reference lacks " + name);
    std::vector<float> v(t->numel());
    convert_to_f32(t->dtype, t->data, v.data(), v.size());
    return v;
  }
  std::vector<int32_t> ids(const std::string& name) const {
    const TensorView* t = file_.find(name);
    if (!t) throw std::runtime_error("reference lacks " + name);
    const int64_t* p = static_cast<const int64_t*>(t->data);
    return std::vector<int32_t>(p, p + t->numel());
  }

 private:
  SafetensorsFile file_;
};

struct Diff {
  double max_abs = 0, max_ref = 0;
  int64_t argmax_mismatches = 0, first_mismatch_row = -1;
  double rel() const { return max_ref > 0 ? max_abs / max_ref : max_abs; }
};

// Compares [rows, cols] matrices: max |Δ|, max |ref| and per-row argmax agreement.
inline Diff compare(const float* got, const float* ref, int64_t rows, int64_t cols) {
  Diff d;
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = got + r * cols;
    const float* f = ref + r * cols;
    for (int64_t i = 0; i < cols; ++i) {
      d.max_abs = std::max(d.max_abs, double(std::fabs(g[i] - f[i])));
      d.max_ref = std::max(d.max_ref, double(std::fabs(f[i])));
    }
    if (std::max_element(g, g + cols) - g != std::max_element(f, f + cols) - f) {
      if (d.first_mismatch_row < 0) d.first_mismatch_row = r;
      ++d.argmax_mismatches;
    }
  }
  return d;
}

// Prefill of `prompt`, then the first n tokens of `next` one row at a time except for a 4-row step at the
// second position (as a verification runs): every row's logits must equal `full`, the logits of one
// forward over prompt + next ([T + n, V]), bit for bit. `what` labels the failures.
inline void expect_steps_bit_identical(HYV4Model& m, const std::vector<int32_t>& prompt,
                                       const std::vector<int32_t>& next, int64_t n, const std::vector<float>& full,
                                       const std::string& what) {
  const int64_t T = static_cast<int64_t>(prompt.size()), V = m.config().vocab_size;
  KVCache cache = m.new_cache(T + n);
  std::vector<float> out(T * V);
  m.forward(prompt.data(), T, cache, out.data(), nullptr, true);
  EXPECT_EQ(0, std::memcmp(out.data(), full.data(), T * V * sizeof(float))) << what << ": prefill";
  for (int64_t i = 0; i < n;) {
    const int64_t rows = i == 1 ? std::min<int64_t>(4, n - i) : 1;
    m.forward(&next[i], rows, cache, out.data(), nullptr, true);
    for (int64_t r = 0; r < rows; ++r)
      ASSERT_EQ(0, std::memcmp(out.data() + r * V, full.data() + (T + i + r) * V, V * sizeof(float)))
          << what << ": position " << T + i + r << " (step of " << rows << " rows)";
    i += rows;
  }
}

// Logits [T, V] and hidden [T, H] of one forward of m over `prompt` (a new sequence, every row's logits).
inline void run_prompt(Model& m, const std::vector<int32_t>& prompt, std::vector<float>& logits,
                       std::vector<float>& hidden) {
  const int64_t T = int64_t(prompt.size()), V = m.facts().vocab_size, H = m.facts().hidden_width;
  logits.assign(size_t(T * V), 0.0f);
  hidden.assign(size_t(T * H), 0.0f);
  auto seq = m.new_sequence(T);
  const BatchSegment seg{seq.get(), prompt.data(), T, true, nullptr};
  m.forward(&seg, 1, logits.data(), hidden.data());
}

// The prompt's rows from `first` on, read as their argmax only (greedy decode and verify): the ids must be those
// of the whole rows' largest values (run_prompt's logits), and the logits buffer must stay unwritten (a
// tensor-parallel group then gathers each rank's best, never the logits).
inline void expect_greedy_ids_without_logits(Model& m, const std::vector<int32_t>& prompt, int64_t first) {
  const int64_t T = int64_t(prompt.size()), V = m.facts().vocab_size;
  std::vector<float> whole, hidden;
  run_prompt(m, prompt, whole, hidden);
  auto seq = m.new_sequence(T);
  BatchSegment seg{seq.get(), prompt.data(), first, false, nullptr};
  m.forward(&seg, 1, nullptr, nullptr);
  std::vector<float> untouched(size_t((T - first) * V), std::numeric_limits<float>::quiet_NaN());
  std::vector<int32_t> ids(size_t(T - first), -7);
  seg = {seq.get(), prompt.data() + first, T - first, true, ids.data()};
  m.forward(&seg, 1, untouched.data(), nullptr);
  for (int64_t r = 0; r < T - first; ++r) {
    const float* l = whole.data() + (first + r) * V;
    EXPECT_EQ(ids[size_t(r)], std::max_element(l, l + V) - l) << r;
  }
  EXPECT_TRUE(std::all_of(untouched.begin(), untouched.end(), [](float x) { return std::isnan(x); }));
}

}  // namespace nextn::testing
