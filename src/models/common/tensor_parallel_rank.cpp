#include "models/common/tensor_parallel_rank.h"

#include <algorithm>
#include <cstdint>

#include "core/error.h"
#include "core/finite.h"
#include "core/sizes.h"

namespace nextn {

void TensorParallelRank::set(Communicator* comm, std::vector<UnitRange> vocab) {
  if (comm && vocab.size() != size_t(comm->size()))
    throw Error("internal: a tensor-parallel rank needs every rank's vocabulary rows");
  comm_ = comm;
  vocab_ = std::move(vocab);
}

int64_t TensorParallelRank::largest_part() const { return widest(vocab_); }

int64_t TensorParallelRank::bytes_for(int64_t rows, int64_t hidden) const {
  if (!comm_) return 0;
  const std::string what = "the tensor-parallel gathers of " + std::to_string(rows) + " rows";
  const int64_t part = largest_part(), n = comm_->size();
  int64_t floats = checked_mul(checked_mul(n, rows, what), std::max(hidden, part), what);
  floats = checked_add(floats, checked_mul(rows, part, what), what);
  const int64_t bests = checked_mul(n + 1, rows, what);
  return checked_add(checked_mul(floats, int64_t(sizeof(float)), what),
                     checked_mul(bests, int64_t(sizeof(RankBest)), what), what);
}

void TensorParallelRank::reserve(int64_t rows, int64_t hidden) {
  if (!comm_) return;
  const int64_t part = largest_part(), n = comm_->size();
  const int64_t gather = n * rows * std::max(hidden, part);
  if (int64_t(gather_.size()) < gather) gather_.resize(size_t(gather));
  if (int64_t(part_.size()) < rows * part) part_.assign(size_t(rows * part), 0.0f);
  if (int64_t(best_.size()) < rows) best_.resize(size_t(rows));
  if (int64_t(best_all_.size()) < n * rows) best_all_.resize(size_t(n * rows));
}

void TensorParallelRank::sum(float* y, int64_t count) {
  if (comm_) all_reduce_sum(*comm_, y, count, gather_);
}

int TensorParallelRank::owner(int32_t token) const {
  int r = 0;
  while (r + 1 < int(vocab_.size()) && token >= vocab_[size_t(r)].end) ++r;
  return r;
}

void TensorParallelRank::embed(const Linear& part, const int32_t* tokens, int64_t rows, int64_t H, float* out) {
  if (!comm_) {
    for (int64_t s = 0; s < rows; ++s) ops::dequant_row(part, tokens[s], out + s * H);
    return;
  }
  const int me = comm_->rank();
  const int64_t v0 = vocab_[size_t(me)].begin;
  for (int64_t s = 0; s < rows; ++s) {
    float* x = out + s * H;
    if (owner(tokens[s]) == me)
      ops::dequant_row(part, tokens[s] - v0, x);
    else
      std::fill(x, x + H, 0.0f);
  }
  reserve(rows, H);
  comm_->all_gather(out, rows * H * int64_t(sizeof(float)), gather_.data());  // [ranks, rows, H]
  for (int64_t s = 0; s < rows; ++s) {
    const float* src = gather_.data() + (owner(tokens[s]) * rows + s) * H;
    std::copy(src, src + H, out + s * H);
  }
}

void TensorParallelRank::logits(ThreadPool* pool, const Linear& part, const float* hidden, int64_t rows, int64_t V,
                                float* out) {
  if (!comm_) {
    ops::matmul(pool, hidden, rows, part, out);
    return;
  }
  const int64_t width = largest_part();
  reserve(rows, 0);
  ops::matmul(pool, hidden, rows, part, part_.data(), -1, width);  // [rows, width]: each part padded alike
  comm_->all_gather(part_.data(), rows * width * int64_t(sizeof(float)), gather_.data());
  for (size_t r = 0; r < vocab_.size(); ++r)
    for (int64_t i = 0; i < rows; ++i) {
      const float* src = gather_.data() + (int64_t(r) * rows + i) * width;
      std::copy(src, src + vocab_[r].size(), out + i * V + vocab_[r].begin);
    }
}

void TensorParallelRank::argmax(ThreadPool* pool, const Linear& part, const float* hidden, int64_t rows, int32_t* ids) {
  if (!comm_) throw Error("internal: TensorParallelRank::argmax on one rank");
  const int64_t width = largest_part();
  const UnitRange mine = vocab_[size_t(comm_->rank())];
  reserve(rows, 0);
  ops::matmul(pool, hidden, rows, part, part_.data(), -1, width);
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = part_.data() + i * width;
    const int32_t j = mine.size() > 0 ? finite_argmax(row, mine.size()) : 0;
    best_[size_t(i)] = mine.size() == 0 ? kNoRankBest
                       : j < 0          ? RankBest{0.0f, -1}
                                        : RankBest{row[j], mine.begin + j};
  }
  global_argmax_rows(*comm_, best_.data(), rows, ids, best_all_);
}

}  // namespace nextn
