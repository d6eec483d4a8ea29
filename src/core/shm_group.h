// Tensor-parallel ranks as processes (docs/parallel.md: one process per GPU, started by nextn itself): the
// collectives of communicator.h between the processes of one host, over a POSIX shared-memory segment. The
// rules are LocalGroup's (every rank the same bits, rank-ordered sums on top, a failed rank poisons the group);
// the data goes through one slot per rank, in chunks of the slot's size, so messages of any size fit. A process
// that dies without a word (a crash, a kill) is found by the liveness check the others run while they wait,
// about every 100 ms: the group is poisoned and every collective throws instead of waiting forever.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/communicator.h"

namespace nextn {

class ShmGroup {
 public:
  // Rank 0: a new segment for `ranks` ranks (2..64) with `slot_bytes` of message space per rank.
  static std::unique_ptr<ShmGroup> create(int ranks, int64_t slot_bytes = int64_t(4) << 20);
  // Ranks 1..: rank 0's segment, by its name.
  static std::unique_ptr<ShmGroup> attach(const std::string& name, int rank);
  ~ShmGroup();  // unmaps (rank 0 also removes the segment's name)
  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;

  const std::string& name() const { return name_; }
  Communicator& comm();
  // Called while this rank waits for the others: false (a peer is gone) poisons the group.
  void set_liveness(std::function<bool()> alive);
  // Rank 0, once every rank has attached: removes the segment's name (the mappings stay), so that nothing is
  // left in /dev/shm however the processes end.
  void unlink();
  // The rank whose own failure (abort) poisoned the group: -1 when none has, or when a rank died silently.
  int first_failed() const;

  struct Header;

 private:
  ShmGroup() = default;
  std::string name_;
  bool owner_ = false;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  std::unique_ptr<Communicator> comm_;
};

}  // namespace nextn
