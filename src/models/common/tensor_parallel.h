// A tensor-parallel group of ranks as one Model (docs/parallel.md, P12). Rank 0 is this Model: the engine calls
// it as any other; every call that changes what the ranks hold (memory sizing, a sequence made, rolled back or
// dropped, a target forward) is first sent to the other ranks as a command over the communicator, and every
// rank then makes the same call on its own model, which meets the others in the forward's collectives. The MTP
// layers run on rank 0 alone, whole (the seed: "the draft head always runs on a single rank"): drafting needs
// only the target's hidden rows, which every rank holds after the last reduction.
//
// Errors: what the engine can get wrong (a token outside the vocabulary, a sequence past its capacity) is
// checked here before anything is sent, so the ranks never disagree on it. A failure on one rank alone
// (memory) aborts the group: every rank's collectives throw instead of waiting, and from then on every call
// throws naming the first error.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/communicator.h"
#include "models/model.h"

namespace nextn {

class ThreadPool;

// Ranks 1.. of a group, whatever form they take (threads, processes): join() waits until they have ended and
// throws the error of the first that failed on its own.
class RankGroup {
 public:
  virtual ~RankGroup() = default;
  virtual void join() = 0;
};

class TensorParallelModel final : public Model {
 public:
  // ranks[r] is rank r's model, loaded from the same checkpoint and not yet used; rank r > 0 runs on a thread of
  // its own (LocalGroup) until this model is destroyed. Each is made a tensor-parallel rank here (throws
  // nextn::Error for a family or checkpoint that does not shard).
  explicit TensorParallelModel(std::vector<std::unique_ptr<Model>> ranks);
  // Rank 0 of a group whose other ranks run elsewhere and already serve (serve_tensor_parallel_rank): `rank0` is
  // this process's model, made a rank over `comm` (rank 0's), and `others` their handle.
  // pool: rank 0's thread pool when the group owns it (null: the caller's, which outlives this model).
  TensorParallelModel(std::unique_ptr<Model> rank0, Communicator& comm, std::unique_ptr<RankGroup> others,
                      std::unique_ptr<ThreadPool> pool = nullptr);
  ~TensorParallelModel() override;

  int ranks() const { return comm_->size(); }
  Model& rank0() { return *models_[0]; }

  const ModelFacts& facts() const override { return models_[0]->facts(); }
  // On GPUs (families whose ranks shard there): chosen by default only with a GPU for every rank; every rank
  // moves to its GPU at once (use_device), rank r to GPU r mod the GPUs it sees.
  bool runs_on(Device device) const override;
  void use_device(Device device) override;
  Device device() const override { return models_[0]->device(); }
  ThreadPool* host_pool() const override { return models_[0]->host_pool(); }
  bool shards_on(Device device) const override { return models_[0]->shards_on(device); }
  std::string collectives() const override { return models_[0]->collectives(); }
  void prefault(bool progress) const override;
  void configure_memory(const MemoryOptions& options) override;
  bool can_admit(int64_t capacity, bool drafting) const override { return models_[0]->can_admit(capacity, drafting); }
  bool could_ever_admit(int64_t capacity, bool drafting) const override {
    return models_[0]->could_ever_admit(capacity, drafting);
  }
  std::string memory_summary() const override;
  double kv_usage() const override { return models_[0]->kv_usage(); }
  std::unique_ptr<SequenceState> new_sequence(int64_t capacity) override;
  std::unique_ptr<DraftSession> new_draft_session(SequenceState& sequence, const DraftOptions& options) override;
  void reserve_batch(int64_t rows, int64_t positions) override;
  void forward(const BatchSegment* segments, size_t count, float* logits, float* hidden) override;
  void run_draft_rounds(DraftRound* const* rounds, size_t n) override { models_[0]->run_draft_rounds(rounds, n); }
  std::string use_draft_head(DraftHeadKind kind) override { return models_[0]->use_draft_head(kind); }
  void prompt_draft_logits(const int32_t* tokens, int64_t T, const float* hidden, float* logits) override {
    models_[0]->prompt_draft_logits(tokens, T, hidden, logits);
  }
  size_t checkpoint_bytes() const override { return models_[0]->checkpoint_bytes(); }
  size_t weight_bytes_total() const override { return models_[0]->weight_bytes_total(); }
  size_t last_forward_weight_bytes() const override { return models_[0]->last_forward_weight_bytes(); }
  int64_t kv_bytes_per_position(bool drafting) const override { return models_[0]->kv_bytes_per_position(drafting); }
  int64_t memory_bytes_for(int64_t sequences, int64_t capacity, int64_t page_tokens) const override {
    return models_[0]->memory_bytes_for(sequences, capacity, page_tokens);
  }
  std::string failure() const override;

  // The command every rank > 0 waits for (the wire format between rank 0 and the others).
  enum class Op : int32_t { kStop, kConfigureMemory, kReserve, kNewSequence, kRollback, kRelease, kForward, kUseDevice };
  struct Command {
    Op op = Op::kStop;
    int32_t flags = 0;             // kForward: 1 logits wanted, 2 hidden wanted
    int64_t a = 0, b = 0, c = 0;   // per op: sequence id, sizes, positions, the device
    int64_t payload_bytes = 0;     // broadcast right after the command
  };
  // Sent by the sequences this model hands out (their rollback and destruction).
  void send_rollback(int64_t id, int64_t n);
  void send_release(int64_t id) noexcept;

 private:
  // Sends cmd (and its payload) to ranks 1..; throws when the group has failed.
  void send(const Command& cmd, const void* payload);
  // Runs rank 0's part of a command; an error there aborts the group (the other ranks may wait on rank 0).
  template <typename F>
  auto on_rank0(F&& f) -> decltype(f());
  void check_alive() const;
  void set_failed(const std::string& why);

  std::unique_ptr<ThreadPool> pool_;            // rank 0's, when it is the group's (outlives the models)
  std::vector<std::unique_ptr<Model>> models_;  // rank 0's, and (threads) the others'
  std::unique_ptr<RankGroup> group_;
  Communicator* comm_ = nullptr;  // rank 0's
  std::mutex mu_;                 // one command at a time, whichever thread calls
  int64_t next_id_ = 0;
  std::string failed_;            // the error that broke the group (empty: it works)
  mutable std::mutex failed_mu_;  // failed_ as other threads read it (failure())
  std::vector<char> payload_;
  std::vector<BatchSegment> inner_;  // a forward's segments over rank 0's own sequences
};

// What ranks 1.. do until rank 0 says stop: every command as rank 0 ran it, on this rank's model (already made a
// rank over comm). An error here is this rank's alone: it aborts the group and is rethrown.
void serve_tensor_parallel_rank(Model& model, Communicator& comm);

// Rank 0 of `ranks` processes (docs/parallel.md: a process per GPU, started by nextn itself): ranks 1.. are
// started as `launcher... tensor-parallel-rank ...` (launcher[0] the file executed, then its arguments: this
// program, rank_launcher; the CLI's hidden command; their stdout discarded, their stderr kept) and meet this
// process over a shared-memory group; every rank, this one included, computes with `threads` threads of its own
// (a pool's idle workers spin for a while: ranks sharing cores must not oversubscribe them). A rank that cannot
// load (or dies later) fails the group with its exit status, its own message on stderr.
std::unique_ptr<Model> load_tensor_parallel_processes(const std::string& dir, int ranks,
                                                      const std::vector<std::string>& launcher, int threads);

// How to start this program again: {exe} when exe (/proc/self/exe) is the program itself; when it is the
// dynamic loader, run explicitly (`ld-linux-x86-64.so.2 [--library-path DIR ...] PROGRAM ARGS`, as packaged
// copies of nextn are), the loader, its options and the program from the process's command line `cmdline`.
std::vector<std::string> rank_launcher(const std::string& exe, const std::vector<std::string>& cmdline);
// The hidden command's body: rank `rank` of the group named `group`; returns the process's exit status.
int run_tensor_parallel_rank(const std::string& dir, const std::string& group, int rank, int threads);

}  // namespace nextn
