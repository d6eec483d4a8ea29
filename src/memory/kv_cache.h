// Per-sequence attention state. HY V4 caches the MLA latent (kv_a_layernorm output, [kv_lora]) and the
// rotated shared key ([rope]) of every position — 1/(2·heads) of the expanded K/V — plus the DSA
// indexer key ([index_head_dim]) for layers that run their own indexer. Attention reads the latent
// directly (absorbed MLA), so nothing is expanded per position.
//
// Truncation is O(1): positions >= n are simply forgotten (speculative rollback). Recurrent models
// (Qwen4-Exp's Gated DeltaNet) will add a state kind that keeps per-position checkpoints instead.
#pragma once
#include <cstdint>
#include <vector>

#include "core/error.h"

namespace nextn {

struct LayerCache {
  int64_t kv_lora = 0, rope = 0, index_dim = 0;
  // [capacity, kv_lora + rope]: a position's latent, then its rotated shared key, side by side so that
  // attention reads (or gathers) one contiguous key row per position.
  std::vector<float> keys;
  int64_t key_width() const { return kv_lora + rope; }
  std::vector<float> index_k;  // [capacity, index_dim]; empty for layers that share another's top-k
};

class KVCache {
 public:
  KVCache() = default;
  KVCache(int64_t capacity, std::vector<LayerCache> layers) : capacity_(capacity), layers_(std::move(layers)) {}

  int64_t length() const { return length_; }
  // Absolute position of slot 0 (0 for the target; MTP layer j's canonical entries start at position j).
  int64_t base_position() const { return base_position_; }
  void set_base_position(int64_t p) { base_position_ = p; }
  int64_t capacity() const { return capacity_; }
  // Forget positions >= n (speculative rollback). n must not exceed the current length.
  void truncate(int64_t n) {
    if (n < 0 || n > length_) throw Error("KVCache::truncate: length " + std::to_string(n) + " outside [0, " +
                                          std::to_string(length_) + "]");
    length_ = n;
  }
  // Throws when `extra` more positions would not fit.
  void check_room(int64_t extra) const {
    if (length_ + extra > capacity_)
      throw Error("context length exceeded: " + std::to_string(length_ + extra) + " tokens, cache holds " +
                  std::to_string(capacity_));
  }
  void advance(int64_t n) { length_ += n; }
  LayerCache& layer(size_t i) { return layers_[i]; }
  const LayerCache& layer(size_t i) const { return layers_[i]; }
  size_t num_layers() const { return layers_.size(); }

 private:
  int64_t capacity_ = 0, length_ = 0, base_position_ = 0;
  std::vector<LayerCache> layers_;
};

}  // namespace nextn
