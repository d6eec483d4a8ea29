// What both families' CUDA backends (hy_v4/cuda_blocks, qwen4_exp/cuda_blocks) keep in device memory: the
// weights (uploaded once, as stored), workspace buffers that grow, and device mirrors of the host's KV pools.
// A mirror has the pool's planes with the same physical rows, so the host's page tables (uploaded with each
// forward) index both; the pool's allocator stays host code, and a rollback stays a change of length.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "memory/kv_cache.h"
#include "ops/cuda/cuda_ops.h"

namespace nextn {

// Throws nextn::Error unless a usable GPU has `bytes` free for the checkpoint in `dir` (use_device's check).
void require_device_room(const std::string& dir, size_t bytes);

// A model's weights on the device, found by their host twins: a Linear by its bytes, a vector by its data.
class DeviceWeights {
 public:
  void add(const Linear& w);               // (again, or without data: nothing)
  void add(const std::vector<float>& v);   // (likewise for an empty vector)
  const Linear& operator()(const Linear& w) const;            // throws for a weight not added (or of another shape)
  const float* operator()(const std::vector<float>& v) const; // null for an empty vector
  size_t bytes() const { return bytes_; }

 private:
  std::unordered_map<const void*, cuda::DeviceLinear> linears_;
  std::unordered_map<const float*, cuda::DeviceBuffer> vectors_;
  size_t bytes_ = 0;
};

// A device buffer of n elements of T, grown (never shrunk) to at least n: its address changes when it grows.
template <typename T>
T* grow_device(cuda::DeviceBuffer& b, int64_t n) {
  const size_t bytes = size_t(n > 1 ? n : 1) * sizeof(T);
  if (b.bytes() < bytes) {
    b = cuda::DeviceBuffer();  // (the old buffer freed before the new one is taken)
    b = cuda::DeviceBuffer(bytes);
  }
  return static_cast<T*>(b.get());
}

template <typename T>
T* device_as(const cuda::DeviceBuffer& b) {
  return static_cast<T*>(b.get());
}

// Planes of `rows` rows of widths[p] floats on the device, and `table`: their addresses (float*[planes]).
struct DevicePlanes {
  DevicePlanes(int64_t rows, std::vector<int64_t> widths);
  std::weak_ptr<KVPool> pool;  // the pool mirrored (none for scratch planes)
  int64_t rows = 0;
  std::vector<int64_t> widths;
  std::vector<cuda::DeviceBuffer> planes;
  cuda::DeviceBuffer table;
};

// Scratch planes for a forward's padding rows (forward_graphs.h, padded_forward_rows): planes shaped as a
// cache's pool's, one page of `rows` slots, one set per plane layout, kept for good (forwards of the target's
// and the MTP layers' layouts alternate; no graph holds their address: each forward uploads it with its page
// tables, so a new layout only adds one).
class PaddingPlanes {
 public:
  explicit PaddingPlanes(int64_t rows) : rows_(rows) {}
  DevicePlanes& like(const KVCache& cache);
  int64_t rows() const { return rows_; }

 private:
  int64_t rows_;
  std::vector<std::unique_ptr<DevicePlanes>> sets_;
};

class KVMirrors {
 public:
  // The mirror of cache's pool, made at its first use (remade if the pool was replaced or resized).
  DevicePlanes& of(const KVCache& cache);
  void drop_expired();  // mirrors of pools that are gone

 private:
  std::unordered_map<const KVPool*, std::unique_ptr<DevicePlanes>> mirrors_;
};

}  // namespace nextn
