#include "memory/kv_pool.h"

#include <limits>
#include <new>

#include "core/error.h"
#include "core/sizes.h"

namespace nextn {

int64_t KVPool::bytes_per_page(const std::vector<int64_t>& plane_widths, int64_t page_tokens) {
  int64_t floats = 0;
  for (int64_t w : plane_widths) floats = checked_add(floats, checked_mul(w, page_tokens, "KV page"), "KV page");
  return checked_mul(floats, int64_t(sizeof(float)), "KV page");
}

int64_t KVPool::pages_in_bytes(const std::vector<int64_t>& plane_widths, int64_t page_tokens, int64_t bytes) {
  const int64_t per = bytes_per_page(plane_widths, page_tokens);
  return per > 0 && bytes > 0 ? bytes / per : 0;
}

KVPool::KVPool(std::string what, std::vector<int64_t> plane_widths, int64_t page_tokens, int64_t pages)
    : what_(std::move(what)), widths_(std::move(plane_widths)), page_tokens_(page_tokens), pages_(pages) {
  if (page_tokens_ < 1 || pages_ < 0) throw Error(what_ + ": page size must be >= 1 and page count >= 0");
  // Physical rows are int32 indices for the gather kernels.
  const int64_t rows = checked_mul(pages_, page_tokens_, what_);
  if (rows > std::numeric_limits<int32_t>::max())
    throw Error(what_ + " of " + std::to_string(rows) + " positions: more than 2^31 - 1 (make it smaller)");
  const int64_t total = checked_mul(pages_, bytes_per_page(widths_, page_tokens_), what_);
  require_memory(total, "a " + what_ + " pool of " + std::to_string(rows) + " positions");
  try {
    for (int64_t w : widths_)
      planes_.emplace_back(new float[static_cast<size_t>(checked_mul(rows, w, what_))]);  // touched as written
    free_.reserve(static_cast<size_t>(pages_));
  } catch (const std::bad_alloc&) {
    throw Error("cannot allocate a " + what_ + " pool of " + std::to_string(rows) + " positions (" + gib(total) + ")");
  }
  for (int64_t p = pages_ - 1; p >= 0; --p) free_.push_back(static_cast<int32_t>(p));  // page 0 taken first
}

bool KVPool::try_reserve(int64_t n) {
  if (n < 0 || n > unreserved_pages()) return false;
  reserved_ += n;
  return true;
}

void KVPool::unreserve(int64_t n) {
  if (n < 0 || n > reserved_) throw Error("internal: " + what_ + " unreserves more pages than it reserved");
  reserved_ -= n;
}

int32_t KVPool::take_page() {
  if (free_.empty()) throw Error("internal: " + what_ + " has no free page for a reservation");
  const int32_t p = free_.back();
  free_.pop_back();
  return p;
}

void KVPool::return_page(int32_t page) { free_.push_back(page); }

std::string KVPool::describe() const {
  return what_ + " " + gib(bytes()) + " (" + std::to_string(pages_) + " pages of " + std::to_string(page_tokens_) +
         " positions, " + std::to_string(pages_ - unreserved_pages()) + " reserved)";
}

}  // namespace nextn
