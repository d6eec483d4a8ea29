// cuda_ops.h in a build without CUDA (no nvcc found at configure time, -DNEXTN_CUDA=OFF, or a sanitizer
// build): nothing is available, and every call says so.
#include "core/error.h"
#include "ops/cuda/cuda_ops.h"

namespace nextn::cuda {

namespace {
[[noreturn]] void unavailable() { throw Error("this nextn was built without CUDA (configure with nvcc on PATH)"); }
}  // namespace

bool available(std::string* why) {
  if (why) *why = "built without CUDA";
  return false;
}
std::string device_name() { unavailable(); }
DeviceBuffer::DeviceBuffer(size_t) { unavailable(); }
DeviceBuffer::~DeviceBuffer() = default;
DeviceBuffer::DeviceBuffer(DeviceBuffer&&) noexcept = default;
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&&) noexcept = default;
void DeviceBuffer::upload(const void*, size_t, size_t) { unavailable(); }
void DeviceBuffer::download(void*, size_t, size_t) const { unavailable(); }
DeviceLinear upload(const Linear&) { unavailable(); }
void matmul(const float*, int64_t, const Linear&, float*, int64_t, int64_t) { unavailable(); }
void rms_norm(const float*, int64_t, int64_t, const float*, float, float*) { unavailable(); }
void synchronize() { unavailable(); }
double time_device(int, void (*)(void*), void*) { unavailable(); }
double copy_bandwidth_gbps(size_t, int) { unavailable(); }

}  // namespace nextn::cuda
