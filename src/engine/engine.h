// The speculative engine: many sequences stepped together (continuous batching).
//
// Each step
//   1. admits waiting requests, first come first served, while the model's KV pool has room for them (a
//      request reserves the pages of its whole capacity, so a step never runs out of memory);
//   2. lets every decoding sequence draft its own k tokens with its MTP drafter (k chosen for the whole batch
//      by measured speed: KTuner over the batch's time per sequence-round, one tuner per batch size class,
//      a new class starting from its nearest neighbour's; a step counts as one observation);
//   3. runs ONE target forward over the rows of all of them: prefill prompts and k+1-row verify blocks (two
//      when the k tuner needs the rounds timed apart from prompts that arrived: see step());
//   4. accepts and rolls back per sequence, and retires the finished ones (their pages go back at once).
// A row's logits do not depend on the other rows of the forward, so every sequence's output is exactly what
// it would be alone.
#pragma once
#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/k_tuner.h"
#include "engine/request.h"
#include "engine/sequence.h"
#include "models/model.h"

namespace nextn {

struct EngineOptions {
  int max_sequences = 256;  // sequences decoding at once (admission waits beyond it)
  // Prompt rows one step's forward takes: the prompts after that wait for the next step, in arrival order
  // (the first always runs, whatever its length). A forward's workspace and the GPU's launches grow with its
  // rows; 64 long prompts arriving at once must not make one forward of 100k rows.
  int64_t max_prompt_rows_per_step = 8192;
  // Test seam: the sequences' decisions (Sequence::decide_*) on the model's host pool whatever their work.
  bool split_decisions_for_tests = false;
};

class Engine {
 public:
  explicit Engine(Model& model, EngineOptions options = {});
  ~Engine();

  // Queues a request and returns its id (0, 1, ...). Throws nextn::Error for a bad request, or one whose
  // memory would not fit in the model's KV pool even with no other sequence.
  int64_t submit(Request request);
  bool idle() const { return waiting_.empty() && active_.empty(); }
  size_t active() const { return active_.size(); }
  size_t waiting() const { return waiting_.size(); }
  void step();
  // Ends request `id`, waiting or running, between steps: its KV pages go back to the pool at once and it
  // finishes with finish_reason "abort" (its result comes from take_finished). False: no such live request.
  bool cancel(int64_t id);
  void run();  // steps until idle
  // Requests finished since the last call, in the order they finished: (id, result).
  std::vector<std::pair<int64_t, GenerationResult>> take_finished();

  // Steps run, and how many of them ran at each batch k (tuned sequences only).
  int64_t steps() const { return steps_; }

  // What the k tuner of each batch size class that ran has learned (bench and diagnostics): its estimate of a
  // sequence-round's time per token at each k, to set against what fixed-k runs measure.
  struct TunerClass {
    int64_t min_sequences = 0;               // the class: min_sequences .. max_sequences sequences
    int64_t max_sequences = 0;               // (2 · min_sequences - 1, but the last class has no bound)
    bool contains(int64_t sequences) const { return min_sequences <= sequences && sequences <= max_sequences; }
    std::vector<double> seconds_per_token;   // per k (0: never measured)
    std::vector<int64_t> rounds;             // sequence-rounds run at each k
    int best_k = 0;                          // what it runs when not probing
    double noise = 0;                        // its rounds' relative spread (k_tuner.h)
    double budget_tokens = 0;                // its probe budget, in plain tokens
    std::vector<char> hopeless;              // per k: ruled out by smaller batches' costs (k_tuner.h)
  };
  std::vector<TunerClass> tuner_classes() const;

 private:
  struct Entry {
    int64_t id;
    std::unique_ptr<Sequence> seq;
  };
  void admit();
  void retire_finished();
  void run_forward(size_t begin, size_t end);
  void decide_all(size_t begin, size_t end);
  void draft_all(int k_batch);
  KTuner& tuner_for(int64_t tuned_sequences);
  // The tuner of the class `tuned_sequences` form, if it exists (none is made).
  const KTuner* existing_tuner_for(int64_t tuned_sequences) const;
  static size_t tuner_bucket(int64_t tuned_sequences);
  // step_seconds < 0: the step is not a measurement (its rounds only count in the sequences' stats);
  // one_off: it did one-off work (Model::one_off_forwards), and its time only pays from the probe budget (as
  // does a step with a backlog catch-up).
  void record_tuner(KTuner& tuner, double step_seconds, bool one_off);

  Model& model_;
  EngineOptions options_;
  int64_t next_id_ = 0, steps_ = 0;
  bool decoded_ = false;           // a step with decoding rounds ran
  bool plain_now_ = false;         // this step's tuner chose plain decoding, not as a probe (see step())
  double arrival_draft_seconds_ = 0;  // this step's prompts' MTP prefill (KTuner::record_arrival_overhead),
  double arrival_draft_tokens_ = 0;   // and the tokens they may generate
  int64_t unmeasured_steps_ = 0;  // tuned steps since the last one the tuner could time (see step())
  std::deque<Entry> waiting_;
  std::vector<Entry> active_;
  std::vector<std::pair<int64_t, GenerationResult>> finished_;
  static constexpr size_t kTunerBuckets = 8;  // batch size classes 1, 2-3, 4-7, ..., 128+
  std::array<std::optional<KTuner>, kTunerBuckets> tuners_;
  std::vector<double> cost_floor_;  // (tuner_for's, kept to not allocate per step)
  // One step's batch (capacity kept between steps: decode does not allocate).
  std::vector<BatchSegment> segments_;
  std::vector<Sequence*> members_;
  std::vector<char> was_round_;  // per member: a decoding round (else a prefill)
  std::vector<DraftRound*> rounds_;  // this step's draft rounds, and their sequences
  std::vector<Sequence*> drafting_;
  std::vector<float> logits_, hidden_;
  // Per member of the last forward: its logits and hidden rows, and what failed in its decisions.
  std::vector<const float*> row_logits_, row_hidden_;
  std::vector<std::string> decide_errors_;
};

}  // namespace nextn
