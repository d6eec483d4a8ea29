// One sequence's attention cache: a page table into a KVPool shared with other sequences.
//
// HY V4 caches, per layer, the MLA latent (kv_a_layernorm output, [kv_lora]) and the rotated shared key
// ([rope]) of every position side by side — 1/(2·heads) of the expanded K/V — plus the DSA indexer key
// ([index_head_dim]) for layers that run their own indexer. Each is a plane of the pool; a layer names its
// planes. Slot i (the i-th cached position) lives at physical row physical(i) of every plane.
//
// Rollback is O(1): truncate(n) forgets slots >= n and keeps their pages for the next rows (speculative
// drafts that were rejected). The pages a cache may use are reserved in the pool when it is created and
// returned when it is destroyed.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/error.h"
#include "memory/kv_pool.h"

namespace nextn {

// Where one attention layer's rows live in the pool.
struct LayerPlanes {
  int key_plane = -1;    // [kv_lora + rope] per position
  int index_plane = -1;  // [index_dim] per position; -1 for layers that share another's top-k
};

class KVCache {
 public:
  KVCache() = default;
  // A cache of up to `capacity` positions over `pool`'s planes: reserves ceil(capacity / page) pages, or
  // throws nextn::Error saying how many the pool has left.
  KVCache(std::shared_ptr<KVPool> pool, std::vector<LayerPlanes> layers, int64_t capacity);
  ~KVCache();
  KVCache(KVCache&& o) noexcept;
  KVCache& operator=(KVCache&& o) noexcept;
  KVCache(const KVCache&) = delete;
  KVCache& operator=(const KVCache&) = delete;

  int64_t length() const { return length_; }
  // Absolute position of slot 0 (0 for the target; MTP layer j's canonical entries start at position j).
  int64_t base_position() const { return base_position_; }
  void set_base_position(int64_t p) { base_position_ = p; }
  int64_t capacity() const { return capacity_; }
  // Forget positions >= n (speculative rollback). n must not exceed the current length.
  void truncate(int64_t n);
  // Throws when `extra` more positions would not fit.
  void check_room(int64_t extra) const;
  // Makes slots [length, length + extra) writable (takes pages from the reservation; never allocates).
  void prepare(int64_t extra);
  void advance(int64_t n) { length_ += n; }

  size_t num_layers() const { return layers_.size(); }
  bool has_index(size_t layer) const { return layers_[layer].index_plane >= 0; }
  int64_t key_width(size_t layer) const { return pool_->plane_width(layers_[layer].key_plane); }
  int64_t index_dim(size_t layer) const { return has_index(layer) ? pool_->plane_width(layers_[layer].index_plane) : 0; }
  // Physical row of slot i in every plane (slot i must be prepared).
  int32_t physical(int64_t slot) const {
    return static_cast<int32_t>(int64_t(table_[slot / page_tokens_]) * page_tokens_ + slot % page_tokens_);
  }
  // The first slot after slot i's page: slots [i, page_end(i)) are physically contiguous.
  int64_t page_end(int64_t slot) const { return (slot / page_tokens_ + 1) * page_tokens_; }
  // Plane bases; rows are addressed by physical().
  const float* keys(size_t layer) const { return pool_->plane(layers_[layer].key_plane); }
  const float* index_keys(size_t layer) const { return pool_->plane(layers_[layer].index_plane); }
  float* key_row(size_t layer, int64_t slot) {
    return pool_->plane(layers_[layer].key_plane) + int64_t(physical(slot)) * key_width(layer);
  }
  float* index_row(size_t layer, int64_t slot) {
    return pool_->plane(layers_[layer].index_plane) + int64_t(physical(slot)) * index_dim(layer);
  }
  const KVPool* pool() const { return pool_.get(); }
  // What a device mirror of the pool needs (models/hy_v4/cuda_blocks.cpp): the pool itself, the page table
  // (entry i: the page of slots [i·page, (i+1)·page), valid for prepared slots) and the page size.
  const std::shared_ptr<KVPool>& shared_pool() const { return pool_; }
  const int32_t* page_table() const { return table_.data(); }
  int64_t page_tokens() const { return page_tokens_; }
  const LayerPlanes& layer_planes(size_t layer) const { return layers_[layer]; }

 private:
  void release();
  std::shared_ptr<KVPool> pool_;
  std::vector<LayerPlanes> layers_;
  std::vector<int32_t> table_;  // page of slots [i·page, (i+1)·page); reserved to its full size up front
  int64_t page_tokens_ = 1, reserved_ = 0;
  int64_t capacity_ = 0, length_ = 0, base_position_ = 0;
};

}  // namespace nextn
