#include "io/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/mapped_file.h"

namespace nextn {
namespace {

namespace fs = std::filesystem;

// A fresh, empty directory for the current test.
std::string make_test_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir =
      fs::path(::testing::TempDir()) / ("nextn_st_" + std::string(info->test_suite_name()) + "_" +
                                        info->name() + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  ASSERT_TRUE(f.good()) << path;
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

std::string u64_le(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

// Raw safetensors bytes: length prefix (the true header size unless overridden), header, data.
std::string raw_file(const std::string& header, const std::string& data,
                     uint64_t header_len_field = UINT64_MAX) {
  const uint64_t n = header_len_field == UINT64_MAX ? header.size() : header_len_field;
  return u64_le(n) + header + data;
}

// Runs fn, expecting nextn::Error whose message contains every one of `parts`.
void expect_error(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) {
      EXPECT_NE(msg.find(p), std::string::npos)
          << "message \"" << msg << "\" lacks \"" << p << "\"";
    }
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected nextn::Error, got another exception: " << e.what();
    return;
  }
  ADD_FAILURE() << "expected nextn::Error, nothing was thrown";
}

void expect_open_error(const std::string& path, std::initializer_list<std::string> parts) {
  expect_error([&] { SafetensorsFile f(path); }, parts);
}

// Writes `header` + `data` as a raw file named `name` in a fresh dir and expects opening to
// fail with a message naming the file and containing `parts`.
void expect_malformed(const std::string& name, const std::string& bytes,
                      std::initializer_list<std::string> parts) {
  const std::string path = (fs::path(make_test_dir()) / name).string();
  write_bytes(path, bytes);
  expect_open_error(path, {path});
  expect_open_error(path, parts);
}

std::string zeros(size_t n) { return std::string(n, '\0'); }

// ---------------------------------------------------------------------------------------------
// Round trips

TEST(Safetensors, RoundTripSingleFile) {
  const std::string dir = make_test_dir();
  const std::string path = dir + "/model.safetensors";

  const float w[6] = {1.f, -2.f, 3.5f, 0.f, 1e-30f, -7.f};
  const int64_t ids[4] = {1, -2, int64_t{1} << 40, 151643};
  const uint16_t bf[2] = {0x3f80, 0xc020};
  const uint8_t scalar = 42;
  SafetensorsWriter wr;
  wr.add_f32("layer.weight", {2, 3}, w);
  wr.add_i64("ids", {4}, ids);
  wr.add("empty", DType::F32, {0, 4}, nullptr, 0);
  wr.add("half", DType::BF16, {2}, bf, sizeof(bf));
  wr.add("scalar", DType::U8, {}, &scalar, 1);
  EXPECT_EQ(wr.size(), 5u);
  wr.write(path, {{"format", "pt"}, {"note", "hello"}});

  // Header padded with spaces to a multiple of 8.
  const std::string raw = read_bytes(path);
  ASSERT_GE(raw.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(raw[i]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(raw.size(), 8 + n + sizeof(w) + sizeof(ids) + sizeof(bf) + 1);

  SafetensorsFile f(path);
  EXPECT_EQ(f.path(), path);
  ASSERT_EQ(f.tensors().size(), 5u);
  EXPECT_EQ(f.metadata().value("format", ""), "pt");
  EXPECT_EQ(f.metadata().value("note", ""), "hello");

  const TensorView* t = f.find("layer.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->name, "layer.weight");
  EXPECT_EQ(t->dtype, DType::F32);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t->nbytes, sizeof(w));
  EXPECT_EQ(std::memcmp(t->data, w, sizeof(w)), 0);

  // Zero copy: views point into the file's mapping, i.e. at the right file offset.
  const uint8_t* base = static_cast<const uint8_t*>(t->data);
  EXPECT_EQ(std::memcmp(base, raw.data() + 8 + n, sizeof(w)), 0);

  t = f.find("ids");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, DType::I64);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(std::memcmp(t->data, ids, sizeof(ids)), 0);
  EXPECT_EQ(static_cast<const uint8_t*>(t->data), base + sizeof(w));

  t = f.find("empty");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->nbytes, 0u);
  EXPECT_EQ(t->numel(), 0);

  t = f.find("half");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, DType::BF16);
  EXPECT_EQ(std::memcmp(t->data, bf, sizeof(bf)), 0);

  t = f.find("scalar");
  ASSERT_NE(t, nullptr);
  EXPECT_TRUE(t->shape.empty());
  EXPECT_EQ(t->numel(), 1);
  EXPECT_EQ(*static_cast<const uint8_t*>(t->data), 42);

  EXPECT_EQ(f.find("nope"), nullptr);

  // tensors() is in file order.
  for (size_t i = 1; i < f.tensors().size(); ++i) {
    EXPECT_LE(static_cast<const uint8_t*>(f.tensors()[i - 1].data),
              static_cast<const uint8_t*>(f.tensors()[i].data));
  }

  // Moving the file object keeps the views valid.
  SafetensorsFile moved(std::move(f));
  ASSERT_NE(moved.find("ids"), nullptr);
  EXPECT_EQ(std::memcmp(moved.find("ids")->data, ids, sizeof(ids)), 0);

  // The directory opens through model.safetensors.
  WeightStore store = WeightStore::open_dir(dir);
  EXPECT_EQ(store.dir(), dir);
  EXPECT_EQ(store.size(), 5u);
  EXPECT_EQ(store.names(),
            (std::vector<std::string>{"empty", "half", "ids", "layer.weight", "scalar"}));
  EXPECT_EQ(store.file_of("ids"), path);
  EXPECT_EQ(std::memcmp(store.get("layer.weight").data, w, sizeof(w)), 0);
  EXPECT_EQ(store.find("missing"), nullptr);

  WeightStore store2 = std::move(store);
  const TensorView& v = store2.get("ids");
  EXPECT_EQ(std::memcmp(v.data, ids, sizeof(ids)), 0);
}

TEST(Safetensors, EmptyHeaderFile) {
  const std::string path = make_test_dir() + "/empty.safetensors";
  SafetensorsWriter wr;
  wr.write(path);
  SafetensorsFile f(path);
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_TRUE(f.metadata().empty());
}

TEST(Safetensors, RoundTripShardedWithIndex) {
  const std::string dir = make_test_dir();
  const float a[4] = {1, 2, 3, 4};
  const float b[2] = {5, 6};
  const int64_t c[3] = {7, 8, 9};
  {
    SafetensorsWriter w1;
    w1.add_f32("model.a", {2, 2}, a);
    w1.add_f32("model.b", {2}, b);
    w1.write(dir + "/model-00001-of-00002.safetensors");
    SafetensorsWriter w2;
    w2.add_i64("model.c", {3}, c);
    w2.write(dir + "/model-00002-of-00002.safetensors");
  }
  write_bytes(dir + "/model.safetensors.index.json", R"({
    "metadata": {"total_size": 48},
    "weight_map": {
      "model.a": "model-00001-of-00002.safetensors",
      "model.b": "model-00001-of-00002.safetensors",
      "model.c": "model-00002-of-00002.safetensors"
    }
  })");
  // A stray unrelated (even corrupt) file is ignored when an index exists.
  write_bytes(dir + "/zzz.safetensors", "garbage");

  WeightStore store = WeightStore::open_dir(dir);
  EXPECT_EQ(store.size(), 3u);
  EXPECT_EQ(store.names(), (std::vector<std::string>{"model.a", "model.b", "model.c"}));
  EXPECT_EQ(store.file_of("model.a"), dir + "/model-00001-of-00002.safetensors");
  EXPECT_EQ(store.file_of("model.c"), dir + "/model-00002-of-00002.safetensors");
  EXPECT_EQ(store.files().size(), 2u);
  EXPECT_EQ(std::memcmp(store.get("model.a").data, a, sizeof(a)), 0);
  EXPECT_EQ(std::memcmp(store.get("model.b").data, b, sizeof(b)), 0);
  EXPECT_EQ(std::memcmp(store.get("model.c").data, c, sizeof(c)), 0);
  EXPECT_EQ(store.get("model.c").dtype, DType::I64);

  WeightStore moved = std::move(store);
  EXPECT_EQ(std::memcmp(moved.get("model.c").data, c, sizeof(c)), 0);
}

TEST(Safetensors, DirectoryGlobFallback) {
  const std::string dir = make_test_dir();
  const float a[1] = {1};
  const float b[1] = {2};
  SafetensorsWriter w1;
  w1.add_f32("x", {1}, a);
  w1.write(dir + "/b.safetensors");
  SafetensorsWriter w2;
  w2.add_f32("y", {1}, b);
  w2.write(dir + "/a.safetensors");
  write_bytes(dir + "/notes.txt", "not a checkpoint");

  WeightStore store = WeightStore::open_dir(dir);
  EXPECT_EQ(store.size(), 2u);
  ASSERT_EQ(store.files().size(), 2u);
  EXPECT_EQ(store.files()[0]->path(), dir + "/a.safetensors");  // sorted by name
  EXPECT_EQ(store.file_of("x"), dir + "/b.safetensors");
  EXPECT_EQ(store.file_of("y"), dir + "/a.safetensors");
}

TEST(Safetensors, NoSafetensorsFiles) {
  const std::string dir = make_test_dir();
  write_bytes(dir + "/config.json", "{}");
  expect_error([&] { WeightStore::open_dir(dir); }, {"no safetensors files in " + dir});
  expect_error([&] { WeightStore::open_dir(dir + "/does_not_exist"); }, {dir + "/does_not_exist"});
}

TEST(Safetensors, WriterRejectsBadInput) {
  SafetensorsWriter wr;
  const float v[4] = {};
  wr.add_f32("a", {2, 2}, v);
  expect_error([&] { wr.add_f32("a", {1}, v); }, {"'a'", "duplicate"});
  expect_error([&] { wr.add("b", DType::F32, {2, 2}, v, 12); }, {"'b'", "12"});
  expect_error([&] { wr.add("c", DType::F32, {-1}, v, 4); }, {"'c'"});
  expect_error([&] { wr.add("__metadata__", DType::U8, {1}, v, 1); }, {"__metadata__"});
  expect_error([&] { wr.write("/nonexistent_dir_nextn/x.safetensors"); },
               {"/nonexistent_dir_nextn/x.safetensors"});
}

// ---------------------------------------------------------------------------------------------
// Malformed single files

// NEXTN_WEIGHTS=memory (FileResidency::kInMemory): a file of at least kInMemoryMinBytes is read into memory
// with the same bytes as its mapping; smaller files stay mapped.
TEST(MappedFile, InMemoryResidencyHasTheMappedBytes) {
  const std::string dir = make_test_dir();
  std::string big(kInMemoryMinBytes + 4097, '\0'), small(100, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + 7);
  for (size_t i = 0; i < small.size(); ++i) small[i] = static_cast<char>(i);
  write_bytes(dir + "/big.bin", big);
  write_bytes(dir + "/small.bin", small);
  const FileResidency before = file_residency();
  set_file_residency(FileResidency::kInMemory);
  MappedFile b(dir + "/big.bin"), s(dir + "/small.bin");
  set_file_residency(before);
  EXPECT_TRUE(b.in_memory());
  EXPECT_FALSE(s.in_memory());
  ASSERT_EQ(b.size(), big.size());
  ASSERT_EQ(s.size(), small.size());
  EXPECT_EQ(0, std::memcmp(b.data(), big.data(), big.size()));
  EXPECT_EQ(0, std::memcmp(s.data(), small.data(), small.size()));
  MappedFile moved = std::move(b);  // (the memory moves with it and is released once)
  EXPECT_TRUE(moved.in_memory());
  EXPECT_FALSE(b.in_memory());
  MappedFile mapped(dir + "/big.bin");
  EXPECT_EQ(mapped.in_memory(), before == FileResidency::kInMemory);
  EXPECT_EQ(0, std::memcmp(mapped.data(), big.data(), big.size()));
}

TEST(SafetensorsMalformed, MissingFile) {
  const std::string path = make_test_dir() + "/nope.safetensors";
  expect_open_error(path, {path, std::strerror(ENOENT)});
}

TEST(SafetensorsMalformed, ShorterThanEightBytes) {
  expect_malformed("short.safetensors", "\x05\0\0", {"short"});
  expect_malformed("empty.safetensors", "", {"short"});
}

TEST(SafetensorsMalformed, TruncatedInDataSection) {
  const std::string dir = make_test_dir();
  const std::string path = dir + "/cut.safetensors";
  const float w[8] = {};
  SafetensorsWriter wr;
  wr.add_f32("first", {2}, w);
  wr.add_f32("second", {6}, w);
  wr.write(path);
  const std::string raw = read_bytes(path);
  write_bytes(path, raw.substr(0, raw.size() - 5));
  expect_open_error(path, {path, "'second'", "past the end"});
}

TEST(SafetensorsMalformed, TruncatedInsideHeader) {
  const std::string path = make_test_dir() + "/cut.safetensors";
  const float w[2] = {};
  SafetensorsWriter wr;
  wr.add_f32("t", {2}, w);
  wr.write(path);
  const std::string raw = read_bytes(path);
  write_bytes(path, raw.substr(0, 8 + 10));
  expect_open_error(path, {path, "header length"});
}

TEST(SafetensorsMalformed, HeaderLengthPastEof) {
  const std::string header = R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  expect_malformed("len.safetensors", raw_file(header, zeros(4), header.size() + 100),
                   {"header length", "past the end"});
}

TEST(SafetensorsMalformed, HeaderLengthAbsurd) {
  expect_malformed("huge.safetensors", raw_file("{}", "", uint64_t{1} << 40), {"absurd"});
  expect_malformed("max.safetensors", raw_file("{}", "", UINT64_MAX - 1), {"header length"});
}

TEST(SafetensorsMalformed, OffsetsPastEof) {
  const std::string header = R"({"w":{"dtype":"F32","shape":[16],"data_offsets":[0,64]}})";
  expect_malformed("off.safetensors", raw_file(header, zeros(16)), {"'w'", "past the end"});
}

TEST(SafetensorsMalformed, OverlappingTensors) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                             R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})";
  expect_malformed("overlap.safetensors", raw_file(header, zeros(24)), {"'a'", "'b'", "overlap"});
}

TEST(SafetensorsMalformed, IdenticalRangesOverlap) {
  const std::string header = R"({"a":{"dtype":"I32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  expect_malformed("same.safetensors", raw_file(header, zeros(8)), {"'a'", "'b'", "overlap"});
}

TEST(SafetensorsMalformed, WrongByteSizeForDtype) {
  const std::string header = R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})";
  expect_malformed("size.safetensors", raw_file(header, zeros(16)), {"'w'", "F32", "12", "16"});
}

TEST(SafetensorsMalformed, UnknownDtype) {
  const std::string header = R"({"w":{"dtype":"Q4_K","shape":[2],"data_offsets":[0,2]}})";
  expect_malformed("dtype.safetensors", raw_file(header, zeros(2)), {"'w'", "Q4_K"});
}

TEST(SafetensorsMalformed, MalformedJson) {
  expect_malformed("json.safetensors", raw_file(R"({"w": {"dtype": "F32", )", ""), {"JSON"});
  expect_malformed("notobj.safetensors", raw_file("[1, 2]", ""), {"not a JSON object"});
  expect_malformed("zerolen.safetensors", raw_file("", ""), {"JSON"});
}

TEST(SafetensorsMalformed, BadEntries) {
  const auto hdr = [](const std::string& entry) {
    return raw_file(R"({"bad.tensor":)" + entry + "}", zeros(64));
  };
  expect_malformed("e1.safetensors", hdr("[1]"), {"'bad.tensor'", "not a JSON object"});
  expect_malformed("e2.safetensors", hdr(R"({"shape":[1],"data_offsets":[0,4]})"),
                   {"'bad.tensor'", "dtype"});
  expect_malformed("e3.safetensors", hdr(R"({"dtype":"F32","data_offsets":[0,4]})"),
                   {"'bad.tensor'", "shape"});
  expect_malformed("e4.safetensors", hdr(R"({"dtype":"F32","shape":[1]})"),
                   {"'bad.tensor'", "data_offsets"});
  expect_malformed("e5.safetensors", hdr(R"({"dtype":7,"shape":[1],"data_offsets":[0,4]})"),
                   {"'bad.tensor'", "dtype"});
  expect_malformed("e6.safetensors", hdr(R"({"dtype":"F32","shape":[-1],"data_offsets":[0,4]})"),
                   {"'bad.tensor'", "-1"});
  expect_malformed("e7.safetensors", hdr(R"({"dtype":"F32","shape":[2.5],"data_offsets":[0,4]})"),
                   {"'bad.tensor'", "2.5"});
  expect_malformed("e8.safetensors", hdr(R"({"dtype":"F32","shape":"[1]","data_offsets":[0,4]})"),
                   {"'bad.tensor'", "shape"});
  expect_malformed("e9.safetensors",
                   hdr(R"({"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,4]})"),
                   {"'bad.tensor'", "overflow"});
  expect_malformed("e10.safetensors",
                   hdr(R"({"dtype":"F32","shape":[2147483648,2147483648],"data_offsets":[0,4]})"),
                   {"'bad.tensor'", "overflow"});
  expect_malformed("e11.safetensors", hdr(R"({"dtype":"F32","shape":[1],"data_offsets":[8,4]})"),
                   {"'bad.tensor'", "begin"});
  expect_malformed("e12.safetensors", hdr(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4,8]})"),
                   {"'bad.tensor'", "data_offsets"});
  expect_malformed("e13.safetensors", hdr(R"({"dtype":"F32","shape":[1],"data_offsets":[-4,0]})"),
                   {"'bad.tensor'", "data_offsets"});
  expect_malformed("e14.safetensors", hdr(R"({"dtype":"F32","shape":[1],"data_offsets":"0-4"})"),
                   {"'bad.tensor'", "data_offsets"});
  expect_malformed("e15.safetensors",
                   hdr(R"({"dtype":"F32","shape":[1],"data_offsets":[0.0,4.0]})"),
                   {"'bad.tensor'", "data_offsets"});
  expect_malformed(
      "e16.safetensors",
      hdr(R"({"dtype":"F32","shape":[1],"data_offsets":[18446744073709551612,18446744073709551616]})"),
      {"'bad.tensor'", "data_offsets"});
}

TEST(SafetensorsMalformed, DuplicateNamesInHeader) {
  const std::string header = R"({"dup":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                             R"("dup":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  expect_malformed("dup.safetensors", raw_file(header, zeros(8)), {"'dup'", "duplicate"});
}

TEST(SafetensorsMalformed, DuplicateKeysInsideAnEntry) {
  expect_malformed("dupkey.safetensors",
                   raw_file(R"({"t":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}})", zeros(4)),
                   {"duplicate key 'dtype'"});
  expect_malformed("dupmeta.safetensors", raw_file(R"({"__metadata__":{"k":"a","k":"b"}})", ""),
                   {"duplicate key 'k'"});
}

TEST(SafetensorsMalformed, BadMetadata) {
  expect_malformed("meta.safetensors", raw_file(R"({"__metadata__": [1]})", ""), {"__metadata__"});
  expect_malformed("meta2.safetensors", raw_file(R"({"__metadata__": {"k": 1}})", ""),
                   {"__metadata__", "'k'"});
}

TEST(SafetensorsMalformed, EveryTruncationIsRejectedCleanly) {
  // Cutting a valid file at any byte must throw nextn::Error (never crash or read past the end).
  const std::string dir = make_test_dir();
  const std::string good = dir + "/good.safetensors";
  const float w[3] = {1, 2, 3};
  SafetensorsWriter wr;
  wr.add_f32("t", {3}, w);
  wr.write(good, {{"format", "pt"}});
  const std::string raw = read_bytes(good);
  const std::string path = dir + "/cut.safetensors";
  for (size_t len = 0; len < raw.size(); ++len) {
    write_bytes(path, raw.substr(0, len));
    EXPECT_THROW(SafetensorsFile{path}, Error) << "cut at " << len;
  }
  write_bytes(path, raw);
  EXPECT_NO_THROW(SafetensorsFile{path});
}

// ---------------------------------------------------------------------------------------------
// Malformed checkpoints (directories)

void write_two_shards(const std::string& dir) {
  const float a[2] = {1, 2};
  SafetensorsWriter w1;
  w1.add_f32("a", {2}, a);
  w1.write(dir + "/s1.safetensors");
  SafetensorsWriter w2;
  w2.add_f32("b", {2}, a);
  w2.write(dir + "/s2.safetensors");
}

TEST(SafetensorsMalformed, MissingShardFile) {
  const std::string dir = make_test_dir();
  write_two_shards(dir);
  write_bytes(dir + "/model.safetensors.index.json",
              R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors",
                                 "c": "s3.safetensors"}})");
  expect_error([&] { WeightStore::open_dir(dir); },
               {"model.safetensors.index.json", "s3.safetensors", "'c'"});
}

TEST(SafetensorsMalformed, IndexNamesTensorTheShardLacks) {
  const std::string dir = make_test_dir();
  write_two_shards(dir);
  write_bytes(dir + "/model.safetensors.index.json",
              R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors",
                                 "ghost.weight": "s1.safetensors"}})");
  expect_error([&] { WeightStore::open_dir(dir); },
               {"model.safetensors.index.json", "s1.safetensors", "'ghost.weight'"});
}

TEST(SafetensorsMalformed, DuplicateAcrossShards) {
  const std::string dir = make_test_dir();
  const float a[2] = {1, 2};
  SafetensorsWriter w1;
  w1.add_f32("a", {2}, a);
  w1.add_f32("shared", {2}, a);
  w1.write(dir + "/s1.safetensors");
  SafetensorsWriter w2;
  w2.add_f32("b", {2}, a);
  w2.add_f32("shared", {2}, a);
  w2.write(dir + "/s2.safetensors");
  write_bytes(dir + "/model.safetensors.index.json",
              R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors",
                                 "shared": "s1.safetensors"}})");
  expect_error([&] { WeightStore::open_dir(dir); },
               {"'shared'", "s1.safetensors", "s2.safetensors"});

  // The same holds without an index (directory glob).
  fs::remove(dir + "/model.safetensors.index.json");
  expect_error([&] { WeightStore::open_dir(dir); },
               {"'shared'", "s1.safetensors", "s2.safetensors"});
}

TEST(SafetensorsMalformed, BadIndexJson) {
  const std::string dir = make_test_dir();
  write_two_shards(dir);
  const std::string index = dir + "/model.safetensors.index.json";
  write_bytes(index, "{\"weight_map\": ");
  expect_error([&] { WeightStore::open_dir(dir); }, {index, "JSON"});
  write_bytes(index, R"({"metadata": {}})");
  expect_error([&] { WeightStore::open_dir(dir); }, {index, "weight_map"});
  write_bytes(index, R"({"weight_map": {"a": 3}})");
  expect_error([&] { WeightStore::open_dir(dir); }, {index, "'a'"});
  write_bytes(index, R"({"weight_map": {"a": "../s1.safetensors"}})");
  expect_error([&] { WeightStore::open_dir(dir); }, {index, "../s1.safetensors"});
}

TEST(SafetensorsMalformed, IndexNamesATensorTwice) {
  const std::string dir = make_test_dir();
  write_two_shards(dir);
  const std::string index = dir + "/model.safetensors.index.json";
  write_bytes(index, R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors", "a": "s2.safetensors"}})");
  expect_error([&] { WeightStore::open_dir(dir); }, {index, "'a'", "twice"});
}

TEST(SafetensorsMalformed, CorruptShardNamesTheShard) {
  const std::string dir = make_test_dir();
  write_two_shards(dir);
  write_bytes(dir + "/s2.safetensors", "xx");
  write_bytes(dir + "/model.safetensors.index.json",
              R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  expect_error([&] { WeightStore::open_dir(dir); }, {dir + "/s2.safetensors"});
}

TEST(SafetensorsMalformed, GetMissingTensor) {
  const std::string dir = make_test_dir();
  write_two_shards(dir);
  WeightStore store = WeightStore::open_dir(dir);
  EXPECT_EQ(store.size(), 2u);
  expect_error([&] { store.get("model.layers.0.mlp.gate_proj.weight"); },
               {"missing tensor 'model.layers.0.mlp.gate_proj.weight' in checkpoint " + dir});
  expect_error([&] { store.file_of("nope"); }, {"'nope'", dir});
}

// ---------------------------------------------------------------------------------------------
// Checkpoints with many tensors (MoE checkpoints with split experts carry ~100k): the header and the
// index are parsed in O(n log n); a quadratic step would run into the test timeout. The time itself is
// measured in bench/safetensors_bench.cpp.

// The name of tensor i, zero-padded so that name order is index order.
std::string many_name(size_t i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "model.t%07zu.weight", i);
  return buf;
}

// A header of n one-float F32 tensors listed in name order, tensor i stored at slot (i * 7919) % n of the
// data section (7919 is prime, so the slots are a permutation and the file order differs from the name
// order). `last_begin` overrides the last tensor's byte range start when set.
std::string many_tensors_header(size_t n, uint64_t last_begin = UINT64_MAX) {
  std::string h = "{";
  h.reserve(n * 64);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t begin = i + 1 == n && last_begin != UINT64_MAX ? last_begin : (i * 7919) % n * 4;
    if (i) h += ',';
    h += "\"" + many_name(i) + "\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[" +
         std::to_string(begin) + "," + std::to_string(begin + 4) + "]}";
  }
  return h + "}";
}

TEST(Safetensors, HeaderWith300kTensors) {
  constexpr size_t kN = 300'000;
  const std::string path = make_test_dir() + "/many.safetensors";
  std::string data(kN * 4, '\0');
  for (size_t i = 0; i < kN; ++i) {
    const float v = static_cast<float>(i);
    std::memcpy(&data[(i * 7919) % kN * 4], &v, 4);
  }
  write_bytes(path, raw_file(many_tensors_header(kN), data));
  const SafetensorsFile f(path);
  ASSERT_EQ(f.tensors().size(), kN);
  for (size_t i = 1; i < kN; ++i) ASSERT_LT(f.tensors()[i - 1].data, f.tensors()[i].data) << i;  // file order
  for (size_t i : {size_t(0), size_t(1), kN / 2, kN - 1}) {
    const TensorView* t = f.find(many_name(i));
    ASSERT_NE(t, nullptr) << i;
    float v;
    std::memcpy(&v, t->data, 4);
    EXPECT_EQ(v, static_cast<float>(i));
  }
  // Every check still runs at that size: the last tensor moved onto the first one's bytes is an overlap.
  write_bytes(path, raw_file(many_tensors_header(kN, 0), data));
  expect_open_error(path, {"'" + many_name(0) + "'", "'" + many_name(kN - 1) + "'", "overlap"});
}

TEST(Safetensors, IndexWith100kTensors) {
  constexpr size_t kN = 100'000, kShards = 4;
  const std::string dir = make_test_dir();
  std::vector<std::string> shard_headers(kShards, "{");
  std::vector<size_t> shard_count(kShards, 0);
  std::string weight_map = "{";
  for (size_t i = 0; i < kN; ++i) {
    const size_t s = i % kShards;
    const std::string shard = "model-0000" + std::to_string(s + 1) + "-of-0000" + std::to_string(kShards) +
                              ".safetensors";
    const size_t slot = shard_count[s]++;
    if (slot) shard_headers[s] += ',';
    shard_headers[s] += "\"" + many_name(i) + "\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[" +
                        std::to_string(slot * 4) + "," + std::to_string(slot * 4 + 4) + "]}";
    if (i) weight_map += ',';
    weight_map += "\"" + many_name(i) + "\":\"" + shard + "\"";
  }
  for (size_t s = 0; s < kShards; ++s)
    write_bytes(dir + "/model-0000" + std::to_string(s + 1) + "-of-0000" + std::to_string(kShards) + ".safetensors",
                raw_file(shard_headers[s] + "}", zeros(shard_count[s] * 4)));
  write_bytes(dir + "/model.safetensors.index.json", "{\"weight_map\":" + weight_map + "}}");
  const WeightStore store = WeightStore::open_dir(dir);
  EXPECT_EQ(store.size(), kN);
  EXPECT_EQ(store.files().size(), kShards);
  EXPECT_EQ(store.file_of(many_name(kN - 1)), dir + "/model-00004-of-00004.safetensors");
  EXPECT_NE(store.find(many_name(kN / 2)), nullptr);
}

// The writer checks names against a set, not a list: many tensors are written in O(n log n) too.
TEST(Safetensors, WriterWithManyTensors) {
  constexpr size_t kN = 100'000;
  SafetensorsWriter w;
  const float v = 1.5f;
  for (size_t i = 0; i < kN; ++i) w.add_f32(many_name(i), {1}, &v);
  EXPECT_EQ(w.size(), kN);
  expect_error([&] { w.add_f32(many_name(kN / 2), {1}, &v); }, {"duplicate tensor '" + many_name(kN / 2) + "'"});
  const std::string path = make_test_dir() + "/written.safetensors";
  w.write(path);
  const SafetensorsFile f(path);
  ASSERT_EQ(f.tensors().size(), kN);
  EXPECT_EQ(*static_cast<const float*>(f.find(many_name(kN - 1))->data), 1.5f);
}

TEST(MappedFile, MapsAndMoves) {
  const std::string dir = make_test_dir();
  write_bytes(dir + "/f.bin", "hello");
  MappedFile m(dir + "/f.bin");
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(std::memcmp(m.data(), "hello", 5), 0);
  EXPECT_EQ(m.path(), dir + "/f.bin");
  MappedFile m2(std::move(m));
  EXPECT_EQ(m2.size(), 5u);
  EXPECT_EQ(std::memcmp(m2.data(), "hello", 5), 0);
  MappedFile m3;
  m3 = std::move(m2);
  EXPECT_EQ(std::memcmp(m3.data(), "hello", 5), 0);

  write_bytes(dir + "/empty.bin", "");
  MappedFile e(dir + "/empty.bin");
  EXPECT_EQ(e.size(), 0u);
  EXPECT_TRUE(e.empty());

  expect_error([&] { MappedFile x(dir + "/missing.bin"); },
               {dir + "/missing.bin", std::strerror(ENOENT)});
  expect_error([&] { MappedFile x(dir); }, {dir});
}

}  // namespace
}  // namespace nextn
