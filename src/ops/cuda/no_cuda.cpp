// cuda_ops.h in a build without CUDA (no nvcc found at configure time, -DNEXTN_CUDA=OFF, or a sanitizer
// build): nothing is available, and every call says so.
#include "core/error.h"
#include "ops/cuda/cuda_collectives.h"
#include "ops/cuda/cuda_nn.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/cuda_recurrent.h"
#include "ops/cuda/cuda_sparse_attention.h"

namespace nextn::cuda {

namespace {
[[noreturn]] void unavailable() { throw Error("this nextn was built without CUDA (configure with nvcc on PATH)"); }
}  // namespace

bool available(std::string* why) {
  if (why) *why = "built without CUDA";
  return false;
}
std::string device_name() { unavailable(); }
size_t free_memory() { unavailable(); }
DeviceBuffer::DeviceBuffer(size_t) { unavailable(); }
DeviceBuffer::~DeviceBuffer() = default;
DeviceBuffer::DeviceBuffer(DeviceBuffer&&) noexcept = default;
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&&) noexcept = default;
void DeviceBuffer::upload(const void*, size_t, size_t) { unavailable(); }
void DeviceBuffer::download(void*, size_t, size_t) const { unavailable(); }
DeviceLinear upload(const Linear&) { unavailable(); }
void matmul(const float*, int64_t, const Linear&, float*, int64_t, int64_t, const OutputSink&) { unavailable(); }
void matmul_many(const float*, int64_t, const ops::MatmulOut*, int64_t) { unavailable(); }
WeightTable weight_table(const Linear* const*, int64_t) { unavailable(); }
void grouped_matmul(const float*, const WeightTable&, const int32_t*, int64_t, float*, int64_t, int64_t) { unavailable(); }
void rms_norm(const float*, int64_t, int64_t, const float*, float, float*) { unavailable(); }
void synchronize() { unavailable(); }
Graph::~Graph() = default;
Graph::Graph(Graph&&) noexcept = default;
Graph& Graph::operator=(Graph&&) noexcept = default;
void Graph::launch() const { unavailable(); }
void begin_capture() { unavailable(); }
Graph end_capture() { unavailable(); }
void abandon_capture() {}
bool branches_on() { return false; }
void set_branches(bool) {}
void branch_begin() {}
void branch_end() {}
void branch_join() {}
double time_device(int, void (*)(void*), void*) { unavailable(); }
double copy_bandwidth_gbps(size_t, int) { unavailable(); }

void copy_to_device(void*, const void*, size_t) { unavailable(); }
void copy_to_host(void*, const void*, size_t) { unavailable(); }
void copy_cols(const float*, int64_t, int64_t, int64_t, float*, int64_t) { unavailable(); }
void gather_rows(const float*, int64_t, const int32_t*, int64_t, float*) { unavailable(); }
void add(float*, const float*, int64_t) { unavailable(); }
void swiglu(const float*, const float*, int64_t, float, float*) { unavailable(); }
void mul_sigmoid(const float*, const float*, int64_t, float*) { unavailable(); }
void scale(float*, int64_t, float, float) { unavailable(); }
void rms_norm_rows(const float*, int64_t, int64_t, int64_t, const float*, float, float*, int64_t) { unavailable(); }
void layer_norm_rows(const float*, int64_t, int64_t, const float*, const float*, float, float*) { unavailable(); }
void rope_rows(float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, const int32_t*, const float*, float) {
  unavailable();
}
void embed_rows(const Linear&, const int32_t*, int64_t, int, float*, int64_t) { unavailable(); }
void matmul_transposed_heads(const float*, int64_t, int64_t, int64_t, const Linear&, int64_t, int64_t, int64_t,
                             int64_t, float*, int64_t, int64_t, int64_t) {
  unavailable();
}
int64_t hc_pre_scratch_floats(int64_t, int64_t, int64_t, int64_t) { return 0; }
void hc_pre(const float*, int64_t, int64_t, int64_t, const Linear&, float*, const float*, float, float, float, float,
            float, float*, float*, const HcNorm*) {
  unavailable();
}
void hc_post(float*, const float*, const float*, int64_t, int64_t, int64_t) { unavailable(); }
void write_cache_rows(const float*, int64_t, int64_t, int64_t, const RowCaches&, int, int64_t) { unavailable(); }
void write_key_rows(const float*, int64_t, int64_t, int64_t, const KeyNorm&, int64_t, int64_t, const float*, float,
                    const RowCaches&, int) {
  unavailable();
}
void indexer_scores(const float*, const float*, int64_t, int64_t, int64_t, const RowCaches&, int, int64_t, float*,
                    int64_t, float, float) {
  unavailable();
}
void topk_rows(const float*, int64_t, int64_t, const RowCaches&, int64_t, int32_t*, int32_t*) {
  unavailable();
}
void override_selection(int32_t*, int32_t*, int64_t, int64_t, const int32_t*, const int32_t*) { unavailable(); }
int64_t sparse_mla_scratch_floats(int64_t, int64_t, int64_t) { return 0; }
void sparse_mla(const float*, int64_t, int64_t, int64_t, int64_t, const int32_t*, int64_t, const int32_t*,
                const RowCaches&, int, float, const float*, float*, float*) {
  unavailable();
}
void matmul_heads(const float*, int64_t, int64_t, int64_t, const Linear&, int64_t, int64_t, int64_t, int64_t, float*,
                  int64_t, int64_t) {
  unavailable();
}
void moe_route(const float*, const float*, int64_t, const MoeRouting&, int32_t*, float*) { unavailable(); }
void moe_dispatch(const int32_t*, int64_t, int64_t, int64_t, int32_t*, int32_t*, int32_t*, const int32_t*) {
  unavailable();
}
void moe_combine(const float*, const int32_t*, const float*, int64_t, int64_t, int64_t, const float*, float*,
                 const OutputSink&) {
  unavailable();
}
void row_argmax(const float*, int64_t, int64_t, int32_t*) { unavailable(); }
void row_best(const float*, int64_t, int64_t, int64_t, int64_t, RowBest*) { unavailable(); }
void fill_zero(void*, size_t) { unavailable(); }
void map(float*, int64_t, Map, float) { unavailable(); }
void scale_rows_sigmoid(float*, const float*, int64_t, int64_t) { unavailable(); }
void rms_norm_groups(const float*, int64_t, int64_t, int64_t, int64_t, int64_t, const float*, int64_t, float, float*) {
  unavailable();
}
void stream_mean(const float*, int64_t, int64_t, int64_t, float*) { unavailable(); }
void stream_gates(const float*, const float*, const float*, int64_t, int64_t, int64_t, float*) { unavailable(); }
void topk_rows(const float*, int64_t, int64_t, const int32_t*, int64_t, int32_t*, int32_t*) { unavailable(); }
void moe_route_softmax(const float*, int64_t, int64_t, int64_t, bool, int32_t*, float*) { unavailable(); }
void causal_conv_rows(const float*, int64_t, int64_t, const float*, int64_t, int64_t, const RecurrentSpans&, int64_t,
                      float*, int64_t, bool) {
  unavailable();
}
void gated_delta_rule(const float*, const float*, const float*, const float*, const float*, const float*, const float*,
                      const DeltaRuleShape&, const RecurrentSpans&, int64_t, float*) {
  unavailable();
}
void pool_block_keys(const RowCaches&, int, int64_t, int64_t, int64_t, const float*, float, int64_t, const float*, float,
                     const int32_t*) {
  unavailable();
}
void block_scores(const float*, int64_t, int64_t, int64_t, int64_t, const RowCaches&, int, int64_t, int64_t, float,
                  float*, int64_t) {
  unavailable();
}
void expand_selection(const RowCaches&, int64_t, int64_t, const int32_t*, const int32_t*, int64_t, const int32_t*,
                      const int32_t*, const int32_t*, int64_t, int32_t*, int32_t*, int64_t) {
  unavailable();
}
void sparse_gqa_attention(const float*, int64_t, int64_t, int64_t, int64_t, const RowCaches&, int, const int32_t*,
                          const int32_t*, int64_t, float, float*) {
  unavailable();
}


int device_count() { return 0; }
void use_gpu(int) { unavailable(); }
int current_gpu() { unavailable(); }
bool nccl_available(std::string* why) {
  if (why) *why = "built without CUDA";
  return false;
}
std::unique_ptr<DeviceCommunicator> nccl_communicator(Communicator&) { unavailable(); }
std::unique_ptr<DeviceCommunicator> host_staged_communicator(Communicator&) { unavailable(); }
std::unique_ptr<DeviceCommunicator> device_communicator(Communicator&) { unavailable(); }
void sum_ranks(const float*, int, int64_t, float*) { unavailable(); }

}  // namespace nextn::cuda
