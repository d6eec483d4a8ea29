#include "core/communicator.h"

#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>

#include "core/error.h"

namespace nextn {

void all_reduce_sum(Communicator& comm, float* data, int64_t count, std::vector<float>& scratch) {
  if (count < 0) throw Error("all_reduce_sum: negative count");
  const int n = comm.size();
  if (int64_t(scratch.size()) < n * count) scratch.resize(size_t(n * count));
  comm.all_gather(data, count * int64_t(sizeof(float)), scratch.data());
  for (int64_t i = 0; i < count; ++i) {
    float sum = scratch[size_t(i)];
    for (int r = 1; r < n; ++r) sum += scratch[size_t(r * count + i)];
    data[i] = sum;
  }
}

RankBest global_argmax(Communicator& comm, RankBest mine) {
  std::vector<RankBest> all(size_t(comm.size()));
  comm.all_gather(&mine, sizeof(RankBest), all.data());
  RankBest best = all[0];
  for (const RankBest& b : all)
    if (b.value > best.value || (b.value == best.value && b.id < best.id)) best = b;
  return best;
}

void global_argmax_rows(Communicator& comm, const RankBest* mine, int64_t rows, int32_t* out,
                        std::vector<RankBest>& scratch) {
  if (rows < 0) throw Error("global_argmax_rows: negative row count");
  const int n = comm.size();
  if (int64_t(scratch.size()) < n * rows) scratch.resize(size_t(n * rows));
  comm.all_gather(mine, rows * int64_t(sizeof(RankBest)), scratch.data());
  pick_global_argmax(scratch.data(), n, rows, out);
}

void pick_global_argmax(const RankBest* all, int ranks, int64_t rows, int32_t* out) {
  for (int64_t i = 0; i < rows; ++i) {
    RankBest best = all[i];
    for (int r = 0; r < ranks && best.id >= 0; ++r) {
      const RankBest& b = all[r * rows + i];
      if (b.id < 0 || b.value > best.value || (b.value == best.value && b.id < best.id)) best = b;
    }
    out[i] = static_cast<int32_t>(best.id);
  }
}

// Each collective is two rounds of a generation barrier: every rank publishes its buffer and count, all wait;
// each reads what it needs from the others' buffers, all wait again (so no buffer is left while another rank
// still reads it). A failed rank poisons the group: every wait then throws.
struct LocalGroup::Shared {
  explicit Shared(int n) : ranks(n), src(size_t(n)), bytes(size_t(n)), root(size_t(n)) {}
  const int ranks;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  bool failed = false;
  int first_failed = -1;  // the rank whose failure poisoned the group (the others' errors follow from it)
  std::vector<const void*> src;
  std::vector<int64_t> bytes;
  std::vector<int> root;

  void wait_all() {
    std::unique_lock<std::mutex> lock(mu);
    if (failed) throw Error("LocalGroup: another rank failed");
    const uint64_t gen = generation;
    if (++arrived == ranks) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    cv.wait(lock, [&] { return generation != gen || failed; });
    // (a round that completed stands, though a rank fails right after it)
    if (generation == gen) throw Error("LocalGroup: another rank failed");
  }
  void reset() {
    const std::lock_guard<std::mutex> lock(mu);
    arrived = 0;
    failed = false;
    first_failed = -1;
  }
  void fail(int rank) {
    const std::lock_guard<std::mutex> lock(mu);
    if (!failed) first_failed = rank;
    failed = true;
    cv.notify_all();
  }
  // After the first round: nextn::Error on every rank alike when the ranks disagree on the count (or root).
  void check_agreement(const char* what) const {
    for (int r = 1; r < ranks; ++r)
      if (bytes[size_t(r)] != bytes[0] || root[size_t(r)] != root[0])
        throw Error(std::string("LocalGroup::") + what + ": ranks disagree on the size (" +
                    std::to_string(bytes[0]) + " bytes on rank 0, " + std::to_string(bytes[size_t(r)]) +
                    " on rank " + std::to_string(r) + ") or the root");
  }
};

namespace {

class LocalComm final : public Communicator {
 public:
  LocalComm(LocalGroup::Shared& s, int rank) : s_(s), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return s_.ranks; }
  void all_gather(const void* in, int64_t bytes, void* out) override {
    if (bytes < 0) throw Error("LocalGroup::all_gather: negative size");
    publish(in, bytes, 0);
    s_.check_agreement("all_gather");
    for (int r = 0; r < s_.ranks; ++r)
      if (bytes > 0) std::memcpy(static_cast<char*>(out) + r * bytes, s_.src[size_t(r)], size_t(bytes));
    s_.wait_all();
  }
  void broadcast(void* data, int64_t bytes, int root) override {
    if (bytes < 0 || root < 0 || root >= s_.ranks) throw Error("LocalGroup::broadcast: bad size or root");
    publish(data, bytes, root);
    s_.check_agreement("broadcast");
    if (rank_ != root && bytes > 0) std::memcpy(data, s_.src[size_t(root)], size_t(bytes));
    s_.wait_all();
  }
  void barrier() override { s_.wait_all(); }
  void abort() override { s_.fail(rank_); }

 private:
  void publish(const void* p, int64_t bytes, int root) {
    s_.src[size_t(rank_)] = p;
    s_.bytes[size_t(rank_)] = bytes;
    s_.root[size_t(rank_)] = root;
    s_.wait_all();
  }
  LocalGroup::Shared& s_;
  const int rank_;
};

}  // namespace

struct LocalGroup::Started {
  std::function<void(Communicator&)> fn;
  std::unique_ptr<LocalComm> rank0;
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors;
};

LocalGroup::LocalGroup(int ranks) {
  if (ranks < 1 || ranks > 1024) throw Error("LocalGroup: needs 1 to 1024 ranks, got " + std::to_string(ranks));
  shared_ = std::make_unique<Shared>(ranks);
}

LocalGroup::~LocalGroup() {
  if (!started_) return;
  for (std::thread& t : started_->threads) t.join();
}

int LocalGroup::size() const { return shared_->ranks; }

void LocalGroup::run(const std::function<void(Communicator&)>& fn) {
  if (started_) throw Error("LocalGroup::run: the group is started (join it first)");
  Shared& s = *shared_;
  s.reset();
  std::vector<std::exception_ptr> errors(size_t(s.ranks));
  auto body = [&](int r) {
    LocalComm comm(s, r);
    try {
      fn(comm);
    } catch (...) {
      errors[size_t(r)] = std::current_exception();
      s.fail(r);
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(size_t(s.ranks - 1));
  try {
    for (int r = 1; r < s.ranks; ++r) threads.emplace_back(body, r);
  } catch (const std::system_error& e) {  // (a thread or process limit: release the ranks already started)
    s.fail(0);
    for (std::thread& t : threads) t.join();
    throw Error("LocalGroup: could start only " + std::to_string(threads.size() + 1) + " of " +
                std::to_string(s.ranks) + " rank threads (" + e.what() + ")");
  }
  body(0);
  for (std::thread& t : threads) t.join();
  // (only a rank that failed on its own fails first: the others throw once the group is poisoned)
  if (s.first_failed >= 0) std::rethrow_exception(errors[size_t(s.first_failed)]);
}

}  // namespace nextn

namespace nextn {

Communicator& LocalGroup::start(std::function<void(Communicator&)> fn) {
  if (started_) throw Error("LocalGroup::start: the group is already started");
  Shared& s = *shared_;
  s.reset();
  auto st = std::make_unique<Started>();
  st->fn = std::move(fn);
  st->rank0 = std::make_unique<LocalComm>(s, 0);
  st->errors.resize(size_t(s.ranks));
  Started* p = st.get();
  try {
    for (int r = 1; r < s.ranks; ++r)
      st->threads.emplace_back([p, &s, r] {
        LocalComm comm(s, r);
        try {
          p->fn(comm);
        } catch (...) {
          p->errors[size_t(r)] = std::current_exception();
          s.fail(r);
        }
      });
  } catch (const std::system_error& e) {
    s.fail(0);
    for (std::thread& t : st->threads) t.join();
    throw Error("LocalGroup: could start only " + std::to_string(st->threads.size() + 1) + " of " +
                std::to_string(s.ranks) + " rank threads (" + e.what() + ")");
  }
  started_ = std::move(st);
  return *started_->rank0;
}

void LocalGroup::join() {
  if (!started_) return;
  std::unique_ptr<Started> st = std::move(started_);
  for (std::thread& t : st->threads) t.join();
  const int first = shared_->first_failed;
  if (first > 0 && st->errors[size_t(first)]) std::rethrow_exception(st->errors[size_t(first)]);
}

}  // namespace nextn
