#include "core/threadpool.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>

#include "core/error.h"

namespace nextn {

namespace {

// The pool (if any) whose chunk the current thread is running, and that chunk's thread index.
thread_local const ThreadPool* tl_pool = nullptr;
thread_local int tl_index = 0;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Busy-wait this long before blocking: a decode step issues many small parallel_fors with serial work
// between them, and waking sleeping workers costs 20-60 us on a VM (0.6-2 us while they spin). Longer
// spins (1-3 ms) were measured to slow a lone working thread on a 2-vCPU VM by ~10%.
constexpr auto kSpinTime = std::chrono::microseconds(200);

// Spins (pausing) until done() holds or kSpinTime has passed; returns done().
template <class Done>
bool spin_until(const Done& done) {
  if (done()) return true;
  const auto deadline = std::chrono::steady_clock::now() + kSpinTime;
  for (unsigned i = 1;; ++i) {
    cpu_relax();
    if (done()) return true;
    if (i % 32 == 0 && std::chrono::steady_clock::now() >= deadline) return false;
  }
}

}  // namespace

int cpus_from_cgroup_quota(const std::string& cpu_max) {
  std::istringstream in(cpu_max);
  std::string quota_text;
  long long period = 0;
  if (!(in >> quota_text >> period) || quota_text == "max" || period <= 0) return 0;
  char* end = nullptr;
  const long long quota = std::strtoll(quota_text.c_str(), &end, 10);
  if (end == quota_text.c_str() || *end != '\0' || quota <= 0) return 0;
  const long long cpus = (quota + period - 1) / period;
  return static_cast<int>(std::min<long long>(cpus, 1 << 20));
}

namespace {

std::string read_small_file(const std::string& path) {
  std::ifstream f(path);
  std::string text;
  std::getline(f, text);  // (these files are one line)
  return text;
}

// The smallest CPU quota on this process's cgroup path (v2: its cgroup and every ancestor; v1: the cpu
// controller's mount), 0 when none is set.
int cgroup_cpu_limit() {
  int limit = 0;
  auto take = [&](int cpus) {
    if (cpus > 0) limit = limit == 0 ? cpus : std::min(limit, cpus);
  };
  std::ifstream cg("/proc/self/cgroup");
  for (std::string line; std::getline(cg, line);) {
    if (line.rfind("0::", 0) != 0) continue;  // the v2 hierarchy
    std::string path = line.substr(3);
    for (;;) {
      take(cpus_from_cgroup_quota(read_small_file("/sys/fs/cgroup" + path + "/cpu.max")));
      if (path.empty() || path == "/") break;
      path = path.substr(0, path.find_last_of('/'));
    }
  }
  const std::string quota = read_small_file("/sys/fs/cgroup/cpu/cpu.cfs_quota_us");
  const std::string period = read_small_file("/sys/fs/cgroup/cpu/cpu.cfs_period_us");
  if (!quota.empty() && !period.empty()) take(cpus_from_cgroup_quota(quota + " " + period));
  return limit;
}

}  // namespace

int usable_cpus() {
  int cpus = static_cast<int>(std::thread::hardware_concurrency());
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cpus = CPU_COUNT(&set);
  if (const int limit = cgroup_cpu_limit(); limit > 0) cpus = std::min(cpus, limit);
  return std::max(1, cpus);
}

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = usable_cpus();
  n_threads_ = std::max(1, n_threads);
  int doublings = 0;
  while ((1 << doublings) < n_threads_) ++doublings;
  min_parallel_work_ = kSplitWork * std::max(1, doublings);
  if (const char* env = std::getenv("NEXTN_MIN_PARALLEL_WORK"); env && *env) min_parallel_work_ = std::atoll(env);
  workers_.reserve(static_cast<size_t>(n_threads_ - 1));
  for (int i = 1; i < n_threads_; ++i) {
    try {
      workers_.emplace_back([this, i] { worker_main(i); });
    } catch (const std::system_error& e) {
      // The workers already started wait on members that are about to be destroyed: stop and join them
      // first (destroying a condition variable a thread still waits on blocks forever).
      const int started = static_cast<int>(workers_.size()) + 1;
      stop_and_join();
      throw Error("thread pool: the system let only " + std::to_string(started) + " of " +
                  std::to_string(n_threads_) + " threads start (" + e.what() +
                  "); ask for fewer (--threads N) or raise the limit that refused them (ulimit -u for processes, "
                  "or the memory limit: each thread reserves a stack)");
    }
  }
}

ThreadPool::~ThreadPool() { stop_and_join(); }

void ThreadPool::stop_and_join() {
  stop_.store(true, std::memory_order_seq_cst);
  {
    std::lock_guard<std::mutex> lock(mu_);
  }
  start_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
}

int ThreadPool::chunk_count(int64_t n, int64_t grain, int threads) {
  if (n <= 0) return 0;
  const int64_t g = std::max<int64_t>(1, grain);
  const int64_t by_grain = std::max<int64_t>(1, n / g);
  return static_cast<int>(std::min<int64_t>(std::max(1, threads), by_grain));
}

std::pair<int64_t, int64_t> ThreadPool::chunk_range(int64_t n, int chunks, int i) {
  const int64_t q = n / chunks, r = n % chunks;
  const int64_t begin = i * q + std::min<int64_t>(i, r);
  const int64_t end = begin + q + (i < r ? 1 : 0);
  return {begin, end};
}

void ThreadPool::run_chunk(const Fn& fn, int64_t n, int chunks, int index) {
  const auto [begin, end] = chunk_range(n, chunks, index);
  const ThreadPool* saved_pool = tl_pool;
  const int saved_index = tl_index;
  tl_pool = this;
  tl_index = index;
  try {
    fn(begin, end, index);
  } catch (...) {
    std::lock_guard<std::mutex> lock(error_mu_);
    if (!error_) error_ = std::current_exception();
  }
  tl_pool = saved_pool;
  tl_index = saved_index;
}

uint64_t ThreadPool::wait_for_job(uint64_t seen) {
  auto ready = [&]() -> uint64_t {
    const uint64_t s = seq_.load(std::memory_order_seq_cst);
    return s != seen && (s & 1) == 0 ? s : 0;
  };
  uint64_t found = 0;
  if (spin_until([&] { return (found = ready()) != 0 || stop_.load(std::memory_order_relaxed); }))
    return stop_.load(std::memory_order_relaxed) ? 0 : found;
  std::unique_lock<std::mutex> lock(mu_);
  sleepers_.fetch_add(1, std::memory_order_seq_cst);
  uint64_t s = 0;
  while ((s = ready()) == 0 && !stop_.load(std::memory_order_seq_cst)) start_cv_.wait(lock);
  sleepers_.fetch_sub(1, std::memory_order_relaxed);
  return stop_.load(std::memory_order_relaxed) ? 0 : s;
}

void ThreadPool::worker_main(int index) {
  uint64_t seen = 0;
  for (;;) {
    const Fn* fn;
    int64_t n;
    int chunks;
    for (;;) {
      const uint64_t s = wait_for_job(seen);
      if (s == 0) return;  // stopping
      fn = fn_.load(std::memory_order_relaxed);
      n = n_.load(std::memory_order_relaxed);
      chunks = chunks_.load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      seen = s;
      if (seq_.load(std::memory_order_relaxed) == s) break;  // a consistent snapshot of job s
    }
    if (index >= chunks) continue;  // this job has fewer chunks than threads
    run_chunk(*fn, n, chunks, index);
    if (pending_.fetch_sub(1, std::memory_order_seq_cst) == 1 && caller_sleeping_.load(std::memory_order_seq_cst)) {
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const Fn& fn) {
  if (n <= 0) return;
  if (tl_pool == this) {  // nested call from one of our own chunks: no re-entry, run it here
    fn(0, n, tl_index);
    return;
  }
  const int chunks = chunk_count(n, grain, n_threads_);
  if (chunks <= 1) {
    fn(0, n, 0);
    return;
  }

  std::lock_guard<std::mutex> call_lock(call_mu_);
  error_ = nullptr;
  pending_.store(chunks - 1, std::memory_order_relaxed);
  // Publish: odd while writing, even when complete (see seq_).
  const uint64_t s = seq_.load(std::memory_order_relaxed);
  seq_.store(s + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  fn_.store(&fn, std::memory_order_relaxed);
  n_.store(n, std::memory_order_relaxed);
  chunks_.store(chunks, std::memory_order_relaxed);
  seq_.store(s + 2, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    { std::lock_guard<std::mutex> lock(mu_); }  // a sleeper is either waiting already or sees seq_
    start_cv_.notify_all();
  }

  run_chunk(fn, n, chunks, 0);

  if (!spin_until([&] { return pending_.load(std::memory_order_acquire) == 0; })) {
    std::unique_lock<std::mutex> lock(mu_);
    caller_sleeping_.store(true, std::memory_order_seq_cst);
    while (pending_.load(std::memory_order_seq_cst) != 0) done_cv_.wait(lock);
    caller_sleeping_.store(false, std::memory_order_relaxed);
  }

  if (error_) {
    std::exception_ptr e = std::move(error_);
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

bool ThreadPool::worth_waking(int64_t work) {
  if (sleepers_.load(std::memory_order_relaxed) == 0) {
    kept_work_.store(0, std::memory_order_relaxed);
    return true;
  }
  if (kept_work_.fetch_add(work, std::memory_order_relaxed) + work < kWakeWork) return false;
  kept_work_.store(0, std::memory_order_relaxed);
  return true;
}

void parallel_for(ThreadPool* pool, int64_t n, int64_t grain, const ThreadPool::Fn& fn) {
  if (n <= 0) return;
  if (pool == nullptr || pool->size() <= 1 || ThreadPool::chunk_count(n, grain, pool->size()) <= 1) {
    fn(0, n, 0);
    return;
  }
  pool->parallel_for(n, grain, fn);
}

ThreadPool* pool_for_work(ThreadPool* pool, int64_t work, int64_t min_work) {
  if (pool == nullptr || pool->size() <= 1) return nullptr;
  if (work < (min_work < 0 ? pool->min_parallel_work() : min_work)) return nullptr;
  return pool->worth_waking(work) ? pool : nullptr;
}

}  // namespace nextn
