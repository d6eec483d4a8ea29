#include "models/common/tensor_parallel.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <iterator>
#include <type_traits>
#include <unordered_map>

#include "core/error.h"
#include "core/shm_group.h"
#include "core/threadpool.h"
#include "models/registry.h"
#include "ops/cuda/cuda_collectives.h"
#include "ops/cuda/cuda_ops.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

extern char** environ;

namespace nextn {

namespace {

using Op = TensorParallelModel::Op;
using Command = TensorParallelModel::Command;
static_assert(std::is_trivially_copyable_v<Command> && std::is_trivially_copyable_v<MemoryOptions>);

constexpr int32_t kWantLogits = 1, kWantHidden = 2;

// A forward's segment on the wire; the segments' tokens follow them, in order.
struct SegmentWire {
  int64_t id, rows;
  int32_t all_logits, argmax;
};

// Rank 0's handle of a sequence every rank holds under the same id.
class ParallelSequence final : public SequenceState {
 public:
  ParallelSequence(TensorParallelModel* owner, int64_t id, std::unique_ptr<SequenceState> inner)
      : owner_(owner), id_(id), inner_(std::move(inner)) {}
  ~ParallelSequence() override {
    inner_.reset();
    owner_->send_release(id_);
  }
  int64_t length() const override { return inner_->length(); }
  int64_t capacity() const override { return inner_->capacity(); }
  void rollback(int64_t n) override {
    inner_->rollback(n);
    owner_->send_rollback(id_, n);
  }
  const TensorParallelModel* owner() const { return owner_; }
  int64_t id() const { return id_; }
  SequenceState& inner() { return *inner_; }

 private:
  TensorParallelModel* owner_;
  int64_t id_;
  std::unique_ptr<SequenceState> inner_;
};

// Logit rows a forward's segments ask for.
int64_t logit_rows(const SegmentWire* segs, int64_t count) {
  int64_t n = 0;
  for (int64_t i = 0; i < count; ++i) n += segs[i].all_logits ? segs[i].rows : 1;
  return n;
}

// Ranks 1.. as threads of this process, each with its model.
class LocalRanks final : public RankGroup {
 public:
  explicit LocalRanks(int ranks) : group(ranks) {}
  void join() override { group.join(); }
  LocalGroup group;
};

}  // namespace

// (rank 0 checked the engine's inputs before sending them: an error here is this rank's alone)
void serve_tensor_parallel_rank(Model& model, Communicator& comm) {
  std::unordered_map<int64_t, std::unique_ptr<SequenceState>> sequences;
  std::vector<char> payload;
  std::vector<BatchSegment> segments;
  std::vector<float> logits;
  std::vector<int32_t> argmax;
  const int64_t V = model.facts().vocab_size;
  // Test seam (processes only): this rank vanishes without a word at its first forward (as a crash would).
  const char* vanish = std::getenv("NEXTN_TEST_TP_EXIT_RANK");
  const bool vanishes = vanish && std::atoi(vanish) == comm.rank();
  try {
    for (;;) {
      Command cmd;
      comm.broadcast(&cmd, sizeof cmd, 0);
      if (payload.size() < size_t(cmd.payload_bytes)) payload.resize(size_t(cmd.payload_bytes));
      if (cmd.payload_bytes > 0) comm.broadcast(payload.data(), cmd.payload_bytes, 0);
      switch (cmd.op) {
        case Op::kStop:
          return;
        case Op::kConfigureMemory: {
          MemoryOptions options;
          std::memcpy(&options, payload.data(), sizeof options);
          model.configure_memory(options);
          break;
        }
        case Op::kReserve:
          model.reserve_batch(cmd.a, cmd.b);
          break;
        case Op::kUseDevice:
          model.use_device(Device(cmd.a));
          comm.barrier();
          break;
        case Op::kNewSequence:
          sequences[cmd.a] = model.new_sequence(cmd.b);
          break;
        case Op::kRollback:
          sequences.at(cmd.a)->rollback(cmd.b);
          break;
        case Op::kRelease:
          sequences.erase(cmd.a);
          break;
        case Op::kForward: {
          if (vanishes) std::_Exit(3);
          const int64_t count = cmd.a;
          const auto* wire = reinterpret_cast<const SegmentWire*>(payload.data());
          const auto* tokens = reinterpret_cast<const int32_t*>(payload.data() + count * sizeof(SegmentWire));
          const int64_t n = logit_rows(wire, count);
          if (cmd.flags & kWantLogits) {
            if (logits.size() < size_t(n * V)) logits.resize(size_t(n * V));
            if (argmax.size() < size_t(n)) argmax.resize(size_t(n));
          }
          segments.clear();
          int64_t row = 0, logit_row = 0;
          for (int64_t i = 0; i < count; ++i) {
            BatchSegment s;
            s.state = sequences.at(wire[i].id).get();
            s.tokens = tokens + row;
            s.rows = wire[i].rows;
            s.all_logits = wire[i].all_logits != 0;
            s.argmax = wire[i].argmax && (cmd.flags & kWantLogits) ? argmax.data() + logit_row : nullptr;
            segments.push_back(s);
            row += s.rows;
            logit_row += s.all_logits ? s.rows : 1;
          }
          model.forward(segments.data(), segments.size(), cmd.flags & kWantLogits ? logits.data() : nullptr, nullptr);
          break;
        }
      }
    }
  } catch (...) {
    comm.abort();
    throw;
  }
}

TensorParallelModel::TensorParallelModel(std::vector<std::unique_ptr<Model>> ranks) : models_(std::move(ranks)) {
  if (models_.empty()) throw Error("tensor parallel: no ranks");
  for (const auto& m : models_)
    if (!m) throw Error("tensor parallel: a rank without a model");
  models_[0]->check_tensor_parallel(static_cast<int>(models_.size()));  // (before any rank starts)
  auto local = std::make_unique<LocalRanks>(static_cast<int>(models_.size()));
  LocalGroup& group = local->group;
  group_ = std::move(local);
  comm_ = &group.start([this](Communicator& comm) {
    Model& model = *models_[size_t(comm.rank())];
    model.make_tensor_parallel_rank(comm);
    comm.barrier();  // (every rank's shard made: rank 0 returns from the constructor)
    serve_tensor_parallel_rank(model, comm);
  });
  try {
    models_[0]->make_tensor_parallel_rank(*comm_);
    comm_->barrier();
  } catch (...) {
    comm_->abort();
    group_->join();  // (a rank that failed on its own: its error, naming what it could not do)
    throw;
  }
}

TensorParallelModel::TensorParallelModel(std::unique_ptr<Model> rank0, Communicator& comm,
                                         std::unique_ptr<RankGroup> others, std::unique_ptr<ThreadPool> pool)
    : pool_(std::move(pool)), group_(std::move(others)), comm_(&comm) {
  models_.push_back(std::move(rank0));
}

TensorParallelModel::~TensorParallelModel() {
  if (failed_.empty()) {
    try {
      send({Op::kStop}, nullptr);
    } catch (const std::exception&) {
    }
  }
  try {
    group_->join();
  } catch (const std::exception&) {
  }
}

void TensorParallelModel::set_failed(const std::string& why) {
  const std::lock_guard<std::mutex> lock(failed_mu_);
  failed_ = why;
}

std::string TensorParallelModel::failure() const {
  const std::lock_guard<std::mutex> lock(failed_mu_);
  return failed_.empty() ? "" : "tensor parallel group failed: " + failed_;
}

void TensorParallelModel::check_alive() const {
  if (!failed_.empty()) throw Error("tensor parallel group failed earlier: " + failed_);
}

void TensorParallelModel::send(const Command& cmd, const void* payload) {
  check_alive();
  Command c = cmd;
  comm_->broadcast(&c, sizeof c, 0);
  if (c.payload_bytes > 0) comm_->broadcast(const_cast<void*>(payload), c.payload_bytes, 0);
}

template <typename F>
auto TensorParallelModel::on_rank0(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {
    set_failed(e.what());
    comm_->abort();
    try {
      group_->join();  // (another rank's own error, if it failed first)
    } catch (const std::exception& first) {
      set_failed(first.what());
    }
    throw Error("tensor parallel group failed: " + failed_);
  }
}

void TensorParallelModel::prefault(bool progress) const {
  // (the ranks map the same files: one pass brings every rank's pages in)
  models_[0]->prefault(progress);
}

void TensorParallelModel::configure_memory(const MemoryOptions& options) {
  const std::lock_guard<std::mutex> lock(mu_);
  check_alive();
  models_[0]->configure_memory(options);  // (what it refuses, every rank would: nothing sent)
  Command cmd{Op::kConfigureMemory};
  cmd.payload_bytes = sizeof options;
  on_rank0([&] { send(cmd, &options); });
}

bool TensorParallelModel::runs_on(Device device) const {
  if (device == Device::kCpu) return true;
  return models_[0]->shards_on(device) && models_[0]->runs_on(device) && cuda::device_count() >= ranks();
}

void TensorParallelModel::use_device(Device device) {
  const std::lock_guard<std::mutex> lock(mu_);
  check_alive();
  if (device == models_[0]->device()) return;
  // (what every rank would refuse is refused here: nothing is sent, and the group goes on)
  if (!models_[0]->shards_on(device))
    throw Error("--tensor-parallel: " + models_[0]->facts().model_type +
                "'s ranks run on the CPU backend only so far (docs/parallel.md)");
  std::string why;
  if (device == Device::kCuda && !cuda::available(&why)) throw Error("--device cuda: " + why);
  Command cmd{Op::kUseDevice};
  cmd.a = int64_t(device);
  on_rank0([&] {
    send(cmd, nullptr);
    models_[0]->use_device(device);
    comm_->barrier();  // (every rank on its device: the next command finds them there)
  });
}

std::string TensorParallelModel::memory_summary() const {
  return models_[0]->memory_summary() + " (on each of " + std::to_string(ranks()) + " tensor-parallel ranks)";
}

std::unique_ptr<SequenceState> TensorParallelModel::new_sequence(int64_t capacity) {
  const std::lock_guard<std::mutex> lock(mu_);
  check_alive();
  auto inner = models_[0]->new_sequence(capacity);  // (refused: refused on every rank, nothing sent)
  const int64_t id = next_id_++;
  Command cmd{Op::kNewSequence};
  cmd.a = id;
  cmd.b = capacity;
  on_rank0([&] { send(cmd, nullptr); });
  return std::make_unique<ParallelSequence>(this, id, std::move(inner));
}

void TensorParallelModel::send_rollback(int64_t id, int64_t n) {
  const std::lock_guard<std::mutex> lock(mu_);
  check_alive();
  Command cmd{Op::kRollback};
  cmd.a = id;
  cmd.b = n;
  on_rank0([&] { send(cmd, nullptr); });
}

void TensorParallelModel::send_release(int64_t id) noexcept {
  const std::lock_guard<std::mutex> lock(mu_);
  if (!failed_.empty()) return;
  Command cmd{Op::kRelease};
  cmd.a = id;
  try {
    send(cmd, nullptr);
  } catch (const std::exception& e) {
    set_failed(e.what());
  }
}

std::unique_ptr<DraftSession> TensorParallelModel::new_draft_session(SequenceState& sequence,
                                                                    const DraftOptions& options) {
  auto* seq = dynamic_cast<ParallelSequence*>(&sequence);
  if (!seq || seq->owner() != this) throw Error("new_draft_session: the sequence does not belong to this model");
  return models_[0]->new_draft_session(seq->inner(), options);
}

void TensorParallelModel::reserve_batch(int64_t rows, int64_t positions) {
  const std::lock_guard<std::mutex> lock(mu_);
  check_alive();
  models_[0]->reserve_batch(rows, positions);
  Command cmd{Op::kReserve};
  cmd.a = rows;
  cmd.b = positions;
  on_rank0([&] { send(cmd, nullptr); });
}

void TensorParallelModel::forward(const BatchSegment* segments, size_t count, float* logits, float* hidden) {
  const std::lock_guard<std::mutex> lock(mu_);
  check_alive();
  // Everything a rank could refuse is checked here, before any rank starts.
  const int64_t V = facts().vocab_size;
  int64_t rows = 0;
  for (size_t i = 0; i < count; ++i) {
    const BatchSegment& g = segments[i];
    auto* seq = dynamic_cast<ParallelSequence*>(g.state);
    if (!seq || seq->owner() != this) throw Error("forward: a sequence does not belong to this model");
    if (g.rows < 0 || g.rows > seq->capacity() - seq->length())
      throw Error("forward: " + std::to_string(g.rows) + " rows do not fit in a sequence of " +
                  std::to_string(seq->length()) + " of " + std::to_string(seq->capacity()) + " positions");
    check_token_ids(g.tokens, g.rows, V);
    rows += g.rows;
  }
  const size_t bytes = count * sizeof(SegmentWire) + size_t(rows) * sizeof(int32_t);
  if (payload_.size() < bytes) payload_.resize(bytes);
  auto* wire = reinterpret_cast<SegmentWire*>(payload_.data());
  auto* tokens = reinterpret_cast<int32_t*>(payload_.data() + count * sizeof(SegmentWire));
  inner_.clear();
  for (size_t i = 0; i < count; ++i) {
    const BatchSegment& g = segments[i];
    auto* seq = static_cast<ParallelSequence*>(g.state);
    wire[i] = {seq->id(), g.rows, g.all_logits ? 1 : 0, g.argmax ? 1 : 0};
    std::copy(g.tokens, g.tokens + g.rows, tokens);
    tokens += g.rows;
    BatchSegment s = g;
    s.state = &seq->inner();
    inner_.push_back(s);
  }
  Command cmd{Op::kForward};
  cmd.flags = (logits ? kWantLogits : 0) | (hidden ? kWantHidden : 0);
  cmd.a = int64_t(count);
  cmd.payload_bytes = int64_t(bytes);
  on_rank0([&] {
    send(cmd, payload_.data());
    models_[0]->forward(inner_.data(), inner_.size(), logits, hidden);
  });
}


// ---------------------------------------------------------------------------------------------------
// Ranks as processes

namespace {

// Ranks 1.. as child processes over a shared-memory group.
class ProcessRanks final : public RankGroup {
 public:
  explicit ProcessRanks(std::unique_ptr<ShmGroup> g) : shm(std::move(g)) {}
  ~ProcessRanks() override {
    try {
      join();
    } catch (const std::exception&) {
    }
  }
  // Whether every child still runs (a child that has ended is reaped, its status kept).
  bool all_alive() {
    bool alive = true;
    for (size_t i = 0; i < pids.size(); ++i)
      if (!ended[i] && ::waitpid(pids[i], &status[i], WNOHANG) == pids[i]) ended[i] = true;
    for (size_t i = 0; i < pids.size(); ++i) alive = alive && !ended[i];
    return alive;
  }
  // Throws the first child's failure unless rank 0 (this process) failed first: its own error stands then.
  void join() override {
    const bool rank0_failed = shm->first_failed() == 0;
    std::string first;
    for (size_t i = 0; i < pids.size(); ++i) {
      if (!ended[i]) {
        while (::waitpid(pids[i], &status[i], 0) < 0 && errno == EINTR) {
        }
        ended[i] = true;
      }
      const int st = status[i];
      const bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
      if (!ok && first.empty())
        first = "tensor parallel rank " + std::to_string(i + 1) +
                (WIFSIGNALED(st) ? " was killed by signal " + std::to_string(WTERMSIG(st))
                                 : " exited with status " + std::to_string(WEXITSTATUS(st)) +
                                       " (its own message, if any, above)");
    }
    pids.clear();
    ended.clear();
    status.clear();
    if (!first.empty() && !rank0_failed) throw Error(first);
  }
  void spawn(const std::vector<std::string>& launcher, const std::vector<std::string>& args) {
    const std::string& exe = launcher.at(0);
    std::vector<char*> argv;
    for (const std::string& a : launcher) argv.push_back(const_cast<char*>(a.c_str()));
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);  // (rank 0 owns stdout)
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) throw Error("tensor parallel: cannot start " + exe + " (" + std::strerror(rc) + ")");
    pids.push_back(pid);
    ended.push_back(false);
    status.push_back(0);
  }

  std::unique_ptr<ShmGroup> shm;
  std::vector<pid_t> pids;
  std::vector<bool> ended;
  std::vector<int> status;
};

}  // namespace

std::vector<std::string> rank_launcher(const std::string& exe, const std::vector<std::string>& cmdline) {
  const std::string name = exe.substr(exe.find_last_of('/') + 1);
  const bool loader = name.rfind("ld-", 0) == 0 && name.find(".so") != std::string::npos;
  if (!loader || cmdline.empty()) return {exe};
  // The loader's options before the program: those that take a value take the next argument.
  static const char* const kWithValue[] = {"--library-path", "--preload", "--argv0", "--inhibit-rpath", "--audit",
                                           "--glibc-hwcaps-prepend", "--glibc-hwcaps-mask"};
  std::vector<std::string> out{exe};
  for (size_t i = 1; i < cmdline.size(); ++i) {
    const std::string& a = cmdline[i];
    out.push_back(a);
    if (a.rfind("--", 0) != 0) return out;  // the program
    if (std::find(std::begin(kWithValue), std::end(kWithValue), a) != std::end(kWithValue) && i + 1 < cmdline.size())
      out.push_back(cmdline[++i]);
  }
  throw Error("--tensor-parallel: this process runs under " + exe + ", but its command line names no program");
}

std::unique_ptr<Model> load_tensor_parallel_processes(const std::string& dir, int ranks,
                                                      const std::vector<std::string>& launcher, int threads) {
  if (ranks < 2) throw Error("tensor parallel processes: needs 2 ranks or more");
  if (launcher.empty()) throw Error("internal: tensor parallel processes without a program to start");
  // Rank 0 first, alone: what every rank would refuse (the checkpoint, the split) is said once, before any
  // process starts.
  auto pool = std::make_unique<ThreadPool>(threads);
  std::unique_ptr<Model> model = load_model(dir, pool.get());
  model->check_tensor_parallel(ranks);
  auto group = std::make_unique<ProcessRanks>(ShmGroup::create(ranks));
  ProcessRanks* g = group.get();
  Communicator& comm = g->shm->comm();
  try {
    for (int r = 1; r < ranks; ++r)
      g->spawn(launcher, {"tensor-parallel-rank", "--model", dir, "--group", g->shm->name(), "--rank",
                          std::to_string(r), "--threads", std::to_string(threads)});
    g->shm->set_liveness([g] { return g->all_alive(); });
    model->make_tensor_parallel_rank(comm);
    comm.barrier();  // (every rank attached and sharded)
    g->shm->unlink();
  } catch (...) {
    comm.abort();
    g->join();  // (a rank that failed first: its exit status; its message is on stderr)
    throw;
  }
  return std::make_unique<TensorParallelModel>(std::move(model), comm, std::move(group), std::move(pool));
}

int run_tensor_parallel_rank(const std::string& dir, const std::string& group, int rank, int threads) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // (rank 0 gone: so is this rank)
  const pid_t parent = ::getppid();
  std::unique_ptr<ShmGroup> shm;
  try {
    shm = ShmGroup::attach(group, rank);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nextn: tensor parallel rank %d: %s\n", rank, e.what());
    return 1;
  }
  shm->set_liveness([parent] { return ::getppid() == parent; });
  Communicator& comm = shm->comm();
  try {
    ThreadPool pool(threads);
    std::unique_ptr<Model> model = load_model(dir, &pool);
    model->make_tensor_parallel_rank(comm);
    comm.barrier();
    serve_tensor_parallel_rank(*model, comm);
    return 0;
  } catch (const std::exception& e) {
    comm.abort();
    const std::string what = e.what();
    if (what.find("another rank failed") == std::string::npos)  // (else the rank that failed says why)
      std::fprintf(stderr, "nextn: tensor parallel rank %d: %s\n", rank, e.what());
    return 1;
  }
}

}  // namespace nextn
