// safetensors checkpoints: zero-copy reading (mmap), multi-shard weight stores, and a writer.
//
// File format: 8-byte little-endian u64 header length N, N bytes of JSON header, then the data
// section. The header maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]}
// (offsets relative to the data section start) plus an optional "__metadata__" string map.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "io/mapped_file.h"

namespace nextn {

// One .safetensors file, mapped read-only. The header is validated fully at construction;
// every TensorView::data points into the mapping (valid as long as this object lives; moving
// the object keeps the views valid).
class SafetensorsFile {
 public:
  // Largest header accepted (bytes); anything larger is treated as corrupt.
  static constexpr uint64_t kMaxHeaderBytes = 100'000'000;

  explicit SafetensorsFile(const std::string& path);

  SafetensorsFile(SafetensorsFile&&) noexcept = default;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept = default;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  size_t file_bytes() const { return file_.size(); }  // the whole file, header included
  // In file order (ascending data offset; ties broken by name).
  const std::vector<TensorView>& tensors() const { return tensors_; }
  // nullptr when absent.
  const TensorView* find(std::string_view name) const;
  // The "__metadata__" object, or an empty object when the header has none.
  const nlohmann::json& metadata() const { return metadata_; }

 private:
  std::string path_;
  MappedFile file_;
  std::vector<TensorView> tensors_;
  std::map<std::string, size_t, std::less<>> by_name_;
  nlohmann::json metadata_ = nlohmann::json::object();
};

// All tensors of a checkpoint directory (one file or several shards), by name.
class WeightStore {
 public:
  // DIR/model.safetensors.index.json if present (its "weight_map" names the shard of each
  // tensor), else DIR/model.safetensors, else every DIR/*.safetensors in name order.
  // Throws nextn::Error on a missing/corrupt file, a tensor the index promises but the shard
  // lacks, or a tensor name present in two files.
  static WeightStore open_dir(const std::string& dir);

  WeightStore(WeightStore&&) noexcept = default;
  WeightStore& operator=(WeightStore&&) noexcept = default;
  WeightStore(const WeightStore&) = delete;
  WeightStore& operator=(const WeightStore&) = delete;

  // nullptr when absent.
  const TensorView* find(std::string_view name) const;
  // Throws Error "missing tensor 'NAME' in checkpoint DIR" when absent.
  const TensorView& get(std::string_view name) const;
  // All tensor names, sorted.
  std::vector<std::string> names() const;
  // Path of the file holding the tensor; throws Error when absent.
  const std::string& file_of(std::string_view name) const;
  const std::string& dir() const { return dir_; }
  // Number of tensors.
  size_t size() const { return entries_.size(); }
  // The opened files, in the order they were opened.
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  WeightStore() = default;
  void add_file(std::unique_ptr<SafetensorsFile> file);

  struct Entry {
    const TensorView* view;
    const SafetensorsFile* file;
  };
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Entry, std::less<>> entries_;
};

// Collects tensors (copying their bytes) and writes one .safetensors file. Tensors are laid
// out in the data section in the order they were added; the header is padded with spaces to a
// multiple of 8 bytes.
struct SafetensorsWriter {
 public:
  // Throws Error on an empty/duplicate/"__metadata__" name, a negative dim, or
  // nbytes != dtype_size(dtype) * numel(shape).
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data,
           size_t nbytes);
  void add_f32(const std::string& name, std::vector<int64_t> shape, const float* data);
  void add_i64(const std::string& name, std::vector<int64_t> shape, const int64_t* data);
  // Throws Error naming the path on I/O failure.
  void write(const std::string& path,
             const std::map<std::string, std::string>& metadata = {}) const;

  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Entry> entries_;
  std::set<std::string, std::less<>> names_;  // of entries_, for the duplicate check
};

}  // namespace nextn
