// Where a forward pass spends its wall time, by section (NEXTN_PROFILE=1 in the environment): a timed
// span adds its duration to its section's total; `nextn bench` and `nextn generate` print the totals at the
// end. When the variable is unset a span costs one predictable branch.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>

namespace nextn::profile {

// A section is a small id a model registers by name once (its forward's parts are its own business):
//   const profile::Section kAttention = profile::section("attention");
using Section = int;
constexpr int kMaxSections = 32;
// The id of the section called `name` (registered on first use, in report order); thread-safe.
Section section(const char* name);

bool enabled();
void add(Section s, double seconds);
// Prints one line per section (total ms, share, per `per` units of work, e.g. tokens) to f; clears.
void report(std::FILE* f, const char* unit, double per);
void clear();

// Times consecutive sections until destroyed: next() closes the current one and opens another (a single
// section is just a Sections that never calls next()).
class Sections {
 public:
  explicit Sections(Section first) : s_(first), on_(enabled()) {
    if (on_) t0_ = std::chrono::steady_clock::now();
  }
  void next(Section s) {
    if (on_) {
      const auto t = std::chrono::steady_clock::now();
      if (!paused_) add(s_, std::chrono::duration<double>(t - t0_).count());
      t0_ = t;
    }
    s_ = s;
    paused_ = false;
  }
  // Closes the current section without opening another (time until the next next() goes nowhere: e.g. a
  // forward whose blocks time themselves).
  void pause() {
    next(s_);
    paused_ = true;
  }
  ~Sections() {
    if (on_ && !paused_) add(s_, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count());
  }
  Sections(const Sections&) = delete;
  Sections& operator=(const Sections&) = delete;

 private:
  Section s_;
  bool on_;
  bool paused_ = false;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace nextn::profile
