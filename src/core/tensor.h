// Tensors: read-only views over mmap'd checkpoint bytes (weights) and owned activation buffers.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace nextn {

// "[a, b, c]": shapes, block sizes and index lists in messages.
template <class T>
std::string list_string(const std::vector<T>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(v[i]);
  }
  return s + "]";
}

// A checkpoint tensor as it sits in the mapped file: never copied at load.
struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // points into an mmap'd file (host) or a device buffer later
  size_t nbytes = 0;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  int64_t dim(int i) const { return shape[i < 0 ? shape.size() + i : i]; }
  std::string shape_str() const { return list_string(shape); }
};

}  // namespace nextn
