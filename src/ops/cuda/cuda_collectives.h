// Collectives over device memory for tensor-parallel ranks on GPUs (docs/parallel.md, P12). A rank's CUDA
// blocks gather every rank's partial rows into one buffer and add them in rank order themselves (sum_ranks),
// as the CPU ranks do (core/communicator.h says why: NCCL's own all-reduce rounds a row by its message size,
// and greedy speculation would stop equalling plain greedy). Two forms of the gather:
//   NCCL         one GPU per rank (ncclAllGather on the rank's stream: recorded in CUDA graphs like a kernel);
//                libnccl.so.2 is loaded when first asked for, so nextn runs without it on one GPU
//   host-staged  ranks sharing a GPU, or no NCCL: the stream is waited for, the rows go through the ranks'
//                host communicator and back; correct, slow, and not recordable (the blocks then run eagerly)
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace nextn {
class Communicator;
}

namespace nextn::cuda {

class DeviceCommunicator {
 public:
  virtual ~DeviceCommunicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // out[r * bytes, (r + 1) * bytes) = rank r's in (device pointers), queued on the calling thread's stream
  // after what came before; every rank passes the same bytes.
  virtual void all_gather(const void* in, int64_t bytes, void* out) = 0;
  // Whether all_gather may be recorded in a CUDA graph.
  virtual bool capturable() const = 0;
  virtual std::string describe() const = 0;  // "NCCL 2.27.7" / "through host memory"
};

int device_count();  // GPUs this process sees (0 without a driver)
// Makes GPU `index` the calling thread's (every CUDA call after it on this thread goes there).
void use_gpu(int index);
int current_gpu();

// Whether NCCL can be loaded (why not, when not).
bool nccl_available(std::string* why = nullptr);
// The NCCL form over `host`'s ranks: rank 0's unique id goes to the others through host.broadcast, then
// every rank joins on its current GPU (collective: every rank calls it at once). Throws nextn::Error naming
// what failed (no NCCL, two ranks on one GPU, an init error).
std::unique_ptr<DeviceCommunicator> nccl_communicator(Communicator& host);
// The host-staged form over `host` (any GPUs, one or several ranks each).
std::unique_ptr<DeviceCommunicator> host_staged_communicator(Communicator& host);
// NCCL when every rank has a GPU of its own and NCCL loads, else host-staged (collective: every rank calls it).
std::unique_ptr<DeviceCommunicator> device_communicator(Communicator& host);

// out[i] = gathered[0 · count + i] + gathered[1 · count + i] + ... in rank order, i < count (device pointers;
// out may be any one of the ranks' parts, or another buffer).
void sum_ranks(const float* gathered, int ranks, int64_t count, float* out);

}  // namespace nextn::cuda
