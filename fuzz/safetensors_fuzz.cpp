// Fuzzes the safetensors reader (SafetensorsFile) and the checkpoint folder reader (WeightStore::open_dir,
// with and without model.safetensors.index.json).
//
// Input: SHARD1 [SEP INDEX_JSON [SEP SHARD2]] (SEP = kPartSeparator). Without an index, SHARD1 is the
// folder's model.safetensors; with one, the shards are model-00001-of-00002.safetensors and
// model-00002-of-00002.safetensors and the index's weight_map says which tensor lives where.
//
// Bad input must be a nextn::Error (any other exception escapes and fails the run). What is accepted must
// hold: every view has the bytes its header entry names (checked against an independent reading of the
// header), sizes match dtype x shape, views are in file order without overlap, and the store's names,
// lookups and files agree.
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "fuzz_util.h"
#include "io/safetensors.h"

namespace {

using nextn::fuzz::ScratchDir;
using nlohmann::json;

constexpr const char* kShard1 = "model-00001-of-00002.safetensors";
constexpr const char* kShard2 = "model-00002-of-00002.safetensors";

// The header entry of `name` in `file` as this fuzzer reads it (nlohmann, no validation): the data section's
// byte range, or false when the header does not give one.
bool expected_range(std::string_view file, const std::string& name, uint64_t* begin, uint64_t* end,
                    uint64_t* data_start) {
  if (file.size() < 8) return false;
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(file[static_cast<size_t>(i)]);
  if (header_len > file.size() - 8) return false;
  const json header = json::parse(file.substr(8, header_len), nullptr, /*allow_exceptions=*/false);
  if (!header.is_object()) return false;
  const auto entry = header.find(name);
  if (entry == header.end() || !entry->is_object()) return false;
  const auto offsets = entry->find("data_offsets");
  if (offsets == entry->end() || !offsets->is_array() || offsets->size() != 2) return false;
  // A non-negative integer, written with a sign or not ("-0" is 0, as the reader takes it).
  auto offset = [](const json& v, uint64_t* out) {
    if (v.is_number_unsigned()) *out = v.get<uint64_t>();
    else if (v.is_number_integer() && v.get<int64_t>() >= 0) *out = static_cast<uint64_t>(v.get<int64_t>());
    else return false;
    return true;
  };
  if (!offset((*offsets)[0], begin) || !offset((*offsets)[1], end)) return false;
  *data_start = 8 + header_len;
  return *begin <= *end;
}

void check_file(const nextn::SafetensorsFile& file, std::string_view bytes) {
  NEXTN_FUZZ_CHECK(file.file_bytes() == bytes.size());
  NEXTN_FUZZ_CHECK(file.metadata().is_object());
  const uint8_t* previous_end = nullptr;
  for (const nextn::TensorView& t : file.tensors()) {
    NEXTN_FUZZ_CHECK(!t.name.empty());
    NEXTN_FUZZ_CHECK(file.find(t.name) == &t);
    int64_t numel = 1;
    for (int64_t d : t.shape) {
      NEXTN_FUZZ_CHECK(d >= 0);
      numel *= d;  // the reader rejected shapes whose product overflows
    }
    NEXTN_FUZZ_CHECK(t.nbytes == static_cast<size_t>(numel) * nextn::dtype_size(t.dtype));
    NEXTN_FUZZ_CHECK(t.nbytes <= bytes.size());

    uint64_t begin = 0, end = 0, data_start = 0;
    NEXTN_FUZZ_CHECK(expected_range(bytes, t.name, &begin, &end, &data_start));
    NEXTN_FUZZ_CHECK(end - begin == t.nbytes && data_start + end <= bytes.size());
    // The view's bytes are the ones the header names (this reads the whole mapped range, so a view that
    // points past the mapping faults here).
    NEXTN_FUZZ_CHECK(std::memcmp(t.data, bytes.data() + data_start + begin, t.nbytes) == 0);
    const auto* p = static_cast<const uint8_t*>(t.data);
    if (t.nbytes > 0) {
      NEXTN_FUZZ_CHECK(previous_end == nullptr || p >= previous_end);  // file order, no overlap
      previous_end = p + t.nbytes;
    }
    // Decoding arbitrary bytes of every dtype must be defined behaviour (NaN encodings, huge doubles...).
    if (numel > 0 && numel <= 4096) {
      std::vector<float> values(static_cast<size_t>(numel));
      nextn::convert_to_f32(t.dtype, t.data, values.data(), values.size());
    }
  }
  NEXTN_FUZZ_CHECK(file.find("__metadata__") == nullptr);
}

// `written`: the folder's files by name, with their bytes (an index may name any of them as a shard).
void check_store(const nextn::WeightStore& store, const std::map<std::string, std::string_view>& written) {
  const std::vector<std::string> names = store.names();
  NEXTN_FUZZ_CHECK(names.size() == store.size());
  NEXTN_FUZZ_CHECK(std::set<std::string>(names.begin(), names.end()).size() == names.size());
  size_t in_files = 0;
  for (const auto& file : store.files()) {
    in_files += file->tensors().size();
    const std::string base = std::filesystem::path(file->path()).filename().string();
    NEXTN_FUZZ_CHECK(written.count(base) == 1);
    check_file(*file, written.at(base));
  }
  NEXTN_FUZZ_CHECK(in_files == names.size());
  for (const std::string& name : names) {
    const nextn::TensorView& t = store.get(name);
    NEXTN_FUZZ_CHECK(store.find(name) == &t && t.name == name);
    bool held = false;
    for (const auto& file : store.files()) held |= file->path() == store.file_of(name) && file->find(name) == &t;
    NEXTN_FUZZ_CHECK(held);
  }
  NEXTN_FUZZ_CHECK(store.find("nextn.fuzz.absent") == nullptr);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ScratchDir dir;
  const std::vector<std::string_view> parts = nextn::fuzz::split_parts(data, size, 3);
  dir.clear();
  std::map<std::string, std::string_view> written;
  if (parts.size() == 1) {
    written["model.safetensors"] = parts[0];
  } else {
    written[kShard1] = parts[0];
    written["model.safetensors.index.json"] = parts[1];
    if (parts.size() == 3) written[kShard2] = parts[2];
  }
  for (const auto& [name, bytes] : written) dir.write(name, bytes);
  if (parts.size() == 1) {
    try {
      const nextn::SafetensorsFile file(dir.path() + "/model.safetensors");
      check_file(file, parts[0]);
    } catch (const nextn::Error&) {
    }
  }
  try {
    const nextn::WeightStore store = nextn::WeightStore::open_dir(dir.path());
    check_store(store, written);
  } catch (const nextn::Error&) {
  }
  return 0;
}
