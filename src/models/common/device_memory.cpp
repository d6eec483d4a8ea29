// What both families' CUDA backends keep in device memory, and their read-backs and collectives (device_memory.h).
#include "models/common/device_memory.h"

#include <cstddef>

#include "core/communicator.h"
#include "core/error.h"
#include "core/sizes.h"

namespace nextn {

void require_device_room(const std::string& dir, size_t bytes) {
  std::string why;
  if (!cuda::available(&why)) throw Error("--device cuda: " + why);
  const size_t free = cuda::free_memory();
  if (bytes > free)
    throw Error(dir + ": the checkpoint's " + gib(int64_t(bytes)) + " do not fit in the GPU's free memory (" +
                gib(int64_t(free)) + " of " + cuda::device_name() + ")");
}

void DeviceWeights::add(const Linear& w) {
  if (!w.data || linears_.count(w.data)) return;
  cuda::DeviceLinear d = cuda::upload(w);
  bytes_ += d.data.bytes() + d.scale.bytes() + d.bias.bytes();
  linears_.emplace(w.data, std::move(d));
}

void DeviceWeights::add(const std::vector<float>& v) {
  if (v.empty() || vectors_.count(v.data())) return;
  cuda::DeviceBuffer b(v.size() * sizeof(float));
  b.upload(v.data(), b.bytes());
  bytes_ += b.bytes();
  vectors_.emplace(v.data(), std::move(b));
}

const Linear& DeviceWeights::operator()(const Linear& w) const {
  const auto it = linears_.find(w.data);
  if (it == linears_.end() || it->second.w.out != w.out || it->second.w.in != w.in)
    throw Error("internal: a weight the CUDA backend did not upload");
  return it->second.w;
}

const float* DeviceWeights::operator()(const std::vector<float>& v) const {
  if (v.empty()) return nullptr;
  const auto it = vectors_.find(v.data());
  if (it == vectors_.end()) throw Error("internal: a vector the CUDA backend did not upload");
  return it->second.f32();
}

DevicePlanes::DevicePlanes(int64_t rows_, std::vector<int64_t> widths_) : rows(rows_), widths(std::move(widths_)) {
  std::vector<float*> addresses;
  for (int64_t w : widths) {
    planes.emplace_back(size_t(rows * w) * sizeof(float));
    addresses.push_back(planes.back().f32());
  }
  table = cuda::DeviceBuffer(addresses.size() * sizeof(float*));
  table.upload(addresses.data(), table.bytes());
}

void HostRows::read(const float* device, int64_t width, int64_t total, int64_t first, int64_t n, float* out) {
  if (n <= 0) return;
  if (first < 0 || first + n > total) throw Error("internal: rows read back outside the forward's");
  if (!valid_ && first == 0 && n == total) {
    cuda::copy_to_host(out, device, size_t(n * width) * sizeof(float));
    return;
  }
  if (!valid_) {
    staged_.resize(size_t(total * width));
    cuda::copy_to_host(staged_.data(), device, staged_.size() * sizeof(float));
    valid_ = true;
  }
  std::copy(staged_.begin() + first * width, staged_.begin() + (first + n) * width, out);
}

std::unique_ptr<cuda::DeviceCommunicator> join_gpu_group(Communicator& host, const std::string& dir, size_t bytes) {
  const int gpus = cuda::device_count();
  if (gpus > 1) cuda::use_gpu(host.rank() % gpus);
  require_device_room(dir, bytes);
  return cuda::device_communicator(host);
}

void DeviceRank::set(cuda::DeviceCommunicator* comm, std::vector<UnitRange> vocab) {
  if (comm && vocab.size() != size_t(comm->size()))
    throw Error("internal: a tensor-parallel rank needs every rank's vocabulary rows");
  comm_ = comm;
  vocab_ = std::move(vocab);
  gather_ = cuda::DeviceBuffer();
  part_ = cuda::DeviceBuffer();
}

void DeviceRank::reserve(int64_t rows, int64_t hidden) {
  if (!comm_) return;
  const int64_t part = widest(vocab_);
  grow_device<float>(gather_, comm_->size() * rows * std::max(hidden, part));
  grow_device<float>(part_, rows * part);
}

int32_t DeviceRank::local_token(int32_t token) const {
  if (!comm_) return token;
  const UnitRange& mine = vocab_[size_t(comm_->rank())];
  return token >= mine.begin && token < mine.end ? int32_t(token - mine.begin) : -1;
}

void DeviceRank::sum(float* y, int64_t count) {
  float* all = gather_.f32();  // [ranks, count]
  comm_->all_gather(y, count * int64_t(sizeof(float)), all);
  cuda::sum_ranks(all, comm_->size(), count, y);
}

void DeviceRank::logits(const Linear& part, const float* x, int64_t rows, int64_t V, float* logits) {
  const int64_t width = widest(vocab_);
  float* mine = part_.f32();  // [rows, width]: every rank's part padded alike
  if (part.out > 0) cuda::matmul(x, rows, part, mine, -1, width);
  float* all = gather_.f32();  // [ranks, rows, width]
  comm_->all_gather(mine, rows * width * int64_t(sizeof(float)), all);
  for (int r = 0; r < comm_->size(); ++r) {
    const UnitRange& v = vocab_[size_t(r)];
    cuda::copy_cols(all + r * rows * width, rows, v.size(), width, logits + v.begin, V);
  }
}

void DeviceRank::argmax(const Linear& part, const float* x, int64_t rows, int32_t* ids) {
  static_assert(sizeof(RankBest) == sizeof(cuda::RowBest) && offsetof(RankBest, id) == offsetof(cuda::RowBest, id),
                "row_best writes RankBest's layout");
  const int64_t width = widest(vocab_), n = comm_->size();
  const UnitRange mine = vocab_[size_t(comm_->rank())];
  auto* best = grow_device<cuda::RowBest>(best_, rows);
  auto* all = grow_device<cuda::RowBest>(best_all_, n * rows);
  if (mine.size() > 0) {
    cuda::matmul(x, rows, part, part_.f32(), -1, width);
    cuda::row_best(part_.f32(), rows, mine.size(), width, mine.begin, best);
  } else {  // (a rank without vocabulary rows: a best that never wins)
    host_best_.assign(size_t(rows), kNoRankBest);
    cuda::copy_to_device(best, host_best_.data(), size_t(rows) * sizeof(RankBest));
  }
  comm_->all_gather(best, rows * int64_t(sizeof(RankBest)), all);
  host_best_.resize(size_t(n * rows));
  cuda::copy_to_host(host_best_.data(), all, host_best_.size() * sizeof(RankBest));
  pick_global_argmax(host_best_.data(), int(n), rows, ids);
}

bool LogitRows::all_by_id(int64_t rows) const {
  return std::find(by_id_.begin(), by_id_.begin() + rows, uint8_t(0)) == by_id_.begin() + rows;
}

int32_t* LogitRows::ids_for(int64_t rows) {
  ids_.resize(size_t(rows));
  return ids_.data();
}

void LogitRows::mark_first(int64_t rows, int64_t greedy) {
  by_id_.assign(size_t(rows), 0);
  std::fill(by_id_.begin(), by_id_.begin() + std::clamp<int64_t>(greedy, 0, rows), uint8_t(1));
}

void LogitRows::read(const float* logits, int64_t rows, int64_t V, float* out) {
  if (std::find(by_id_.begin(), by_id_.begin() + rows, uint8_t(1)) != by_id_.begin() + rows) {
    int32_t* ids = grow_device<int32_t>(device_ids_, rows);
    cuda::row_argmax(logits, rows, V, ids);
    ids_.resize(size_t(rows));
    cuda::copy_to_host(ids_.data(), ids, size_t(rows) * sizeof(int32_t));
  }
  int64_t run = 0;  // rows of the pending run of copied rows, ending at row r
  for (int64_t r = 0; r <= rows; ++r) {
    if (r < rows && !by_id_[size_t(r)]) {
      ++run;
      continue;
    }
    if (run > 0)
      cuda::copy_to_host(out + (r - run) * V, logits + (r - run) * V, size_t(run * V) * sizeof(float));
    run = 0;
  }
}

DevicePlanes& PaddingPlanes::like(const KVCache& cache) {
  const KVPool& pool = *cache.shared_pool();
  std::vector<int64_t> widths;
  for (size_t p = 0; p < pool.num_planes(); ++p) widths.push_back(pool.plane_width(p));
  for (const std::unique_ptr<DevicePlanes>& set : sets_)
    if (set->widths == widths) return *set;
  sets_.push_back(std::make_unique<DevicePlanes>(rows_, std::move(widths)));
  return *sets_.back();
}

DevicePlanes& KVMirrors::of(const KVCache& cache) {
  const std::shared_ptr<KVPool>& pool = cache.shared_pool();
  std::unique_ptr<DevicePlanes>& m = mirrors_[pool.get()];
  const int64_t rows = pool->pages() * pool->page_tokens();
  if (m && m->pool.lock() == pool && m->rows == rows && m->widths.size() == pool->num_planes()) return *m;
  std::vector<int64_t> widths;
  for (size_t p = 0; p < pool->num_planes(); ++p) widths.push_back(pool->plane_width(p));
  m.reset();  // (the old planes freed before the new ones are taken)
  m = std::make_unique<DevicePlanes>(rows, std::move(widths));
  m->pool = pool;
  return *m;
}

void KVMirrors::drop_expired() {
  for (auto it = mirrors_.begin(); it != mirrors_.end();)
    it = it->second->pool.expired() ? mirrors_.erase(it) : std::next(it);
}

}  // namespace nextn
