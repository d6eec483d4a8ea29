#include "models/common/tensor_parallel.h"

#include <cstring>
#include <exception>
#include <type_traits>
#include <unordered_map>

#include "core/error.h"

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

// What ranks 1.. do until rank 0 says stop: every command as rank 0 ran it, on this rank's model. An error
// here is this rank's alone (rank 0 checked the engine's inputs): it aborts the group.
void serve_commands(Model& model, Communicator& comm) {
  std::unordered_map<int64_t, std::unique_ptr<SequenceState>> sequences;
  std::vector<char> payload;
  std::vector<BatchSegment> segments;
  std::vector<float> logits;
  std::vector<int32_t> argmax;
  const int64_t V = model.facts().vocab_size;
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

}  // namespace

TensorParallelModel::TensorParallelModel(std::vector<std::unique_ptr<Model>> ranks) : models_(std::move(ranks)) {
  if (models_.empty()) throw Error("tensor parallel: no ranks");
  for (const auto& m : models_)
    if (!m) throw Error("tensor parallel: a rank without a model");
  group_ = std::make_unique<LocalGroup>(static_cast<int>(models_.size()));
  comm_ = &group_->start([this](Communicator& comm) {
    Model& model = *models_[size_t(comm.rank())];
    model.make_tensor_parallel_rank(comm);
    comm.barrier();  // (every rank's shard made: rank 0 returns from the constructor)
    serve_commands(model, comm);
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
    failed_ = e.what();
    comm_->abort();
    try {
      group_->join();  // (another rank's own error, if it failed first)
    } catch (const std::exception& first) {
      failed_ = first.what();
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

std::string TensorParallelModel::memory_summary() const {
  return models_[0]->memory_summary() + " (on each of " + std::to_string(models_.size()) + " tensor-parallel ranks)";
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
    failed_ = e.what();
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
    for (int64_t s = 0; s < g.rows; ++s)
      if (g.tokens[s] < 0 || g.tokens[s] >= V)
        throw Error("token id " + std::to_string(g.tokens[s]) + " outside the vocabulary [0, " + std::to_string(V) +
                    ")");
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

}  // namespace nextn
