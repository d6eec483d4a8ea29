// The device collectives of cuda_collectives.h: the rank-ordered sum kernel, the host-staged gather, and NCCL
// loaded at run time (dlopen), so that the binary needs no NCCL to run on one GPU.
#include <cuda_runtime.h>

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "core/communicator.h"
#include "core/error.h"
#include "ops/cuda/cuda_collectives.h"
#include "ops/cuda/cuda_nn.h"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/kernel_util.cuh"

namespace nextn::cuda {

namespace {

// ---- the rank-ordered sum ----------------------------------------------------------------------------------

__global__ void sum_ranks_kernel(const float* g, int ranks, int64_t count, float* out) {
  begin_after_predecessor();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    float s = g[i];
    for (int r = 1; r < ranks; ++r) s += g[int64_t(r) * count + i];
    out[i] = s;
  }
}

// ---- NCCL's C interface, as much of it as nextn calls (stable since NCCL 2.0), resolved from libnccl.so.2 ----

using NcclComm = void*;
struct NcclUniqueId {
  char internal[128];
};
enum NcclResult : int { kNcclSuccess = 0 };
constexpr int kNcclUint8 = 1;

struct Nccl {
  NcclResult (*get_version)(int*) = nullptr;
  NcclResult (*get_unique_id)(NcclUniqueId*) = nullptr;
  NcclResult (*comm_init_rank)(NcclComm*, int, NcclUniqueId, int) = nullptr;
  NcclResult (*comm_destroy)(NcclComm) = nullptr;
  NcclResult (*comm_abort)(NcclComm) = nullptr;
  NcclResult (*all_gather)(const void*, void*, size_t, int, NcclComm, cudaStream_t) = nullptr;
  const char* (*error_string)(NcclResult) = nullptr;
  std::string missing;  // why it could not be loaded (empty: loaded)
  int version = 0;
};

const Nccl& nccl() {
  static const Nccl lib = [] {
    Nccl n;
    void* h = nullptr;
    const char* path = std::getenv("NEXTN_NCCL_LIBRARY");  // (another NCCL: a toolkit's or a Python wheel's)
    for (const char* name : {path, "libnccl.so.2", "libnccl.so"})
      if (name && *name && (h = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
    if (!h) {
      n.missing = std::string("NCCL could not be loaded (") + (path && *path ? path : "libnccl.so.2") + ": " +
                  dlerror() + "; NEXTN_NCCL_LIBRARY names another)";
      return n;
    }
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
      if (!fn && n.missing.empty()) n.missing = std::string("NCCL lacks ") + name;
    };
    sym(n.get_version, "ncclGetVersion");
    sym(n.get_unique_id, "ncclGetUniqueId");
    sym(n.comm_init_rank, "ncclCommInitRank");
    sym(n.comm_destroy, "ncclCommDestroy");
    sym(n.comm_abort, "ncclCommAbort");
    sym(n.all_gather, "ncclAllGather");
    sym(n.error_string, "ncclGetErrorString");
    if (n.missing.empty() && n.get_version(&n.version) != kNcclSuccess) n.missing = "ncclGetVersion failed";
    return n;
  }();
  return lib;
}

void nccl_check(NcclResult r, const char* what) {
  if (r != kNcclSuccess) throw Error(std::string("NCCL: ") + what + ": " + nccl().error_string(r));
}

class NcclCommunicator final : public DeviceCommunicator {
 public:
  NcclCommunicator(Communicator& host) : rank_(host.rank()), size_(host.size()) {
    const Nccl& n = nccl();
    if (!n.missing.empty()) throw Error(n.missing);
    // The ranks' GPUs, so that two on one GPU are named (NCCL would refuse them with less to go on).
    std::vector<int> gpus(static_cast<size_t>(size_));
    const int mine = current_gpu();
    host.all_gather(&mine, sizeof mine, gpus.data());
    for (int r = 0; r < size_; ++r)
      if (r != rank_ && gpus[size_t(r)] == mine)
        throw Error("tensor parallel over NCCL: ranks " + std::to_string(std::min(r, rank_)) + " and " +
                    std::to_string(std::max(r, rank_)) + " are both on GPU " + std::to_string(mine));
    NcclUniqueId id{};
    if (rank_ == 0) nccl_check(n.get_unique_id(&id), "ncclGetUniqueId");
    host.broadcast(&id, sizeof id, 0);
    nccl_check(n.comm_init_rank(&comm_, size_, id, rank_), "ncclCommInitRank");
  }
  ~NcclCommunicator() override {
    if (comm_) nccl().comm_destroy(comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_gather(const void* in, int64_t bytes, void* out) override {
    if (bytes <= 0) return;
    nccl_check(nccl().all_gather(in, out, size_t(bytes), kNcclUint8, comm_, cudaStreamPerThread), "ncclAllGather");
  }
  bool capturable() const override { return true; }
  std::string describe() const override {
    const int v = nccl().version;  // (2.19.3 is 21903)
    return "NCCL " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
  }

 private:
  int rank_, size_;
  NcclComm comm_ = nullptr;
};

class HostStagedCommunicator final : public DeviceCommunicator {
 public:
  explicit HostStagedCommunicator(Communicator& host) : host_(host) {}
  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  void all_gather(const void* in, int64_t bytes, void* out) override {
    if (bytes <= 0) return;
    const size_t all = size_t(bytes) * size_t(size());
    if (mine_.size() < size_t(bytes)) mine_.resize(size_t(bytes));
    if (all_.size() < all) all_.resize(all);
    copy_to_host(mine_.data(), in, size_t(bytes));  // (waits for the rows' kernels)
    host_.all_gather(mine_.data(), bytes, all_.data());
    copy_to_device(out, all_.data(), all);
  }
  bool capturable() const override { return false; }
  std::string describe() const override { return "through host memory"; }

 private:
  Communicator& host_;
  std::vector<unsigned char> mine_, all_;
};

}  // namespace

int device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

void use_gpu(int index) { check(cudaSetDevice(index), "cudaSetDevice"); }

int current_gpu() {
  int d = 0;
  check(cudaGetDevice(&d), "cudaGetDevice");
  return d;
}

bool nccl_available(std::string* why) {
  const Nccl& n = nccl();
  if (why) *why = n.missing;
  return n.missing.empty();
}

std::unique_ptr<DeviceCommunicator> nccl_communicator(Communicator& host) {
  return std::make_unique<NcclCommunicator>(host);
}

std::unique_ptr<DeviceCommunicator> host_staged_communicator(Communicator& host) {
  return std::make_unique<HostStagedCommunicator>(host);
}

std::unique_ptr<DeviceCommunicator> device_communicator(Communicator& host) {
  // Every rank decides alike: NCCL only when every rank is on a GPU of its own and every rank can load it.
  struct Facts {
    int gpu, nccl;
  } mine{current_gpu(), nccl_available() ? 1 : 0};
  std::vector<Facts> all(size_t(host.size()));
  host.all_gather(&mine, sizeof mine, all.data());
  bool distinct = true, loaded = true;
  for (size_t r = 0; r < all.size(); ++r) {
    loaded = loaded && all[r].nccl;
    for (size_t q = 0; q < r; ++q) distinct = distinct && all[q].gpu != all[r].gpu;
  }
  if (host.size() > 1 && distinct && loaded) return nccl_communicator(host);
  return host_staged_communicator(host);
}

void sum_ranks(const float* gathered, int ranks, int64_t count, float* out) {
  if (count <= 0) return;
  const unsigned blocks = unsigned(std::min<int64_t>((count + kThreads - 1) / kThreads, 4096));
  launch_kernel(sum_ranks_kernel, blocks, kThreads, 0, "sum_ranks_kernel", gathered, ranks, count, out);
}

}  // namespace nextn::cuda
