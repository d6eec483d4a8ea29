#include "models/common/scan.h"

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

}  // namespace nextn
