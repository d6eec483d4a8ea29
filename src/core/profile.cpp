#include "core/profile.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>

namespace nextn::profile {
namespace {
double g_seconds[kMaxSections] = {};
int64_t g_calls[kMaxSections] = {};
const char* g_names[kMaxSections] = {};
int g_count = 0;
std::mutex g_names_mutex;
}  // namespace

Section section(const char* name) {
  const std::lock_guard<std::mutex> lock(g_names_mutex);
  for (int i = 0; i < g_count; ++i)
    if (std::strcmp(g_names[i], name) == 0) return i;
  if (g_count == kMaxSections) return kMaxSections - 1;  // (shares the last slot rather than failing)
  g_names[g_count] = name;
  return g_count++;
}

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
  for (int i = 0; i < kMaxSections; ++i) g_seconds[i] = 0.0, g_calls[i] = 0;
}

void report(std::FILE* f, const char* unit, double per) {
  double total = 0.0;
  for (double v : g_seconds) total += v;
  if (total <= 0.0) return;
  std::fprintf(f, "profile (NEXTN_PROFILE): %.1f ms in profiled sections", total * 1e3);
  if (per > 0) std::fprintf(f, ", %.3f ms per %s", total * 1e3 / per, unit);
  std::fprintf(f, "\n");
  for (int i = 0; i < g_count; ++i) {
    if (g_calls[i] == 0) continue;
    std::fprintf(f, "  %-18s %9.2f ms  %5.1f%%", g_names[i], g_seconds[i] * 1e3, 100.0 * g_seconds[i] / total);
    if (per > 0) std::fprintf(f, "  %8.3f ms per %s", g_seconds[i] * 1e3 / per, unit);
    std::fprintf(f, "\n");
  }
  clear();
}

}  // namespace nextn::profile
