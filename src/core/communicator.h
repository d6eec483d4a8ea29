// The collectives tensor-parallel ranks need (docs/parallel.md, P12): a small interface that an NCCL
// implementation (one process a GPU) and LocalGroup below (ranks as threads of one process, for the CPU and
// for unit tests of the sharding) both provide.
//
// Exactness: NCCL's all-reduce picks its algorithm and chunking by message size, so a verify of k + 1 rows can
// round a row differently from a one-row decode, and greedy speculation would stop equalling plain greedy.
// nextn's reductions are therefore its own: all_reduce_sum gathers every rank's partials (a gather moves bits,
// it adds nothing) and adds them in rank order, element by element, whatever the number of elements: every rank
// gets the same bits, and a row's sum does not depend on the rows beside it.
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <vector>

namespace nextn {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // out[r * bytes, (r + 1) * bytes) = rank r's `in` (bytes each; every rank must pass the same count, else
  // nextn::Error on every rank). out must not overlap in.
  virtual void all_gather(const void* in, int64_t bytes, void* out) = 0;
  // Rank root's `bytes` at data to every rank's data (every rank must pass the same count and root).
  virtual void broadcast(void* data, int64_t bytes, int root) = 0;
  virtual void barrier() = 0;
  // This rank gives up (an error it cannot share): every rank's pending and later collectives throw
  // nextn::Error instead of waiting for it (NCCL: ncclCommAbort).
  virtual void abort() = 0;
};

// data[i] = Σ over ranks r = 0, 1, ... of rank r's data[i], added in rank order on every rank (see above).
// scratch: grown to size() · count floats as needed (keep it across calls: no allocation per step).
void all_reduce_sum(Communicator& comm, float* data, int64_t count, std::vector<float>& scratch);

// The greedy token of logits split by vocabulary over the ranks: each rank passes its own best (value, global
// id); every rank gets the largest value, ties to the lower id (as argmax over the whole row on one rank).
struct RankBest {
  float value;
  int64_t id;
};
// What a rank without vocabulary rows passes: a best that never wins.
inline constexpr RankBest kNoRankBest{-std::numeric_limits<float>::infinity(), std::numeric_limits<int64_t>::max()};
RankBest global_argmax(Communicator& comm, RankBest mine);
// The same for `rows` rows in one collective: out[i] = the global id of row i's largest value, or -1 where some
// rank's part of the row holds a NaN or inf (that rank passes id -1: finite_argmax's answer for the whole row).
// scratch: grown to size() · rows entries as needed.
void global_argmax_rows(Communicator& comm, const RankBest* mine, int64_t rows, int32_t* out,
                        std::vector<RankBest>& scratch);
// The rule of global_argmax_rows over every rank's bests, gathered: all [ranks, rows] -> out [rows].
void pick_global_argmax(const RankBest* all, int ranks, int64_t rows, int32_t* out);

// `ranks` ranks as threads of this process over shared memory. run(fn) calls fn with each rank's communicator
// on a thread of its own and returns when all have returned; if any rank throws, the ranks waiting in a
// collective are released with nextn::Error (no rank waits for one that will never come) and run rethrows the
// first exception.
class LocalGroup {
 public:
  explicit LocalGroup(int ranks);
  ~LocalGroup();
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;
  int size() const;
  void run(const std::function<void(Communicator&)>& fn);
  // The form a long-lived group takes (TensorParallelModel): ranks 1.. run fn on threads of their own, and the
  // calling thread gets rank 0's communicator to use as it goes. join() waits for those threads and rethrows
  // the error of the first rank that failed on its own (none: returns). One start at a time; the destructor
  // joins a group still started (after rank 0 has told the others to stop, or aborted).
  Communicator& start(std::function<void(Communicator&)> fn);
  void join();

  struct Shared;

 private:
  std::unique_ptr<Shared> shared_;
  struct Started;
  std::unique_ptr<Started> started_;
};

}  // namespace nextn
