// What both families' CUDA backends (hy_v4/cuda_blocks, qwen4_exp/cuda_blocks) keep in device memory: the
// weights (uploaded once, as stored), workspace buffers that grow, and device mirrors of the host's KV pools.
// A mirror has the pool's planes with the same physical rows, so the host's page tables (uploaded with each
// forward) index both; the pool's allocator stays host code, and a rollback stays a change of length.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "memory/kv_cache.h"
#include "models/common/tensor_split.h"
#include "ops/cuda/cuda_collectives.h"
#include "ops/cuda/cuda_nn.h"
#include "ops/cuda/cuda_ops.h"

namespace nextn {

class Communicator;
struct RankBest;

// Throws nextn::Error unless a usable GPU has `bytes` free for the checkpoint in `dir` (use_device's check).
void require_device_room(const std::string& dir, size_t bytes);

// A tensor-parallel rank's move to its GPU (rank r on GPU r mod the GPUs this process sees), once that GPU has
// room for `bytes` of the checkpoint in `dir`: its device collectives over `host` (collective: every rank calls
// it at once; cuda::device_communicator).
std::unique_ptr<cuda::DeviceCommunicator> join_gpu_group(Communicator& host, const std::string& dir, size_t bytes);

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

 private:
  int64_t rows_;
  std::vector<std::unique_ptr<DevicePlanes>> sets_;
};

// A CUDA backend's two sets of forward buffers (both families' cuda_blocks): the steps' (decode, verify and draft
// forwards of up to graph_rows() rows, whose CUDA graphs hold their addresses: they grow only as far as reserve()
// or those forwards take them) and one for longer forwards (a batch's prompts), which run eagerly: a prompt
// longer than any step never makes the steps' graphs be forgotten (at 64 sequences their 4096-row prefill did,
// in every bench pass). A tensor-parallel rank keeps to the steps' set: its collectives' buffers grow with it
// and the graphs hold them. W: the family's workspace (complete where the members are used).
template <class W>
class GraphWorkspaces {
 public:
  // The set a forward of S rows (padding included) runs in.
  W* for_forward(int64_t S, bool tensor_parallel) {
    return S > graph_rows_ && !tensor_parallel ? long_.get() : graph_.get();
  }
  // The steps' set, which then holds forwards of up to `rows` rows (a reservation).
  W* for_steps(int64_t rows) {
    graph_rows_ = std::max(graph_rows_, rows);
    return graph_.get();
  }
  bool graphs_hold(const W* w) const { return w == graph_.get(); }
  W* reset() {  // (both sets empty; the steps')
    graph_ = std::make_unique<W>();
    long_ = std::make_unique<W>();
    return graph_.get();
  }

 private:
  static constexpr int64_t kMinGraphRows = 256;
  std::unique_ptr<W> graph_ = std::make_unique<W>(), long_ = std::make_unique<W>();
  int64_t graph_rows_ = kMinGraphRows;
};

// A forward's output rows read back to the host. A read of all of them goes straight to its destination; reads
// of parts (an MTP forward's, one per sequence) come from one copy of the rows, made at the first: each copy
// waits for the device, and one a sequence cost more than the forward at 64 sequences.
class HostRows {
 public:
  void reserve(int64_t floats) { staged_.reserve(size_t(floats)); }
  void forget() { valid_ = false; }  // (at a forward's start)
  // rows [first, first + n) of the forward's `total` rows of `width` floats at `device` into out.
  void read(const float* device, int64_t width, int64_t total, int64_t first, int64_t n, float* out);

 private:
  std::vector<float> staged_;
  bool valid_ = false;
};

// What a family's CUDA blocks need to be one rank of a tensor-parallel group (docs/parallel.md; the CPU's twin
// is TensorParallelRank): the device collectives, every rank's vocabulary rows, and the gathers' buffers.
//   sum     a block's partial output summed over the ranks in rank order (gathered, then cuda::sum_ranks)
//   embed   tokens this rank does not own are -1 (zero rows), so that the sum moves each row from its owner
//   logits  each rank's vocabulary part of lm_head, gathered and laid side by side into whole rows
//   argmax  greedy rows: each rank's best (value, id) per row of its part, gathered; no logits cross the ranks
class DeviceRank {
 public:
  // comm null: one rank. Throws unless vocab has a range per rank.
  void set(cuda::DeviceCommunicator* comm, std::vector<UnitRange> vocab);
  bool active() const { return comm_ != nullptr; }
  // Whether the collectives may be recorded in CUDA graphs (host-staged ones wait for the device).
  bool capturable() const { return !comm_ || comm_->capturable(); }
  // The gathers of `rows` rows of `hidden` floats and of the logits' parts (their addresses change when they
  // grow: called where the workspace grows, whose graphs are then forgotten).
  void reserve(int64_t rows, int64_t hidden);
  int32_t local_token(int32_t token) const;  // its row of this rank's embedding part (-1: another rank's)
  void sum(float* y, int64_t count);         // y [count] (device) = the ranks' y added in rank order
  // logits [rows, V] (device) = lm_head(x [rows, H]) with `part` this rank's vocabulary rows (uploaded).
  void logits(const Linear& part, const float* x, int64_t rows, int64_t V, float* logits);
  // ids [rows] (host) = finite_argmax of each row of lm_head(x) over the whole vocabulary (-1: a NaN or inf).
  void argmax(const Linear& part, const float* x, int64_t rows, int32_t* ids);

 private:
  cuda::DeviceCommunicator* comm_ = nullptr;
  std::vector<UnitRange> vocab_;
  cuda::DeviceBuffer gather_, part_;  // [ranks, rows, max(hidden, widest part)], [rows, widest part]
  cuda::DeviceBuffer best_, best_all_;  // argmax: [rows], [ranks, rows] of RankBest
  std::vector<RankBest> host_best_;     // ... the latter on the host
};

// Logit rows on the device to the host (both families' lm_head read-backs): the greedy rows' (`by_id`) argmax,
// computed on the device (finite_argmax's rule), comes back as ids, the others' rows in as few copies as runs of
// consecutive such rows (each copy waits for the device).
class LogitRows {
 public:
  // rows [0, rows) of logits [rows, V] on the device: by_id(r) -> ids()[r], else -> out[r, :].
  void read(const float* logits, int64_t rows, int64_t V, float* out);
  const std::vector<int32_t>& ids() const { return ids_; }
  // Whether every one of `rows` rows is read as its id (then the ids may come from elsewhere: ids_for).
  bool all_by_id(int64_t rows) const;
  int32_t* ids_for(int64_t rows);
  // by_id from a forward's spans: the logit rows of a span with `argmax` (every row of an all_logits span,
  // else its last), and after read(), each such span's ids into its argmax.
  template <typename RowSpan>
  void mark_greedy(const std::vector<RowSpan>& spans, int64_t rows);
  template <typename RowSpan>
  void deliver_ids(const std::vector<RowSpan>& spans) const;
  // by_id for rows of which the first `greedy` are read as ids (a drafter's rows).
  void mark_first(int64_t rows, int64_t greedy);

 private:
  std::vector<uint8_t> by_id_;
  std::vector<int32_t> ids_;
  cuda::DeviceBuffer device_ids_;
};

template <typename RowSpan>
void LogitRows::mark_greedy(const std::vector<RowSpan>& spans, int64_t rows) {
  by_id_.assign(size_t(rows), 0);
  int64_t row = 0;
  for (const RowSpan& sp : spans) {
    const int64_t n = sp.all_logits ? sp.rows : 1;
    if (sp.argmax) std::fill(by_id_.begin() + row, by_id_.begin() + row + n, uint8_t(1));
    row += n;
  }
}

template <typename RowSpan>
void LogitRows::deliver_ids(const std::vector<RowSpan>& spans) const {
  int64_t row = 0;
  for (const RowSpan& sp : spans) {
    const int64_t n = sp.all_logits ? sp.rows : 1;
    if (sp.argmax) std::copy(ids_.begin() + row, ids_.begin() + row + n, sp.argmax);
    row += n;
  }
}

// The spans' last rows' selections (MTP forwards: the draft steps after step 0 reuse them) into each span's
// last_topk as positions (slot + its cache's base position), from the device's counts [S] and slots [S, stride]
// after the forward: the rows from the first such span's last to the last one's in two copies (host_count,
// host_sel: staging), not two per span: each copy waits for the device, and at 64 sequences 128 waits cost
// more than the MTP forward.
template <typename RowSpan>
void read_last_selections(const std::vector<RowSpan>& spans, const int32_t* count, const int32_t* slots,
                          int64_t stride, std::vector<int32_t>& host_count, std::vector<int32_t>& host_sel) {
  int64_t lo = -1, hi = -1;
  for (const RowSpan& sp : spans)
    if (sp.last_topk) {
      const int64_t last = sp.first_row + sp.rows - 1;
      lo = lo < 0 ? last : std::min(lo, last);
      hi = std::max(hi, last);
    }
  if (hi < 0) return;
  const int64_t n = hi - lo + 1;
  host_count.resize(size_t(n));
  host_sel.resize(size_t(n * stride));
  cuda::copy_to_host(host_count.data(), count + lo, size_t(n) * sizeof(int32_t));
  cuda::copy_to_host(host_sel.data(), slots + lo * stride, size_t(n * stride) * sizeof(int32_t));
  for (const RowSpan& sp : spans)
    if (sp.last_topk) {
      const int64_t at = sp.first_row + sp.rows - 1 - lo;
      const int32_t* sel = host_sel.data() + at * stride;
      const auto base = static_cast<int32_t>(sp.cache->base_position());
      sp.last_topk->resize(size_t(std::clamp<int64_t>(host_count[size_t(at)], 0, stride)));
      for (size_t j = 0; j < sp.last_topk->size(); ++j) (*sp.last_topk)[j] = sel[j] + base;
    }
}

class KVMirrors {
 public:
  // The mirror of cache's pool, made at its first use (remade if the pool was replaced or resized).
  DevicePlanes& of(const KVCache& cache);
  void drop_expired();  // mirrors of pools that are gone

 private:
  std::unordered_map<const KVPool*, std::unique_ptr<DevicePlanes>> mirrors_;
};

}  // namespace nextn
