// A draft round as a coroutine, so that the rounds of many sequences share their MTP forwards.
//
// A round (catch up on verified positions, then k draft steps, each from the last one's token) is a chain
// of small forwards of one sequence: one or a few rows each. Run one sequence at a time, a batch of 64 pays
// 64 passes over each MTP layer and the lm_head per draft step. So a round suspends at each forward it
// needs (a DraftRequest: rows of MTP layer j, or one row's draft logits), and the model's driver
// (Model::run_draft_rounds) runs the waiting requests of all rounds as one forward per layer, then resumes
// them. A layer's rows never depend on the other rows of its forward, so the drafts are the same as alone.
//
// Frames come from the session's FrameArena (grown at the first round, then reused): rounds allocate
// nothing in decode.
#pragma once
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <utility>
#include <vector>

namespace nextn {

class KVCache;
class DraftPicker;

// Attention over a fixed set of cache slots instead of the indexer's choice (draft steps >= 1), for rows
// first_row.. of the request; the rows before it (a draft layer's catch-up, run in the same forward) use the
// indexer as usual.
struct TopkOverride {
  const int32_t* slots;  // ascending
  int64_t count;
  int64_t first_row = 0;
  // Slots from this one up to the row's own are selected too, where a family keeps them (Qwen4-Exp's QSA
  // always keeps the keys after the ones a query chose from): the draft rows after step 0's query.
  int64_t extend_from_slot = -1;
};

// One sequence's share of a batched MTP forward (layer >= 0), or one row's draft logits (layer < 0).
struct DraftRequest {
  int layer = -1;
  // layer >= 0: `rows` rows at positions pos0.. of `cache`; row r takes tokens[r] and the previous layer's
  // (or the target's) hidden state h_prev[r]; outputs hidden_out [rows, width]; optional forced selection,
  // and the last row's selected positions into topk_out.
  const int32_t* tokens = nullptr;
  const float* h_prev = nullptr;
  int64_t rows = 0, pos0 = 0;
  KVCache* cache = nullptr;
  float* hidden_out = nullptr;
  const TopkOverride* forced = nullptr;
  std::vector<int32_t>* topk_out = nullptr;
  // layer < 0: logits [V] of hidden [width], or with `argmax` only their argmax (finite_argmax: -1 for a row
  // with a NaN or inf; logits then unused)
  const float* hidden = nullptr;
  float* logits = nullptr;
  int32_t* argmax = nullptr;
  // With `picker` (one that picks_alone), the driver picks draft step `step`'s token from finite logits as
  // it hands them over, many rounds' at once, into `picked` (else left -1: the round picks, or fails).
  DraftPicker* picker = nullptr;
  int step = 0;
  int32_t picked = -1;
  // Set by the driver: this request's share of its batched forward's time, and a failure of its own.
  double seconds = 0;
  std::exception_ptr error;
};

// A request for `rows` rows of MTP layer `layer` (the fields above, in order).
inline DraftRequest layer_request(int layer, const int32_t* tokens, const float* h_prev, int64_t rows, int64_t pos0,
                                  KVCache* cache, float* hidden_out, const TopkOverride* forced = nullptr,
                                  std::vector<int32_t>* topk_out = nullptr) {
  DraftRequest r;
  r.layer = layer;
  r.tokens = tokens;
  r.h_prev = h_prev;
  r.rows = rows;
  r.pos0 = pos0;
  r.cache = cache;
  r.hidden_out = hidden_out;
  r.forced = forced;
  r.topk_out = topk_out;
  return r;
}

// Reused storage for one coroutine frame at a time.
class FrameArena {
 public:
  void* take(std::size_t n) {
    if (n > size_) {
      buf_.reset(new std::max_align_t[(n + sizeof(std::max_align_t) - 1) / sizeof(std::max_align_t)]);
      size_ = n;
    }
    return buf_.get();
  }

 private:
  std::unique_ptr<std::max_align_t[]> buf_;
  std::size_t size_ = 0;
};

class DraftRound {
 public:
  struct promise_type {
    DraftRequest* waiting = nullptr;
    std::exception_ptr error;
    // The coroutine is a member of a session that owns a FrameArena: `arena()` of the first argument.
    template <class Session, class... Args>
    static void* operator new(std::size_t n, Session& session, Args&&...) {
      return session.frame_arena().take(n);
    }
    static void operator delete(void*, std::size_t) {}  // (the arena keeps the storage)
    DraftRound get_return_object() { return DraftRound(std::coroutine_handle<promise_type>::from_promise(*this)); }
    std::suspend_always initial_suspend() noexcept { return {}; }
    std::suspend_always final_suspend() noexcept { return {}; }
    void return_void() {}
    void unhandled_exception() { error = std::current_exception(); }
  };

  // co_await ask(request): suspends until the driver has run it; rethrows a failure the driver set on it.
  struct Ask {
    DraftRequest& request;
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<promise_type> h) noexcept { h.promise().waiting = &request; }
    void await_resume() const {
      if (request.error) std::rethrow_exception(request.error);
    }
  };

  DraftRound() = default;
  DraftRound(DraftRound&& o) noexcept : h_(std::exchange(o.h_, {})) {}
  DraftRound& operator=(DraftRound&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, {});
    }
    return *this;
  }
  DraftRound(const DraftRound&) = delete;
  DraftRound& operator=(const DraftRound&) = delete;
  ~DraftRound() { reset(); }

  bool valid() const { return bool(h_); }
  bool done() const { return !h_ || h_.done(); }
  // The request the round waits on (null when done), after resume() ran it up to there.
  DraftRequest* waiting() const { return done() ? nullptr : h_.promise().waiting; }
  // Runs the round up to its next request or its end.
  void resume() {
    h_.promise().waiting = nullptr;
    h_.resume();
  }
  // The exception that ended the round, if any.
  std::exception_ptr error() const { return h_ ? h_.promise().error : nullptr; }
  void reset() {
    if (h_) h_.destroy();
    h_ = {};
  }

 private:
  explicit DraftRound(std::coroutine_handle<promise_type> h) : h_(h) {}
  std::coroutine_handle<promise_type> h_;
};

// The host work (as ThreadPool::worth_waking counts it) of a sampled row's distribution and draw, per logit:
// what the engine's decisions and the draft driver's picks weigh before spreading many rows over threads.
inline constexpr int64_t kSampledWorkPerLogit = 64;

// What a round asks of its owner between draft steps: draft token s from the step's raw logits [V] (which
// it may modify in place: penalties).
class DraftPicker {
 public:
  virtual int32_t pick(int s, float* logits) = 0;
  // Pickers whose draft is the logits' argmax and nothing else (greedy): the round then asks the model for
  // that id alone (a GPU backend sends back 4 bytes instead of the vocabulary-wide row) and calls pick_id.
  virtual bool picks_argmax() const { return false; }
  virtual int32_t pick_id(int s, int32_t argmax) {
    (void)s;
    return argmax;
  }
  // Pickers whose pick touches their own state only: the driver may run many rounds' picks at once on the
  // host's threads (a sampled pick makes a distribution over the whole vocabulary).
  virtual bool picks_alone() const { return false; }

 protected:
  ~DraftPicker() = default;
};

}  // namespace nextn
