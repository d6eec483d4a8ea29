#include "models/common/scan.h"

#include <unistd.h>

#include <cstdio>

#include "core/error.h"
#include "core/finite.h"
#include "models/common/name_rules.h"

namespace nextn {

namespace {

// NaN / inf of one tensor, by the bit patterns of its dtype; false when the dtype holds none (integers).
bool scan_tensor(const TensorView& t, NonFiniteCount& out) {
  if (t.dtype == DType::U8) {  // raw ue8m0 exponents when the tensor is a block scale (the loader reads them so)
    if (!names::is_scale_tensor(t.name)) return false;
    out = count_non_finite_ue8m0(t);
    return true;
  }
  return count_non_finite(t, out);
}

}  // namespace

std::vector<NonFiniteTensor> scan_non_finite(const WeightStore& store) {
  std::vector<NonFiniteTensor> found;
  for (const std::string& name : store.names()) {
    const TensorView* t = store.find(name);
    NonFiniteCount bad;
    if (!scan_tensor(*t, bad) || bad.count == 0) continue;
    found.push_back({name, store.file_of(name), dtype_name(t->dtype), bad.count, bad.first});
  }
  return found;
}

void prefault_weights(const WeightStore& store_, const std::string& dir_, bool progress) {
  size_t total = 0;
  for (const auto& f : store_.files())
    for (const TensorView& t : f->tensors()) total += t.nbytes;
  const bool bar = progress && isatty(2) && total > (size_t(64) << 20);
  size_t done = 0;
  int shown = -1;
  unsigned sink = 0;
  for (const auto& f : store_.files())
    for (const TensorView& t : f->tensors()) {
      // Reading every value faults its pages in as touching one byte per page would, at memory speed; it
      // also finds the NaNs no forward would show (the FP8 kernels decode e4m3 NaN codes as finite values).
      NonFiniteCount bad;
      if (count_non_finite(t, bad)) {
        if (bad.count > 0) {
          if (bar) std::fprintf(stderr, "\r\033[K");
          throw Error("tensor '" + t.name + "' in " + f->path() + " (" + dtype_name(t.dtype) + ") has " +
                      std::to_string(bad.count) + " non-finite value(s) (NaN or inf), the first at index " +
                      std::to_string(bad.first) + "; `nextn inspect --scan " + dir_ + "` lists every such tensor");
        }
      } else {
        const auto* p = static_cast<const volatile unsigned char*>(t.data);
        for (size_t o = 0; o < t.nbytes; o += 4096) sink += p[o];
      }
      done += t.nbytes;
      const int pct = total ? int(100.0 * double(done) / double(total)) : 100;
      if (bar && pct != shown) {
        shown = pct;
        const int w = 30, fill = pct * w / 100;
        std::fprintf(stderr, "\rloading weights [%.*s%*s] %3d%%  %.2f / %.2f GB", fill,
                     "##############################", w - fill, "", pct, double(done) / 1e9, double(total) / 1e9);
      }
    }
  if (bar) std::fprintf(stderr, "\r\033[K");
  (void)sink;
}


}  // namespace nextn
