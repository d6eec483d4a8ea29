// MappedFile: a whole file mapped read-only into memory (RAII; unmapped on destruction).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace nextn {

class MappedFile {
 public:
  MappedFile() = default;
  // Maps the whole file read-only. Throws nextn::Error naming the path and the OS error.
  // An empty file maps to data() == nullptr, size() == 0.
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

 private:
  void release() noexcept;

  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace nextn
