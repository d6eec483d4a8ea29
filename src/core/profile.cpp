#include "core/profile.h"

#include <cstdlib>
#include <string_view>

namespace nextn::profile {
namespace {
double g_seconds[kSectionCount] = {};
int64_t g_calls[kSectionCount] = {};
const char* const kNames[kSectionCount] = {"hyper-connections", "projections", "indexer", "attention", "o_proj",
                                           "router",            "experts",     "dense mlp", "lm_head"};
}  // namespace

bool enabled() {
  static const bool on = [] {
    const char* v = std::getenv("NEXTN_PROFILE");
    return v != nullptr && std::string_view(v) != "0" && std::string_view(v) != "";
  }();
  return on;
}

// Sections are entered by the thread that drives the forward pass only (never inside pool chunks).
void add(Section s, double seconds) {
  g_seconds[s] += seconds;
  ++g_calls[s];
}

void clear() {
  for (int i = 0; i < kSectionCount; ++i) g_seconds[i] = 0.0, g_calls[i] = 0;
}

void report(std::FILE* f, const char* unit, double per) {
  double total = 0.0;
  for (double v : g_seconds) total += v;
  if (total <= 0.0) return;
  std::fprintf(f, "profile (NEXTN_PROFILE): %.1f ms in forward sections", total * 1e3);
  if (per > 0) std::fprintf(f, ", %.3f ms per %s", total * 1e3 / per, unit);
  std::fprintf(f, "\n");
  for (int i = 0; i < kSectionCount; ++i) {
    if (g_calls[i] == 0) continue;
    std::fprintf(f, "  %-18s %9.2f ms  %5.1f%%", kNames[i], g_seconds[i] * 1e3, 100.0 * g_seconds[i] / total);
    if (per > 0) std::fprintf(f, "  %8.3f ms per %s", g_seconds[i] * 1e3 / per, unit);
    std::fprintf(f, "\n");
  }
  clear();
}

}  // namespace nextn::profile
