// One fixed pool of KV pages shared by every sequence of a model: memory is bounded by the pool, not by
// context × sequences. A page holds `page_tokens` consecutive positions of one sequence in every plane of
// the pool; a plane is one kind of per-position row (HY V4: a layer's MLA latent + rope key, or a layer's
// indexer key), stored as [pages × page_tokens, width] floats so that a position's row is addressed by its
// physical row index page · page_tokens + offset (the kernels gather rows by index).
//
// Pages are handed out in two steps: a cache *reserves* the pages it may ever need when it is created (the
// admission decision: it either fits or is refused up front), then *takes* them one by one as it grows.
// A reserved take cannot fail, so no forward ever runs out of KV memory mid-step.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace nextn {

class KVPool {
 public:
  // `what` names the pool in messages ("KV cache", "MTP draft KV cache"). Throws nextn::Error when the
  // sizes overflow or exceed this machine's memory, before allocating.
  KVPool(std::string what, std::vector<int64_t> plane_widths, int64_t page_tokens, int64_t pages);
  KVPool(const KVPool&) = delete;
  KVPool& operator=(const KVPool&) = delete;

  // The number of pages of `plane_widths` × `page_tokens` floats that fit in `bytes` (at least 0).
  static int64_t pages_in_bytes(const std::vector<int64_t>& plane_widths, int64_t page_tokens, int64_t bytes);
  static int64_t bytes_per_page(const std::vector<int64_t>& plane_widths, int64_t page_tokens);
  // Pages holding `positions` positions.
  int64_t pages_for(int64_t positions) const { return (positions + page_tokens_ - 1) / page_tokens_; }

  const std::string& what() const { return what_; }
  int64_t page_tokens() const { return page_tokens_; }
  int64_t pages() const { return pages_; }
  int64_t bytes() const { return pages_ * bytes_per_page(widths_, page_tokens_); }
  int64_t unreserved_pages() const { return pages_ - reserved_; }
  int64_t free_pages() const { return static_cast<int64_t>(free_.size()); }
  size_t num_planes() const { return widths_.size(); }
  int64_t plane_width(size_t p) const { return widths_[p]; }
  float* plane(size_t p) { return planes_[p].get(); }
  const float* plane(size_t p) const { return planes_[p].get(); }

  // "KV cache 1.2 GiB (64 pages of 64 positions, 3 reserved)", for memory summaries.
  std::string describe() const;
  // Sets `n` pages aside for one cache; false (nothing reserved) when fewer than n are unreserved.
  bool try_reserve(int64_t n);
  void unreserve(int64_t n);
  // One free page (of those reserved by the caller). Throws nextn::Error only on a bookkeeping bug.
  int32_t take_page();
  void return_page(int32_t page);

 private:
  std::string what_;
  std::vector<int64_t> widths_;
  int64_t page_tokens_ = 0, pages_ = 0, reserved_ = 0;
  std::vector<std::unique_ptr<float[]>> planes_;
  std::vector<int32_t> free_;  // a stack of free page ids (sized once: returning never allocates)
};

}  // namespace nextn
