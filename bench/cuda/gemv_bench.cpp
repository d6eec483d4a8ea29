// Decode-width matmul on the GPU against the device's copy bandwidth, measured in the same run: weight bytes
// read per second by cuda::matmul at M = 1..256 rows over a stack of matrices too large for L2, bf16 and FP8
// (128x128 block scales), as a fraction of what a device-to-device copy reaches.
//
//   ./build/bin/nextn_bench_cuda [--gib 4] [--out 8192] [--in 8192] [--dtype bf16|fp8] [--rows 1,2,4,8,13]
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "ops/cuda/cuda_ops.h"

using namespace nextn;

namespace {

constexpr int kMaxRows = 256;  // (many sequences' rows, and prompts: the FP8 kernel's passes of 8 to 32 rows)

struct Run {
  const std::vector<cuda::DeviceLinear>* ws;
  const float* x;
  float* y;
  int64_t M;
};

void run_all(void* p) {
  auto* r = static_cast<Run*>(p);
  for (const auto& d : *r->ws) cuda::matmul(r->x, r->M, d.w, r->y);
}

}  // namespace

int main(int argc, char** argv) {
  double gib = 4;
  int64_t out = 8192, in = 8192;
  std::vector<DType> dtypes = {DType::BF16, DType::F8_E4M3};
  std::vector<int64_t> rows = {1, 2, 4, 8, 13};
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--gib")) gib = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--out")) out = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--in")) in = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--dtype")) {
      const std::string d = argv[i + 1];
      dtypes = {d == "fp8" ? DType::F8_E4M3 : DType::BF16};
    } else if (!std::strcmp(argv[i], "--rows")) {  // (a profiler run wants one shape's launches alone)
      rows.clear();
      for (const char* p = argv[i + 1]; *p;) {
        char* end = nullptr;
        const long long m = std::strtoll(p, &end, 10);
        if (end == p || m < 1 || m > kMaxRows) {
          std::fprintf(stderr, "nextn_bench_cuda: --rows wants numbers 1..%d separated by commas\n", kMaxRows);
          return 2;
        }
        rows.push_back(m);
        p = *end == ',' ? end + 1 : end;
      }
    }
  }
  std::string why;
  if (!cuda::available(&why)) {
    std::fprintf(stderr, "nextn_bench_cuda: %s\n", why.c_str());
    return 1;
  }
  std::printf("device: %s\n", cuda::device_name().c_str());
  const double copy = cuda::copy_bandwidth_gbps(size_t(2) << 30, 20);
  std::printf("device copy bandwidth (read + write): %.0f GB/s\n", copy);
  std::printf("| weights | M | GB/s read | of copy bandwidth | output hash |\n|---|---:|---:|---:|---|\n");
  for (DType t : dtypes) {
    const size_t es = dtype_size(t);
    const int64_t per = out * in * int64_t(es);
    const int n_mats = std::max<int>(1, int(gib * double(1 << 30) / double(per)));
    // Random-ish bytes (no NaN FP8 codes): the values do not matter for speed.
    std::vector<unsigned char> bytes(static_cast<size_t>(per));
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = (unsigned char)((i * 2654435761u >> 13) & 0x7e);
    std::vector<float> scales(size_t(((out + 127) / 128) * ((in + 127) / 128)), 1.0f / 64);
    Linear w;
    w.dtype = t;
    w.out = out;
    w.in = in;
    w.row_stride = in;
    w.data = bytes.data();
    if (t == DType::F8_E4M3) {
      w.scale = scales.data();
      w.scale_dtype = DType::F32;
      w.scale_cols = (in + 127) / 128;
    }
    std::vector<cuda::DeviceLinear> ws;
    for (int i = 0; i < n_mats; ++i) ws.push_back(cuda::upload(w));
    cuda::DeviceBuffer x(size_t(kMaxRows * in) * 4), y(size_t(kMaxRows * out) * 4);
    std::vector<float> hx(size_t(kMaxRows * in));
    for (size_t i = 0; i < hx.size(); ++i) hx[i] = float(int((i * 2654435761u >> 7) % 2001) - 1000) * 1e-3f;
    x.upload(hx.data(), hx.size() * 4);
    for (int64_t M : rows) {
      Run r{&ws, x.f32(), y.f32(), M};
      const double s = cuda::time_device(10, run_all, &r);
      const double gbps = double(per) * n_mats / s / 1e9;
      // (a hash of the last matrix's output, so that kernel variants can be checked for the same bits)
      std::vector<float> hy(size_t(M * out));
      y.download(hy.data(), hy.size() * 4);
      uint64_t h = 1469598103934665603ull;
      for (float v : hy) {
        uint32_t b;
        std::memcpy(&b, &v, 4);
        h = (h ^ b) * 1099511628211ull;
      }
      std::printf("| %s %d x %lldx%lld | %lld | %.0f | %.2f | %016llx |\n", dtype_name(t), n_mats, (long long)out,
                  (long long)in, (long long)M, gbps, gbps / copy, (unsigned long long)h);
    }
  }
  return 0;
}
