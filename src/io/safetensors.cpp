#include "io/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <system_error>
#include <utility>

#include "core/error.h"

namespace nextn {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kMetadataKey = "__metadata__";

std::string file_prefix(const std::string& path) { return "safetensors file '" + path + "': "; }

std::string tensor_prefix(const std::string& path, const std::string& name) {
  return file_prefix(path) + "tensor '" + name + "': ";
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void write_u64_le(uint64_t v, uint8_t* p) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

// A non-negative JSON integer that fits in int64 (and uint64), or false.
bool as_nonneg_int(const json& j, uint64_t* out) {
  if (j.is_number_unsigned()) {
    const uint64_t v = j.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = v;
    return true;
  }
  if (j.is_number_integer()) {
    const int64_t v = j.get<int64_t>();
    if (v < 0) return false;
    *out = static_cast<uint64_t>(v);
    return true;
  }
  return false;
}

// Finds the first key that repeats within one JSON object (nlohmann keeps the last silently): a SAX pass
// with one key set per open object, O(n log n) in the keys. (nlohmann's callback parser could do this
// while parsing, but after every closed object it scans the parent for discarded values: quadratic in
// the number of keys.)
class DuplicateKeyFinder : public json::json_sax_t {
 public:
  std::string duplicate;  // the first repeated key, "" if none

  bool start_object(std::size_t) override {
    keys_.emplace_back();
    return true;
  }
  bool end_object() override {
    keys_.pop_back();
    return true;
  }
  bool key(string_t& k) override {
    if (keys_.back().insert(k).second) return true;
    duplicate = k;
    return false;  // one duplicate is enough to refuse the file
  }
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const json::exception&) override { return false; }

 private:
  std::vector<std::set<std::string>> keys_;
};

// Reads a header's top-level object in one SAX pass: each entry (a tensor, or "__metadata__") is built as
// a small JSON value and handed to on_entry(name, value) as soon as it is complete, so the whole header
// never exists as one document (with ~100k tensors, building and freeing it took most of the time).
// Duplicate keys inside an entry are refused here; duplicate tensor names are the caller's to find.
class HeaderReader final : public json::json_sax_t {
 public:
  using EntryFn = std::function<void(const std::string& name, const json& value)>;
  HeaderReader(const std::string& path, EntryFn on_entry) : path_(path), on_entry_(std::move(on_entry)) {}

  // Throws Error naming the file for invalid JSON, a header that is not an object, or what on_entry throws.
  void read(const char* begin, const char* end) {
    const bool ok = json::sax_parse(begin, end, this);
    if (not_object_) throw Error(file_prefix(path_) + "header is not a JSON object");
    if (!ok) throw Error(file_prefix(path_) + "header is not valid JSON: " + parse_error_);
  }

  bool start_object(std::size_t) override { return open(json::object()); }
  bool start_array(std::size_t) override { return open(json::array()); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override {
    if (depth_ == 1) {
      name_ = k;
    } else {
      if (open_.back()->contains(k)) throw Error(file_prefix(path_) + "duplicate key '" + k + "' in header");
      key_ = k;
    }
    return true;
  }
  bool null() override { return value(nullptr); }
  bool boolean(bool v) override { return value(v); }
  bool number_integer(number_integer_t v) override { return value(v); }
  bool number_unsigned(number_unsigned_t v) override { return value(v); }
  bool number_float(number_float_t v, const string_t&) override { return value(v); }
  bool string(string_t& v) override { return value(std::move(v)); }
  bool binary(binary_t& v) override { return value(json::binary(v)); }
  bool parse_error(std::size_t, const std::string&, const json::exception& e) override {
    parse_error_ = e.what();
    return false;
  }

 private:
  // Adds v where the parser is: the entry itself (depth 1) or into the innermost open container.
  json* place(json&& v) {
    if (open_.empty()) {
      entry_ = std::move(v);
      return &entry_;
    }
    json& parent = *open_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      return &parent.back();
    }
    return &(parent[key_] = std::move(v));
  }
  bool open(json&& container) {
    if (depth_++ == 0) {
      if (!container.is_object()) return not_object();
      return true;
    }
    open_.push_back(place(std::move(container)));
    return true;
  }
  bool close() {
    --depth_;
    if (depth_ == 0) return true;
    open_.pop_back();
    if (depth_ == 1) on_entry_(name_, entry_);
    return true;
  }
  bool value(json&& v) {
    if (depth_ == 0) return not_object();
    place(std::move(v));
    if (depth_ == 1) on_entry_(name_, entry_);
    return true;
  }
  bool not_object() {
    not_object_ = true;
    return false;
  }

  const std::string& path_;
  EntryFn on_entry_;
  int depth_ = 0;           // open containers, the top-level object included
  std::vector<json*> open_;  // the open containers below the top level, innermost last
  std::string name_, key_;   // the current entry's name; the pending key of the innermost object
  json entry_;
  bool not_object_ = false;
  std::string parse_error_;
};

// The "__metadata__" entry: an object of strings.
json read_metadata(const std::string& path, const json& entry) {
  if (!entry.is_object()) throw Error(file_prefix(path) + "\"__metadata__\" is not an object");
  for (auto m = entry.begin(); m != entry.end(); ++m) {
    if (!m.value().is_string()) {
      throw Error(file_prefix(path) + "\"__metadata__\" value for '" + m.key() + "' is not a string");
    }
  }
  return entry;
}

// One tensor's header entry, checked against the data section: a view of its bytes.
TensorView read_tensor_entry(const std::string& path, const std::string& name, const json& entry,
                             const uint8_t* data_start, uint64_t data_size) {
  const std::string where = tensor_prefix(path, name);
  if (name.empty()) throw Error(file_prefix(path) + "tensor with an empty name");
  if (!entry.is_object()) throw Error(where + "entry is not a JSON object");

  TensorView tv;
  tv.name = name;

  const auto dt = entry.find("dtype");
  if (dt == entry.end()) throw Error(where + "missing \"dtype\"");
  if (!dt->is_string()) throw Error(where + "\"dtype\" is not a string");
  const std::string dts = dt->get<std::string>();
  if (!parse_dtype(dts, &tv.dtype)) throw Error(where + "unknown dtype '" + dts + "'");

  const auto sh = entry.find("shape");
  if (sh == entry.end()) throw Error(where + "missing \"shape\"");
  if (!sh->is_array()) throw Error(where + "\"shape\" is not an array");
  uint64_t numel = 1;
  bool overflow = false;
  for (const json& d : *sh) {
    uint64_t v;
    if (!as_nonneg_int(d, &v)) {
      throw Error(where + "shape dimension " + d.dump() + " is not a non-negative integer");
    }
    tv.shape.push_back(static_cast<int64_t>(v));
    if (!overflow && __builtin_mul_overflow(numel, v, &numel)) overflow = true;
  }
  // numel must fit in int64 (TensorView::numel), and numel * element size in uint64.
  uint64_t expect_bytes = 0;
  if (overflow || numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
      __builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(tv.dtype)), &expect_bytes)) {
    throw Error(where + "shape " + tv.shape_str() + " overflows the element count");
  }

  const auto off = entry.find("data_offsets");
  if (off == entry.end()) throw Error(where + "missing \"data_offsets\"");
  uint64_t begin = 0, end = 0;
  if (!off->is_array() || off->size() != 2 || !as_nonneg_int((*off)[0], &begin) ||
      !as_nonneg_int((*off)[1], &end)) {
    throw Error(where + "\"data_offsets\" " + off->dump() + " is not two non-negative integers");
  }
  if (begin > end) {
    throw Error(where + "\"data_offsets\" begin " + std::to_string(begin) + " > end " +
                std::to_string(end));
  }
  if (end > data_size) {
    throw Error(where + "\"data_offsets\" end " + std::to_string(end) +
                " is past the end of the data section (" + std::to_string(data_size) +
                " bytes); file truncated?");
  }
  if (end - begin != expect_bytes) {
    throw Error(where + "byte size " + std::to_string(end - begin) + " does not match dtype " + dts +
                " and shape " + tv.shape_str() + " (expected " + std::to_string(expect_bytes) + " bytes)");
  }
  tv.nbytes = static_cast<size_t>(end - begin);
  tv.data = data_start + begin;
  return tv;
}

// The indices of `tensors` in file order (ascending offset, then end, then name), refusing overlapping
// non-empty byte ranges: a sort and one sweep.
std::vector<size_t> file_order(const std::string& path, const std::vector<TensorView>& tensors,
                               const uint8_t* data_start) {
  struct Range {
    uint64_t begin, end;
    size_t index;
  };
  std::vector<Range> ranges;
  ranges.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t begin = static_cast<uint64_t>(static_cast<const uint8_t*>(tensors[i].data) - data_start);
    ranges.push_back({begin, begin + tensors[i].nbytes, i});
  }
  std::sort(ranges.begin(), ranges.end(), [&](const Range& a, const Range& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.end != b.end) return a.end < b.end;
    return tensors[a.index].name < tensors[b.index].name;
  });
  const Range* prev = nullptr;
  for (const Range& r : ranges) {
    if (r.begin == r.end) continue;
    if (prev != nullptr && r.begin < prev->end) {
      throw Error(file_prefix(path) + "tensors '" + tensors[prev->index].name + "' [" +
                  std::to_string(prev->begin) + ", " + std::to_string(prev->end) + ") and '" +
                  tensors[r.index].name + "' [" + std::to_string(r.begin) + ", " + std::to_string(r.end) +
                  ") overlap");
    }
    if (prev == nullptr || r.end > prev->end) prev = &r;
  }
  std::vector<size_t> order;
  order.reserve(ranges.size());
  for (const Range& r : ranges) order.push_back(r.index);
  return order;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// SafetensorsFile

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path), file_(path) {
  const uint64_t file_size = file_.size();
  if (file_size < 8) {
    throw Error(file_prefix(path) + "file is too short (" + std::to_string(file_size) +
                " bytes) to hold the 8-byte header length");
  }
  const uint64_t header_len = read_u64_le(file_.data());
  if (header_len > kMaxHeaderBytes) {
    throw Error(file_prefix(path) + "header length " + std::to_string(header_len) +
                " is absurd (limit " + std::to_string(kMaxHeaderBytes) + ")");
  }
  if (header_len > file_size - 8) {
    throw Error(file_prefix(path) + "header length " + std::to_string(header_len) +
                " runs past the end of the file (" + std::to_string(file_size) +
                " bytes); file truncated?");
  }
  const char* hbegin = reinterpret_cast<const char*>(file_.data() + 8);
  const uint8_t* data_start = file_.data() + 8 + header_len;
  const uint64_t data_size = file_size - 8 - header_len;

  bool seen_metadata = false;
  HeaderReader reader(path, [&](const std::string& name, const json& entry) {
    if (name != kMetadataKey) {
      tensors_.push_back(read_tensor_entry(path, name, entry, data_start, data_size));
      return;
    }
    if (seen_metadata) throw Error(tensor_prefix(path, name) + "duplicate tensor name in header");
    seen_metadata = true;
    metadata_ = read_metadata(path, entry);
  });
  reader.read(hbegin, hbegin + header_len);

  // Names are unique (checked before the ranges, so that a repeated entry is reported as such).
  for (size_t i = 0; i < tensors_.size(); ++i)
    if (!by_name_.emplace(tensors_[i].name, i).second)
      throw Error(tensor_prefix(path, tensors_[i].name) + "duplicate tensor name in header");

  const std::vector<size_t> order = file_order(path, tensors_, data_start);

  // Store the views in file order.
  std::vector<TensorView> ordered;
  std::vector<size_t> position(tensors_.size());
  ordered.reserve(tensors_.size());
  for (size_t i : order) {
    position[i] = ordered.size();
    ordered.push_back(std::move(tensors_[i]));
  }
  tensors_ = std::move(ordered);
  for (auto& [name, index] : by_name_) index = position[index];
}

const TensorView* SafetensorsFile::find(std::string_view name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

// ---------------------------------------------------------------------------------------------
// WeightStore

void WeightStore::add_file(std::unique_ptr<SafetensorsFile> file) {
  for (const TensorView& tv : file->tensors()) {
    const auto [it, inserted] = entries_.emplace(tv.name, Entry{&tv, file.get()});
    if (!inserted) {
      throw Error("checkpoint '" + dir_ + "': tensor '" + tv.name + "' appears in both '" +
                  it->second.file->path() + "' and '" + file->path() + "'");
    }
  }
  files_.push_back(std::move(file));
}

WeightStore WeightStore::open_dir(const std::string& dir) {
  WeightStore store;
  store.dir_ = dir;
  const fs::path root(dir);
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    throw Error("checkpoint directory '" + dir + "' does not exist or is not a directory");
  }

  const fs::path index_path = root / "model.safetensors.index.json";
  if (fs::exists(index_path, ec)) {
    const std::string ip = index_path.string();
    const MappedFile raw(ip);
    json index;
    try {
      const char* b = reinterpret_cast<const char*>(raw.data());
      index = json::parse(b, b + raw.size());
    } catch (const json::exception& e) {
      throw Error("index '" + ip + "' is not valid JSON: " + e.what());
    }
    if (!index.is_object()) throw Error("index '" + ip + "' is not a JSON object");
    {
      const char* b = reinterpret_cast<const char*>(raw.data());
      DuplicateKeyFinder dups;
      json::sax_parse(b, b + raw.size(), &dups);
      if (!dups.duplicate.empty())
        throw Error("index '" + ip + "': key '" + dups.duplicate + "' appears twice in one object");
    }
    const auto wm = index.find("weight_map");
    if (wm == index.end() || !wm->is_object()) {
      throw Error("index '" + ip + "' has no \"weight_map\" object");
    }

    // Open each shard once, in name order.
    std::map<std::string, std::vector<std::string>> by_shard;
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it.value().is_string()) {
        throw Error("index '" + ip + "': shard of tensor '" + it.key() + "' is not a string");
      }
      by_shard[it.value().get<std::string>()].push_back(it.key());
    }
    for (const auto& [shard, names] : by_shard) {
      const fs::path rel(shard);
      if (shard.empty() || rel.is_absolute() ||
          std::any_of(rel.begin(), rel.end(), [](const fs::path& c) { return c == ".."; })) {
        throw Error("index '" + ip + "': invalid shard file name '" + shard + "'");
      }
      const fs::path sp = root / rel;
      if (!fs::exists(sp, ec)) {
        throw Error("index '" + ip + "' names shard '" + shard + "' (tensor '" + names.front() +
                    "'), but '" + sp.string() + "' does not exist");
      }
      auto file = std::make_unique<SafetensorsFile>(sp.string());
      for (const std::string& name : names) {
        if (file->find(name) == nullptr) {
          throw Error("index '" + ip + "' places tensor '" + name + "' in shard '" + shard +
                      "', but '" + file->path() + "' does not contain it");
        }
      }
      store.add_file(std::move(file));
    }
    return store;
  }

  const fs::path single = root / "model.safetensors";
  if (fs::exists(single, ec)) {
    store.add_file(std::make_unique<SafetensorsFile>(single.string()));
    return store;
  }

  std::vector<fs::path> found;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().extension() == ".safetensors" && !it->is_directory(ec))
      found.push_back(it->path());
  }
  if (ec) throw Error("cannot list checkpoint directory '" + dir + "': " + ec.message());
  if (found.empty()) throw Error("no safetensors files in " + dir);
  std::sort(found.begin(), found.end());
  for (const fs::path& p : found) store.add_file(std::make_unique<SafetensorsFile>(p.string()));
  return store;
}

const TensorView* WeightStore::find(std::string_view name) const {
  const auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : it->second.view;
}

const TensorView& WeightStore::get(std::string_view name) const {
  const TensorView* tv = find(name);
  if (tv == nullptr)
    throw Error("missing tensor '" + std::string(name) + "' in checkpoint " + dir_);
  return *tv;
}

std::vector<std::string> WeightStore::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& kv : entries_) out.push_back(kv.first);
  return out;
}

const std::string& WeightStore::file_of(std::string_view name) const {
  const auto it = entries_.find(name);
  if (it == entries_.end()) {
    throw Error("missing tensor '" + std::string(name) + "' in checkpoint " + dir_);
  }
  return it->second.file->path();
}

// ---------------------------------------------------------------------------------------------
// SafetensorsWriter

void SafetensorsWriter::add(const std::string& name, DType dtype, std::vector<int64_t> shape,
                            const void* data, size_t nbytes) {
  if (name.empty()) throw Error("SafetensorsWriter: empty tensor name");
  if (name == kMetadataKey) throw Error("SafetensorsWriter: reserved tensor name '" + name + "'");
  if (names_.count(name)) throw Error("SafetensorsWriter: duplicate tensor '" + name + "'");
  uint64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel)) {
      throw Error("SafetensorsWriter: tensor '" + name + "': invalid shape");
    }
  }
  uint64_t expect = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(dtype)), &expect) ||
      expect != nbytes) {
    throw Error("SafetensorsWriter: tensor '" + name + "': " + std::to_string(nbytes) +
                " bytes given, dtype " + dtype_name(dtype) + " and shape need " +
                std::to_string(expect));
  }
  if (nbytes > 0 && data == nullptr) {
    throw Error("SafetensorsWriter: tensor '" + name + "': null data");
  }
  Entry e{name, dtype, std::move(shape), {}};
  if (nbytes > 0) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    e.bytes.assign(p, p + nbytes);
  }
  names_.insert(name);
  entries_.push_back(std::move(e));
}

namespace {
size_t numel_of(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= d < 0 ? 0 : static_cast<size_t>(d);
  return n;
}
}  // namespace

void SafetensorsWriter::add_f32(const std::string& name, std::vector<int64_t> shape,
                                const float* data) {
  const size_t nbytes = numel_of(shape) * sizeof(float);
  add(name, DType::F32, std::move(shape), data, nbytes);
}

void SafetensorsWriter::add_i64(const std::string& name, std::vector<int64_t> shape,
                                const int64_t* data) {
  const size_t nbytes = numel_of(shape) * sizeof(int64_t);
  add(name, DType::I64, std::move(shape), data, nbytes);
}

void SafetensorsWriter::write(const std::string& path,
                              const std::map<std::string, std::string>& metadata) const {
  json header = json::object();
  if (!metadata.empty()) {
    json m = json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header[kMetadataKey] = std::move(m);
  }
  uint64_t offset = 0;
  for (const Entry& e : entries_) {
    const uint64_t end = offset + e.bytes.size();
    header[e.name] = {
        {"dtype", dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');

  uint8_t len[8];
  write_u64_le(text.size(), len);

  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    throw Error("cannot open '" + path + "' for writing: " + std::strerror(errno));
  }
  bool ok =
      std::fwrite(len, 1, 8, f) == 8 && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  for (const Entry& e : entries_) {
    if (!ok) break;
    if (!e.bytes.empty()) ok = std::fwrite(e.bytes.data(), 1, e.bytes.size(), f) == e.bytes.size();
  }
  const int write_err = ok ? 0 : errno;
  if (std::fclose(f) != 0 && ok) {
    throw Error("cannot write '" + path + "': " + std::strerror(errno));
  }
  if (!ok) throw Error("cannot write '" + path + "': " + std::strerror(write_err));
}

}  // namespace nextn
