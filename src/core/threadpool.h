// A small fork-join thread pool for the CPU kernels.
//
// parallel_for splits [0, n) into contiguous chunks, one per thread, with a partition that depends only
// on (n, grain, size()): chunk_count() chunks, chunk i = chunk_range(n, chunks, i). The caller thread runs
// chunk 0 itself; persistent workers run the others. Nothing is allocated per call.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace nextn {

// A non-owning reference to a callable `void(int64_t begin, int64_t end, int thread_index)` (what C++26
// calls std::function_ref). parallel_for runs it before returning, so it is neither copied nor stored:
// unlike std::function, a lambda capturing more than two pointers costs no heap allocation per call.
class ChunkFn {
 public:
  template <class F>
    requires(!std::is_same_v<std::decay_t<F>, ChunkFn> && std::is_invocable_v<const F&, int64_t, int64_t, int>)
  ChunkFn(const F& f)  // NOLINT(google-explicit-constructor): lambdas convert implicitly
      : obj_(&f), call_([](const void* o, int64_t b, int64_t e, int t) { (*static_cast<const F*>(o))(b, e, t); }) {}
  void operator()(int64_t begin, int64_t end, int thread_index) const { call_(obj_, begin, end, thread_index); }

 private:
  const void* obj_;
  void (*call_)(const void*, int64_t, int64_t, int);
};

// The CPUs this process may run on: those of its affinity mask (taskset, a container's cpuset), fewer when
// a CPU quota allows less (cgroup cpu.max / cfs_quota_us, as `docker --cpus` sets), at least 1.
// std::thread::hardware_concurrency() counts every CPU of the host: workers beyond the usable CPUs spin
// against each other, and a 2-CPU container on a 16-core host decoded 10x slower with 16 threads.
int usable_cpus();
// The CPU limit in a cgroup v2 `cpu.max` ("200000 100000": 2) or v1 quota and period, rounded up; 0 when
// there is none ("max ...", a quota <= 0) or the text is no such limit.
int cpus_from_cgroup_quota(const std::string& cpu_max);

class ThreadPool {
 public:
  using Fn = ChunkFn;

  // n_threads <= 0: usable_cpus(). The caller counts as one thread,
  // so size() - 1 workers are started. When the system refuses a thread (a process or memory limit), the
  // workers already started are stopped and joined and nextn::Error says how many of how many threads
  // could be started: the pool never runs with fewer threads than asked for.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Runs fn(begin, end, thread_index) over [0, n) in chunk_count(n, grain, size()) contiguous chunks and
  // returns once all are done. thread_index is the chunk index (0 = the calling thread). If fn throws, the
  // first exception is rethrown here after every chunk has finished. Concurrent calls from different
  // threads are serialised; a call made from inside fn on this pool runs serially on the current thread
  // (fn(0, n, current thread index)).
  void parallel_for(int64_t n, int64_t grain, const Fn& fn);

  // Whether handing `work` (the caller's estimate: multiply-adds plus weight bytes) to the workers pays now.
  // Always while they spin. While one sleeps (waking it costs 20-60 us on a VM, about a 1-2M-work product
  // run alone) it is woken only once the work the callers kept to themselves since it fell asleep adds up
  // to kWakeWork (ski rental): at most about one wake-up's worth is lost per idle spell, and a run of
  // mid-size products still wakes it. Which thread computes what never changes a value.
  static constexpr int64_t kWakeWork = int64_t(8) << 20;
  bool worth_waking(int64_t work);

  // Work (multiply-adds + weight bytes) below which splitting a job over the threads costs more than it
  // saves: a hand-off to spinning workers takes ~0.6 us on 2 threads and ~2 us on 16, while a core does
  // ~30K multiply-adds per us. Kernels and model code run smaller jobs on the caller. Defaults to
  // kSplitWork per doubling of the thread count (32K on 2 threads, 128K on 16); the environment variable
  // NEXTN_MIN_PARALLEL_WORK overrides it (for measurements).
  static constexpr int64_t kSplitWork = int64_t(32) << 10;
  int64_t min_parallel_work() const { return min_parallel_work_; }
  void set_min_parallel_work(int64_t work) { min_parallel_work_ = work; }

  // Number of chunks parallel_for uses: min(threads, max(1, n / grain)), so every chunk has >= grain
  // elements when there is more than one. 0 when n <= 0.
  static int chunk_count(int64_t n, int64_t grain, int threads);
  // [begin, end) of chunk i of `chunks` over [0, n): sizes differ by at most one, larger chunks first.
  static std::pair<int64_t, int64_t> chunk_range(int64_t n, int chunks, int i);

 private:
  void stop_and_join();
  void worker_main(int index);
  void run_chunk(const Fn& fn, int64_t n, int chunks, int index);
  // The newest published job's sequence number (even, != seen), or 0 once the pool stops.
  uint64_t wait_for_job(uint64_t seen);

  int n_threads_ = 1;
  int64_t min_parallel_work_ = kSplitWork;
  std::vector<std::thread> workers_;

  std::mutex call_mu_;  // one parallel_for at a time

  // The current job, published like a seqlock: seq_ is odd while the caller writes fn_/n_/chunks_ and
  // even once they are complete. A worker that reads them between two equal even values of seq_ has a
  // consistent job; one that started too late for a job (not needed by it) sees the next job instead.
  alignas(64) std::atomic<uint64_t> seq_{0};
  std::atomic<const Fn*> fn_{nullptr};
  std::atomic<int64_t> n_{0};
  std::atomic<int> chunks_{0};
  alignas(64) std::atomic<int> pending_{0};  // worker chunks of the current job not yet finished

  // Blocking, after spinning: workers wait on start_cv_, the caller on done_cv_. The counters say whether
  // anybody sleeps, so that a hand-off to spinning threads takes no lock and no system call.
  alignas(64) std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  std::atomic<int> sleepers_{0};
  std::atomic<bool> caller_sleeping_{false};
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> kept_work_{0};  // work kept on the callers while a worker slept (worth_waking)

  std::mutex error_mu_;
  std::exception_ptr error_;
};

// Serial-friendly entry point: runs fn(0, n, 0) on the calling thread when pool is null, has one thread,
// or n is too small to make two chunks of `grain`; otherwise pool->parallel_for(n, grain, fn).
void parallel_for(ThreadPool* pool, int64_t n, int64_t grain, const ThreadPool::Fn& fn);

// `pool` when `work` (multiply-adds plus bytes, as worth_waking counts it) is worth handing to its workers now:
// at least `min_work` (< 0: the pool's min_parallel_work()) and worth waking them. Else null: the caller runs it.
ThreadPool* pool_for_work(ThreadPool* pool, int64_t work, int64_t min_work = -1);

}  // namespace nextn
