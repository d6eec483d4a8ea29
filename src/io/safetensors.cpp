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

// Parses the header, rejecting duplicate keys in any object (nlohmann keeps the last silently).
json parse_header(const std::string& path, const char* begin, const char* end) {
  std::vector<std::set<std::string>> keys;
  std::string dup;
  int dup_depth = 0;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    switch (ev) {
      case json::parse_event_t::object_start:
        keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key:
        if (!keys.empty() && parsed.is_string() && dup.empty()) {
          if (!keys.back().insert(parsed.get<std::string>()).second) {
            dup = parsed.get<std::string>();
            dup_depth = depth;
          }
        }
        break;
      default:
        break;
    }
    return true;
  };
  json header;
  try {
    header = json::parse(begin, end, cb);
  } catch (const json::exception& e) {
    throw Error(file_prefix(path) + "header is not valid JSON: " + e.what());
  }
  if (!header.is_object()) throw Error(file_prefix(path) + "header is not a JSON object");
  if (!dup.empty()) {
    if (dup_depth == 1) throw Error(tensor_prefix(path, dup) + "duplicate tensor name in header");
    throw Error(file_prefix(path) + "duplicate key '" + dup + "' in header");
  }
  return header;
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
  const json header = parse_header(path, hbegin, hbegin + header_len);

  const uint8_t* data_start = file_.data() + 8 + header_len;
  const uint64_t data_size = file_size - 8 - header_len;

  struct Range {
    uint64_t begin, end;
    size_t index;
  };
  std::vector<Range> ranges;
  tensors_.reserve(header.size());

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& entry = it.value();
    if (name == kMetadataKey) {
      if (!entry.is_object()) throw Error(file_prefix(path) + "\"__metadata__\" is not an object");
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string()) {
          throw Error(file_prefix(path) + "\"__metadata__\" value for '" + m.key() +
                      "' is not a string");
        }
      }
      metadata_ = entry;
      continue;
    }
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
      throw Error(where + "byte size " + std::to_string(end - begin) + " does not match dtype " +
                  dts + " and shape " + tv.shape_str() + " (expected " +
                  std::to_string(expect_bytes) + " bytes)");
    }
    tv.nbytes = static_cast<size_t>(end - begin);
    tv.data = data_start + begin;
    ranges.push_back({begin, end, tensors_.size()});
    tensors_.push_back(std::move(tv));
  }

  // Overlap check over the non-empty byte ranges, in offset order.
  std::sort(ranges.begin(), ranges.end(), [&](const Range& a, const Range& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.end != b.end) return a.end < b.end;
    return tensors_[a.index].name < tensors_[b.index].name;
  });
  const Range* prev = nullptr;
  for (const Range& r : ranges) {
    if (r.begin == r.end) continue;
    if (prev != nullptr && r.begin < prev->end) {
      throw Error(file_prefix(path) + "tensors '" + tensors_[prev->index].name + "' [" +
                  std::to_string(prev->begin) + ", " + std::to_string(prev->end) + ") and '" +
                  tensors_[r.index].name + "' [" + std::to_string(r.begin) + ", " +
                  std::to_string(r.end) + ") overlap");
    }
    if (prev == nullptr || r.end > prev->end) prev = &r;
  }

  // Store the views in file order.
  std::vector<TensorView> ordered;
  ordered.reserve(tensors_.size());
  for (const Range& r : ranges) ordered.push_back(std::move(tensors_[r.index]));
  tensors_ = std::move(ordered);
  for (size_t i = 0; i < tensors_.size(); ++i) by_name_.emplace(tensors_[i].name, i);
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
  for (const Entry& e : entries_) {
    if (e.name == name) throw Error("SafetensorsWriter: duplicate tensor '" + name + "'");
  }
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
