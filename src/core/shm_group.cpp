#include "core/shm_group.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <new>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>

#include "core/error.h"

namespace nextn {

namespace {
constexpr int kMaxRanks = 64;
constexpr uint64_t kMagic = 0x6e6578746e2d7470ull;  // "nextn-tp"
}  // namespace

// The segment's first bytes; the ranks' slots follow (slot_bytes each, 64-byte aligned).
struct ShmGroup::Header {
  uint64_t magic;
  int32_t ranks;
  int64_t slot_bytes;
  pthread_mutex_t mu;  // process-shared, robust: a rank that dies holding it is noticed
  pthread_cond_t cv;
  int32_t arrived;
  uint64_t generation;
  int32_t failed;
  int32_t first_failed;
  int64_t bytes[kMaxRanks];
  int32_t root[kMaxRanks];
};

namespace {

size_t slots_offset() { return (sizeof(ShmGroup::Header) + 63) / 64 * 64; }

class ShmComm final : public Communicator {
 public:
  ShmComm(ShmGroup::Header* h, char* slots, int rank) : h_(h), slots_(slots), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return h_->ranks; }

  void all_gather(const void* in, int64_t bytes, void* out) override {
    if (bytes < 0) throw Error("ShmGroup::all_gather: negative size");
    int64_t off = 0;
    do {  // (one round at least: a zero-byte gather still checks that the ranks agree)
      const int64_t n = std::min(h_->slot_bytes, bytes - off);
      if (n > 0) std::memcpy(slot(rank_), static_cast<const char*>(in) + off, size_t(n));
      publish(bytes, 0, "all_gather");
      for (int r = 0; r < h_->ranks && n > 0; ++r)
        std::memcpy(static_cast<char*>(out) + r * bytes + off, slot(r), size_t(n));
      wait_all();
      off += n;
    } while (off < bytes);
  }

  void broadcast(void* data, int64_t bytes, int root) override {
    if (bytes < 0 || root < 0 || root >= h_->ranks) throw Error("ShmGroup::broadcast: bad size or root");
    int64_t off = 0;
    do {
      const int64_t n = std::min(h_->slot_bytes, bytes - off);
      if (rank_ == root && n > 0) std::memcpy(slot(root), static_cast<char*>(data) + off, size_t(n));
      publish(bytes, root, "broadcast");
      if (rank_ != root && n > 0) std::memcpy(static_cast<char*>(data) + off, slot(root), size_t(n));
      wait_all();
      off += n;
    } while (off < bytes);
  }

  void barrier() override { wait_all(); }

  void abort() override {
    lock();
    if (!h_->failed) h_->first_failed = rank_;
    __atomic_store_n(&h_->failed, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&h_->cv);
    pthread_mutex_unlock(&h_->mu);
  }

  std::function<bool()> alive;

 private:
  char* slot(int r) const { return slots_ + int64_t(r) * h_->slot_bytes; }
  uint64_t generation() const { return __atomic_load_n(&h_->generation, __ATOMIC_ACQUIRE); }

  void lock() {
    const int rc = pthread_mutex_lock(&h_->mu);
    if (rc == EOWNERDEAD) {  // a rank died inside a collective's bookkeeping: nothing it guarded can be trusted
      __atomic_store_n(&h_->failed, 1, __ATOMIC_RELEASE);
      pthread_mutex_consistent(&h_->mu);
    } else if (rc != 0) {
      throw Error(std::string("ShmGroup: cannot lock the group (") + std::strerror(rc) + ")");
    }
  }

  // Every rank arrives, then all go on (a generation barrier); throws once the group is poisoned.
  void wait_all() {
    lock();
    if (h_->failed) {
      pthread_mutex_unlock(&h_->mu);
      throw Error("ShmGroup: another rank failed");
    }
    const uint64_t gen = generation();
    if (++h_->arrived == h_->ranks) {
      h_->arrived = 0;
      __atomic_store_n(&h_->generation, gen + 1, __ATOMIC_RELEASE);
      pthread_cond_broadcast(&h_->cv);
      pthread_mutex_unlock(&h_->mu);
      return;
    }
    // The others are usually a few microseconds behind (every rank runs the same step): spin a little before
    // sleeping, since a futex wake across processes costs tens of microseconds on a VM.
    pthread_mutex_unlock(&h_->mu);
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
    for (int i = 1; generation() == gen && !__atomic_load_n(&h_->failed, __ATOMIC_ACQUIRE); ++i) {
      if (i % 64 == 0 && std::chrono::steady_clock::now() > spin_until) break;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
    lock();
    while (generation() == gen && !h_->failed) {
      timespec until;
      clock_gettime(CLOCK_MONOTONIC, &until);
      until.tv_nsec += 100 * 1000 * 1000;
      if (until.tv_nsec >= 1000000000) {
        until.tv_sec += 1;
        until.tv_nsec -= 1000000000;
      }
      const int rc = pthread_cond_timedwait(&h_->cv, &h_->mu, &until);
      if (rc == EOWNERDEAD) {
        __atomic_store_n(&h_->failed, 1, __ATOMIC_RELEASE);
        pthread_mutex_consistent(&h_->mu);
      } else if (rc == ETIMEDOUT && alive && !alive()) {
        __atomic_store_n(&h_->failed, 1, __ATOMIC_RELEASE);  // (a peer is gone: nobody else will wake the others)
        pthread_cond_broadcast(&h_->cv);
      }
    }
    const bool done = generation() != gen;
    pthread_mutex_unlock(&h_->mu);
    if (!done) throw Error("ShmGroup: another rank failed");
  }

  // Publishes this rank's size and root for the round, waits for all, and checks that they agree.
  void publish(int64_t bytes, int root, const char* what) {
    h_->bytes[rank_] = bytes;
    h_->root[rank_] = root;
    wait_all();
    for (int r = 1; r < h_->ranks; ++r)
      if (h_->bytes[r] != h_->bytes[0] || h_->root[r] != h_->root[0])
        throw Error(std::string("ShmGroup::") + what + ": ranks disagree on the size (" + std::to_string(h_->bytes[0]) +
                    " bytes on rank 0, " + std::to_string(h_->bytes[r]) + " on rank " + std::to_string(r) +
                    ") or the root");
  }

  ShmGroup::Header* h_;
  char* slots_;
  const int rank_;
};

std::string errno_text() { return std::strerror(errno); }

}  // namespace

std::unique_ptr<ShmGroup> ShmGroup::create(int ranks, int64_t slot_bytes) {
  if (ranks < 2 || ranks > kMaxRanks)
    throw Error("ShmGroup: needs 2 to " + std::to_string(kMaxRanks) + " ranks, got " + std::to_string(ranks));
  if (slot_bytes < 64 || slot_bytes > (int64_t(1) << 30)) throw Error("ShmGroup: slot size out of range");
  static std::atomic<int> serial{0};
  std::unique_ptr<ShmGroup> g(new ShmGroup());
  g->name_ = "/nextn-tp-" + std::to_string(::getpid()) + "-" + std::to_string(serial++);
  slot_bytes = (slot_bytes + 63) / 64 * 64;
  g->map_bytes_ = slots_offset() + size_t(ranks) * size_t(slot_bytes);
  const int fd = shm_open(g->name_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) throw Error("ShmGroup: cannot create shared memory " + g->name_ + " (" + errno_text() + ")");
  g->owner_ = true;
  if (ftruncate(fd, off_t(g->map_bytes_)) != 0) {
    const std::string why = errno_text();
    close(fd);
    shm_unlink(g->name_.c_str());
    throw Error("ShmGroup: cannot size shared memory " + g->name_ + " (" + why + ")");
  }
  g->map_ = mmap(nullptr, g->map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (g->map_ == MAP_FAILED) {
    g->map_ = nullptr;
    shm_unlink(g->name_.c_str());
    throw Error("ShmGroup: cannot map shared memory " + g->name_ + " (" + errno_text() + ")");
  }
  auto* h = new (g->map_) Header{};
  h->ranks = ranks;
  h->slot_bytes = slot_bytes;
  h->first_failed = -1;
  pthread_mutexattr_t ma;
  pthread_mutexattr_init(&ma);
  pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&h->mu, &ma);
  pthread_mutexattr_destroy(&ma);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&h->cv, &ca);
  pthread_condattr_destroy(&ca);
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = kMagic;  // (last: an attaching rank checks it)
  g->comm_ = std::make_unique<ShmComm>(h, static_cast<char*>(g->map_) + slots_offset(), 0);
  return g;
}

std::unique_ptr<ShmGroup> ShmGroup::attach(const std::string& name, int rank) {
  std::unique_ptr<ShmGroup> g(new ShmGroup());
  g->name_ = name;
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) throw Error("ShmGroup: cannot open shared memory " + name + " (" + errno_text() + ")");
  struct stat st {};
  if (fstat(fd, &st) != 0 || size_t(st.st_size) < slots_offset()) {
    close(fd);
    throw Error("ShmGroup: " + name + " is not a nextn tensor-parallel group");
  }
  g->map_bytes_ = size_t(st.st_size);
  g->map_ = mmap(nullptr, g->map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (g->map_ == MAP_FAILED) {
    g->map_ = nullptr;
    throw Error("ShmGroup: cannot map shared memory " + name + " (" + errno_text() + ")");
  }
  auto* h = static_cast<Header*>(g->map_);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (h->magic != kMagic || h->ranks < 2 || h->ranks > kMaxRanks || rank < 1 || rank >= h->ranks ||
      slots_offset() + size_t(h->ranks) * size_t(h->slot_bytes) > g->map_bytes_)
    throw Error("ShmGroup: " + name + " is not a nextn tensor-parallel group with a rank " + std::to_string(rank));
  g->comm_ = std::make_unique<ShmComm>(h, static_cast<char*>(g->map_) + slots_offset(), rank);
  return g;
}

ShmGroup::~ShmGroup() {
  comm_.reset();
  if (map_) munmap(map_, map_bytes_);
  if (owner_) shm_unlink(name_.c_str());
}

Communicator& ShmGroup::comm() { return *comm_; }

int ShmGroup::first_failed() const { return static_cast<const Header*>(map_)->first_failed; }

void ShmGroup::unlink() {
  if (owner_) shm_unlink(name_.c_str());
  owner_ = false;
}

void ShmGroup::set_liveness(std::function<bool()> alive) { static_cast<ShmComm&>(*comm_).alive = std::move(alive); }

}  // namespace nextn
