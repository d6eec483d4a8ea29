#include "memory/kv_cache.h"

#include <string>
#include <utility>

namespace nextn {

KVCache::KVCache(std::shared_ptr<KVPool> pool, std::vector<LayerPlanes> layers, int64_t capacity)
    : pool_(std::move(pool)), layers_(std::move(layers)), page_tokens_(pool_->page_tokens()), capacity_(capacity) {
  if (capacity_ < 0) throw Error(pool_->what() + ": negative capacity");
  const int64_t pages = pool_->pages_for(capacity_);
  if (!pool_->try_reserve(pages))
    throw Error(pool_->what() + " is full: a sequence of " + std::to_string(capacity_) + " positions needs " +
                std::to_string(pages) + " pages of " + std::to_string(page_tokens_) + " positions, " +
                std::to_string(pool_->unreserved_pages()) + " of " + std::to_string(pool_->pages()) +
                " are not reserved by other sequences");
  reserved_ = pages;
  table_.reserve(static_cast<size_t>(pages));
}

void KVCache::release() {
  if (!pool_) return;
  for (int32_t p : table_) pool_->return_page(p);
  pool_->unreserve(reserved_);
  table_.clear();
  reserved_ = 0;
  pool_.reset();
}

KVCache::~KVCache() { release(); }

KVCache::KVCache(KVCache&& o) noexcept
    : pool_(std::move(o.pool_)), layers_(std::move(o.layers_)), table_(std::move(o.table_)),
      page_tokens_(o.page_tokens_), reserved_(o.reserved_), capacity_(o.capacity_), length_(o.length_),
      base_position_(o.base_position_) {
  o.reserved_ = 0;
  o.table_.clear();
}

KVCache& KVCache::operator=(KVCache&& o) noexcept {
  if (this != &o) {
    release();
    pool_ = std::move(o.pool_);
    layers_ = std::move(o.layers_);
    table_ = std::move(o.table_);
    page_tokens_ = o.page_tokens_;
    reserved_ = o.reserved_;
    capacity_ = o.capacity_;
    length_ = o.length_;
    base_position_ = o.base_position_;
    o.reserved_ = 0;
    o.table_.clear();
  }
  return *this;
}

void KVCache::truncate(int64_t n) {
  if (n < 0 || n > length_)
    throw Error("KVCache::truncate: length " + std::to_string(n) + " outside [0, " + std::to_string(length_) + "]");
  length_ = n;
}

void KVCache::check_room(int64_t extra) const {
  if (length_ + extra > capacity_)
    throw Error("context length exceeded: " + std::to_string(length_ + extra) + " tokens, cache holds " +
                std::to_string(capacity_));
}

void KVCache::prepare(int64_t extra) {
  check_room(extra);
  const int64_t need = pool_ ? pool_->pages_for(length_ + extra) : 0;
  while (int64_t(table_.size()) < need) table_.push_back(pool_->take_page());
}

}  // namespace nextn
