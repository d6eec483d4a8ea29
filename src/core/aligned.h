// Cache-line-aligned heap buffers: activations the kernels read as x rows start on a 64-byte boundary, so
// that a vector load never straddles two cache lines (a plain std::vector is only 16-byte aligned).
#pragma once
#include <cstddef>
#include <new>
#include <vector>

namespace nextn {

template <class T, std::size_t kAlign = 64>
struct AlignedAllocator {
  using value_type = T;
  template <class U>
  struct rebind {
    using other = AlignedAllocator<U, kAlign>;
  };
  AlignedAllocator() = default;
  template <class U>
  AlignedAllocator(const AlignedAllocator<U, kAlign>&) {}  // NOLINT(google-explicit-constructor)
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(kAlign))); }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, std::align_val_t(kAlign)); }
  template <class U>
  bool operator==(const AlignedAllocator<U, kAlign>&) const {
    return true;
  }
};

using AlignedFloats = std::vector<float, AlignedAllocator<float>>;

}  // namespace nextn
