// What the engine needs of a model family, and nothing more. Each family (src/models/<family>/) implements
// Model and registers itself under its config.json `model_type` (models/registry.h); the CLI, bench and
// the speculative engine only ever see this interface.
//
//   Model            weights + forward over a batch of rows from many sequences
//   SequenceState    one sequence's memory in the model (KV pages, recurrent state), rolled back by position
//   DraftSession     one sequence's MTP drafter: catch up on verified positions, draft k tokens, drop them
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "models/common/draft_head.h"
#include "models/common/draft_round.h"

namespace nextn {

class ThreadPool;
class Communicator;

// Facts about a loaded checkpoint that the engine, `inspect` and `bench` use.
struct ModelFacts {
  std::string model_type;         // config.json's model_type, e.g. "hy_v4"
  std::string dir;                // the checkpoint folder
  int64_t vocab_size = 0;
  int64_t hidden_width = 0;       // floats per row of the hidden state handed from the target to the drafter
  int64_t context = 0;            // max_position_embeddings
  int num_mtp_layers = 0;         // 0: no drafting
  int64_t sparse_budget = 0;      // keys a sparse-attention query selects (HY V4: index_topk); 0: dense
  std::vector<int32_t> eos_token_ids;
};

// Where a model's forwards run: the CPU backend, or the CUDA one (docs/backend.md says which families it runs).
enum class Device { kCpu, kCuda };

// How the model sizes the KV memory it shares between sequences.
struct MemoryOptions {
  int64_t kv_cache_bytes = 0;  // 0: enough for one sequence as long as the context (what single runs need)
  int64_t page_tokens = 64;    // positions per KV page
  // Rows of the largest verify (k + 1): models with recurrent state keep the state after each of them, so that
  // rolling back to any is free (Qwen4-Exp: max_verify_rows state slots per sequence, as vLLM's 1 + k).
  int64_t max_verify_rows = 9;  // k <= 8, the CLI's limit
};

// The most rows a decoding sequence drafting k tokens (0: plain decoding) puts in one forward of a step: its
// k + 1-row verify, or an MTP layer's catch-up over the k + 1 positions it kept with the first draft row merged in.
constexpr int64_t forward_rows_per_sequence(int k) { return k > 0 ? k + 2 : 1; }

// One sequence's memory. Positions [0, length()) have been run through the target.
class SequenceState {
 public:
  virtual ~SequenceState() = default;
  virtual int64_t length() const = 0;
  virtual int64_t capacity() const = 0;  // positions it may hold (its reservation)
  // Forget positions >= n (rejected drafts). n >= length() - (k + 1) for the k of the last round.
  virtual void rollback(int64_t n) = 0;
};

// Throws nextn::Error unless every id of tokens [n] lies in [0, vocab).
inline void check_token_ids(const int32_t* tokens, int64_t n, int64_t vocab) {
  for (int64_t s = 0; s < n; ++s)
    if (tokens[s] < 0 || tokens[s] >= vocab)
      throw Error("token id " + std::to_string(tokens[s]) + " outside the vocabulary [0, " + std::to_string(vocab) + ")");
}

// One sequence's rows in a batch: tokens at positions state->length() .. + rows - 1.
struct BatchSegment {
  SequenceState* state = nullptr;
  const int32_t* tokens = nullptr;
  int64_t rows = 0;
  bool all_logits = true;  // false: logits of the last row only (prefill)
  // Not null: the engine reads only each of the segment's logit rows' argmax (greedy without penalties or
  // logprobs). The model writes argmax[i] for logit row i (the lowest index of the row's largest value, or -1
  // when the row holds a NaN or inf) and may leave those rows of `logits` unwritten: a GPU backend then sends
  // back ids instead of the vocabulary-wide rows.
  int32_t* argmax = nullptr;
};

// Drafting for one sequence with the checkpoint's MTP layers. The engine drives it once per round:
//   push_verified(hidden of the positions the target just kept)  — after prefill and after every verify
//   round(tokens so far, k, picker)                              — catch up on them, then k draft steps,
//       each step's raw logits [V] handed to the picker, which returns the draft token
// A round is a coroutine that waits on its MTP forwards: Model::run_draft_rounds runs many sequences' rounds
// with their forwards batched. The drafts only ever change speed: the engine verifies every one of them.
class DraftSession {
 public:
  virtual ~DraftSession() = default;
  virtual void push_verified(const float* hidden, int64_t rows) = 0;
  // Right after prefill (before any round): the layers' first catch-up over the prompt, for up to k_max steps.
  virtual void catch_up_prompt(const std::vector<int32_t>& tokens, int k_max) = 0;
  // `tokens` and `picker` must outlive the round. k = 0: no step (the catch-up is deferred).
  virtual DraftRound round(const std::vector<int32_t>& tokens, int k, DraftPicker& picker) = 0;
  // Verified positions whose catch-up is still deferred (k = 0 rounds batch it for later), and the most a
  // later catch-up runs (older deferred positions are dropped: the drafter restarts from the newest).
  virtual int64_t pending_rows() const = 0;
  virtual int64_t deferred_window() const = 0;
  // The last round's share of the batched forwards it ran: catch-up, and draft steps with their logits.
  virtual double round_catch_up_seconds() const = 0;
  virtual double round_draft_seconds() const = 0;
  virtual int64_t forwards() const = 0;  // MTP forwards this sequence took part in
};

struct DraftOptions {
  int k_max = 3;
  bool merge_catch_up = true;  // false (test seam): run draft step 1 in a forward of its own
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelFacts& facts() const = 0;

  // Reads every weight once (page faults up front) and throws nextn::Error naming the first tensor that holds
  // a NaN or inf; with `progress` and a terminal on stderr, large checkpoints show a progress bar.
  virtual void prefault(bool progress) const = 0;

  // Whether this family runs on `device` (CUDA: both families), and moving its forwards there: weights
  // uploaded once, KV memory on the device. Before the first sequence; throws nextn::Error saying why not.
  virtual bool runs_on(Device device) const { return device == Device::kCpu; }
  virtual void use_device(Device device) {
    if (device != Device::kCpu) throw Error(facts().model_type + ": the CUDA backend does not run this family yet");
  }
  virtual Device device() const { return Device::kCpu; }
  // The host threads for work between forwards (the engine's sampling of many sequences' rows, the drafts'
  // picks): the pool the model was loaded with; null: the caller's thread alone.
  virtual ThreadPool* host_pool() const { return nullptr; }

  // Makes this model rank comm.rank() of a tensor-parallel group of comm.size() ranks (docs/parallel.md):
  // before the first sequence; every rank's model must then run the same target forwards in the same order
  // (TensorParallelModel, models/common/tensor_parallel.h, sees to it). Throws nextn::Error for a family
  // that does not shard.
  virtual void make_tensor_parallel_rank(Communicator& comm) {
    (void)comm;
    check_tensor_parallel(2);
  }
  // Whether this family's tensor-parallel ranks run on `device` (their target forwards over a shard).
  virtual bool shards_on(Device device) const { return device == Device::kCpu; }
  // How a tensor-parallel group's ranks exchange rows on their GPUs ("NCCL 2.27.7", "through host memory");
  // empty for one rank or on the CPU.
  virtual std::string collectives() const { return ""; }
  // Empty while the model can run forwards; else why it cannot any more (a tensor-parallel group one of whose
  // ranks failed). Any thread may ask (the server's /health).
  virtual std::string failure() const { return ""; }
  // Throws nextn::Error saying why the model cannot be split over `ranks` ranks (nothing is made).
  virtual void check_tensor_parallel(int ranks) const {
    (void)ranks;
    throw Error(facts().model_type + ": tensor parallelism is not implemented for this family yet");
  }

  // Sizes the shared KV memory (before the first sequence; later calls throw).
  virtual void configure_memory(const MemoryOptions& options) = 0;
  // Whether a sequence of `capacity` positions (with its drafter's memory when `drafting`) fits in what the
  // live sequences have left, and, for messages, whether it would fit in the empty memory at all.
  virtual bool can_admit(int64_t capacity, bool drafting) const = 0;
  virtual bool could_ever_admit(int64_t capacity, bool drafting) const = 0;
  virtual std::string memory_summary() const = 0;  // "KV pool 512 MiB: 3 of 64 pages in use, ..."
  // The share of the target's KV pool reserved by live sequences, 0..1 (vLLM's kv_cache_usage_perc); 0 before
  // configure_memory.
  virtual double kv_usage() const = 0;
  // A sequence of up to `capacity` positions (throws nextn::Error when its memory does not fit).
  virtual std::unique_ptr<SequenceState> new_sequence(int64_t capacity) = 0;
  // The sequence's MTP drafter (null when the checkpoint has no MTP layers).
  virtual std::unique_ptr<DraftSession> new_draft_session(SequenceState& sequence, const DraftOptions& options) = 0;

  // Grows the forward's buffers for batches of up to `rows` rows over sequences of up to `positions`
  // positions, so that steps that stay within them never allocate.
  virtual void reserve_batch(int64_t rows, int64_t positions) = 0;
  // Runs, before the first request, every forward shape a batch of up to `rows` rows over sequences of up to
  // `positions` positions will run (each padded row count of the target's forwards and of each MTP layer's
  // in each of its kinds), so that no decode step of such a batch does one-off work: a GPU backend records
  // their CUDA graphs now, as vLLM captures its graphs at startup. Returns the forward shapes it prepared
  // (0: nothing to prepare, as on the CPU). The shapes of longer forwards (prompts) are still recorded as they
  // recur.
  // (A sequence drafting k tokens puts at most forward_rows_per_sequence(k) rows in one of its step's forwards.)
  virtual int64_t prepare_forwards(int64_t rows, int64_t positions) {
    (void)rows;
    (void)positions;
    return 0;
  }
  // One forward over the rows of many sequences; each sequence's rows are appended to its state. A row's
  // values never depend on the other rows of the batch (bit for bit).
  // logits: per segment, rows × V (all_logits) or 1 × V, in segment order; hidden: all rows × hidden_width
  // (either may be null).
  virtual void forward(const BatchSegment* segments, size_t count, float* logits, float* hidden) = 0;

  // Runs draft rounds of this model's sessions (any number of sequences) to their ends, their MTP forwards
  // batched. Never throws: a round that fails holds its error (DraftRound::error).
  virtual void run_draft_rounds(DraftRound* const* rounds, size_t n) = 0;
  // The lm_head the draft steps multiply by (models/common/draft_head.h), set after use_device; returns one
  // line saying what the drafts use ("" for a model without MTP layers). Never changes the target's output.
  virtual std::string use_draft_head(DraftHeadKind kind) {
    (void)kind;
    return "";
  }

  // The first MTP layer teacher-forced over a prompt of T tokens whose target hidden states are `hidden`
  // [T, hidden_width]: position p gets token p+1 and hidden p; logits [T-1, V] (`nextn logits --draft`).
  virtual void prompt_draft_logits(const int32_t* tokens, int64_t T, const float* hidden, float* logits) = 0;

  // Bytes of the checkpoint's weight files, of the weights one token's forward reads, and of those the
  // last forward read (MoE: the experts its rows used).
  virtual size_t checkpoint_bytes() const = 0;
  virtual size_t weight_bytes_total() const = 0;
  virtual size_t last_forward_weight_bytes() const = 0;
  // Forwards (target or MTP) so far that did one-off work a later forward of the same shape will not (a GPU
  // backend's first run of a shape and its graph recording): a step with one is no measure of speed.
  virtual uint64_t one_off_forwards() const { return 0; }
  // Bytes of KV memory one position of a sequence takes in the target's layers (what a decode step reads per
  // cached position when it reads the whole cache), plus those of all its MTP layers when `drafting`.
  virtual int64_t kv_bytes_per_position(bool drafting) const = 0;
  // The MemoryOptions::kv_cache_bytes that hold `sequences` drafting sequences of `capacity` positions at once
  // (pages of page_tokens; with recurrent state, the state of each).
  virtual int64_t memory_bytes_for(int64_t sequences, int64_t capacity, int64_t page_tokens) const = 0;
};

// One round alone, in a batch of one (bench, tests); throws the round's error.
inline void run_draft_round(Model& model, DraftSession& session, const std::vector<int32_t>& tokens, int k,
                            DraftPicker& picker) {
  DraftRound round = session.round(tokens, k, picker);
  DraftRound* one = &round;
  model.run_draft_rounds(&one, 1);
  if (round.error()) std::rethrow_exception(round.error());
}

}  // namespace nextn
