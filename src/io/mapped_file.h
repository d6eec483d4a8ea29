// MappedFile: a whole file mapped read-only into memory (RAII; unmapped on destruction).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace nextn {

// Where the bytes of files of at least kInMemoryMinBytes live. kMapped (the default): the page cache, mapped
// (shared between processes, loaded as touched). kInMemory: read at open into anonymous memory marked for
// transparent huge pages (MADV_HUGEPAGE): streaming the weights then takes far fewer TLB misses (on a 2-vCPU
// Xeon, FP8 decode with AVX2 +12%, bf16 +6-8%: docs/performance.md, forty-second session), at the price of
// reading every file whole at load and of a private copy per process (tensor-parallel ranks on one host each
// hold one; the page cache's copy stays, reclaimable). Falls back to the mapping when the anonymous memory
// cannot be had. NEXTN_WEIGHTS=memory selects kInMemory for the process and the ranks it starts (they
// inherit the environment).
enum class FileResidency { kMapped, kInMemory };
inline constexpr size_t kInMemoryMinBytes = size_t(1) << 20;
void set_file_residency(FileResidency r);
FileResidency file_residency();  // (NEXTN_WEIGHTS read once, unless set_file_residency was called)

// `bytes` of fresh anonymous read-write memory advised for transparent huge pages (without THP: 4 KB pages);
// null when it cannot be had. Release with munmap(p, bytes). (The weights under kInMemory; the read-bandwidth
// yardstick of `nextn bench`, which must read the same kind of pages as the fastest weights.)
uint8_t* map_huge_page_memory(size_t bytes);

class MappedFile {
 public:
  MappedFile() = default;
  // Maps (or, under FileResidency::kInMemory, reads) the whole file read-only. Throws nextn::Error naming the
  // path and the OS error. An empty file maps to data() == nullptr, size() == 0.
  explicit MappedFile(const std::string& path);
  ~MappedFile();

  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const std::string& path() const { return path_; }
  bool in_memory() const { return in_memory_; }  // read into anonymous memory (FileResidency::kInMemory)

 private:
  void release() noexcept;

  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool in_memory_ = false;
};

}  // namespace nextn
