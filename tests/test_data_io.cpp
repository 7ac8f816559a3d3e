// File formats: safetensors, IDX (MNIST) and llm.c token shards. Reference files are built byte by byte
// from the format specs here, independently of the writers under test.
#include "file_size_limit.h"
#include "temp_dir.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/tensor.h"
#include "memtrain/data/idx.h"
#include "memtrain/data/token_shard.h"
#include "memtrain/io/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using namespace memtrain;

namespace {

using memtrain::test_support::FileSizeLimit;
using memtrain::test_support::TempDir;

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::string tensor_bytes(const Tensor& t) {
  return {static_cast<const char*>(t.data_ptr()), t.nbytes()};
}

// Runs fn, expects a memtrain::Error whose message contains every fragment.
void expect_error(const std::function<void()>& fn, std::initializer_list<std::string> fragments) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown; expected one containing '" << *fragments.begin() << "'";
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
  }
}

// ---- safetensors ----------------------------------------------------------------------------------

// A file from the spec: 8-byte little-endian length, the header as given, then the data bytes.
std::string safetensors_file(const std::string& header, const std::string& data) {
  std::string out;
  std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xFF));
  return out + header + data;
}

// Deterministic bytes; for bool only 0/1 are meaningful values.
Tensor patterned(const Shape& shape, DType dtype, unsigned seed) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* p = static_cast<unsigned char*>(t.data_ptr());
  unsigned x = seed * 2654435761u + 1;
  for (std::size_t i = 0; i < t.nbytes(); ++i) {
    x = x * 1664525u + 1013904223u;
    p[i] = static_cast<unsigned char>(dtype == DType::boolean ? (x >> 20) & 1 : x >> 24);
  }
  return t;
}

TEST(SafeTensors, RoundTripEveryDTypeBitExact) {
  TempDir dir;
  const std::vector<DType> dtypes = {DType::f64, DType::f32,  DType::f16, DType::bf16, DType::f8_e4m3, DType::f8_e5m2,
                                     DType::i8,  DType::u8,   DType::i32, DType::i64,  DType::boolean};
  std::vector<std::pair<std::string, Tensor>> in;
  std::size_t total = 0;
  for (std::size_t i = 0; i < dtypes.size(); ++i) {
    Shape shape = i % 3 == 0 ? Shape{7} : i % 3 == 1 ? Shape{2, 3, 5} : Shape{4, 9};
    in.emplace_back("t" + std::to_string(i), patterned(shape, dtypes[i], static_cast<unsigned>(i)));
    total += in.back().second.nbytes();
  }
  in.emplace_back("scalar", patterned({}, DType::f32, 99));
  in.emplace_back("empty", Tensor::empty({0, 3}, DType::f32));
  total += 4;
  const std::string path = dir.file("all.safetensors");
  io::save_safetensors(path, in);

  // Layout from the spec: header length is a multiple of 8, data follows it with nothing after.
  std::string raw = read_bytes(path);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(raw[static_cast<std::size_t>(i)]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(raw.size(), 8 + n + total);

  auto out = io::load_safetensors(path);
  ASSERT_EQ(out.size(), in.size());
  for (const auto& [name, t] : in) {
    ASSERT_TRUE(out.count(name)) << name;
    const Tensor& u = out.at(name);
    EXPECT_EQ(u.dtype(), t.dtype()) << name;
    EXPECT_EQ(u.shape(), t.shape()) << name;
    EXPECT_EQ(tensor_bytes(u), tensor_bytes(t)) << name;
  }
  EXPECT_EQ(dir.entries().size(), 1u);  // no temp file left behind
}

TEST(SafeTensors, NonContiguousTensorIsSavedInLogicalOrder) {
  TempDir dir;
  Tensor a = tensor<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  io::save_safetensors(dir.file("t.safetensors"), {{"at", a.t()}});
  Tensor u = io::load_safetensors(dir.file("t.safetensors")).at("at");
  ASSERT_EQ(u.shape(), (Shape{3, 2}));
  const float want[] = {1, 4, 2, 5, 3, 6};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(u.data<float>()[i], want[i]) << i;
}

TEST(SafeTensors, MetadataRoundTrip) {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"step", "1200"}, {"note", "quote \" and \\"}};
  io::save_safetensors(path, {{"w", patterned({3}, DType::f32, 1)}}, meta);
  EXPECT_EQ(io::load_safetensors_metadata(path), meta);
  auto out = io::load_safetensors(path);
  EXPECT_EQ(out.size(), 1u);
  EXPECT_EQ(out.count("__metadata__"), 0u);
  io::save_safetensors(path, {{"w", patterned({3}, DType::f32, 1)}});
  EXPECT_TRUE(io::load_safetensors_metadata(path).empty());
}

TEST(SafeTensors, ReadsFileBuiltFromTheSpec) {
  TempDir dir;
  // Written the way Python's safetensors would: metadata first, offsets relative to the data section.
  std::string header =
      R"({"__metadata__":{"format":"pt"},)"
      R"("b":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)"
      R"("a":{"dtype":"F32","shape":[2,2],"data_offsets":[16,32]},)"
      R"("h":{"dtype":"BF16","shape":[3],"data_offsets":[32,38]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  const unsigned char data[] = {
      0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,  // i64 -1
      0x2c, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // i64 300
      0x00, 0x00, 0x80, 0x3f,                          // f32 1.0
      0x00, 0x00, 0x20, 0xc0,                          // f32 -2.5
      0x00, 0x00, 0x00, 0x3f,                          // f32 0.5
      0x00, 0x00, 0x40, 0x40,                          // f32 3.0
      0x80, 0x3f, 0x00, 0xc0, 0x20, 0x3e,              // bf16 1.0, -2.0, 0.15625
  };
  const std::string path = dir.file("ref.safetensors");
  write_bytes(path, safetensors_file(header, std::string(reinterpret_cast<const char*>(data), sizeof(data))));

  auto out = io::load_safetensors(path);
  ASSERT_EQ(out.size(), 3u);
  const Tensor& b = out.at("b");
  EXPECT_EQ(b.dtype(), DType::i64);
  EXPECT_EQ(b.data<std::int64_t>()[0], -1);
  EXPECT_EQ(b.data<std::int64_t>()[1], 300);
  const Tensor& a = out.at("a");
  EXPECT_EQ(a.shape(), (Shape{2, 2}));
  const float af[] = {1.0f, -2.5f, 0.5f, 3.0f};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(a.data<float>()[i], af[i]);
  Tensor h = out.at("h").to(DType::f32);
  EXPECT_EQ(out.at("h").dtype(), DType::bf16);
  EXPECT_EQ(h.data<float>()[0], 1.0f);
  EXPECT_EQ(h.data<float>()[1], -2.0f);
  EXPECT_EQ(h.data<float>()[2], 0.15625f);
  EXPECT_EQ(io::load_safetensors_metadata(path).at("format"), "pt");
}

TEST(SafeTensors, WriterBytesMatchTheSpec) {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  io::save_safetensors(path, {{"a", tensor<float>({1.0f, -2.5f}, {2})}, {"n", tensor<std::int32_t>({-2}, {1})}},
                       {{"format", "pt"}});
  std::string header =
      R"({"__metadata__":{"format":"pt"},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("n":{"dtype":"I32","shape":[1],"data_offsets":[8,12]}})";
  header.append((8 - header.size() % 8) % 8, ' ');  // the reference pads the header with spaces to 8 bytes
  const unsigned char data[] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x20, 0xc0, 0xfe, 0xff, 0xff, 0xff};
  EXPECT_EQ(read_bytes(path), safetensors_file(header, std::string(reinterpret_cast<const char*>(data), 12)));
}

TEST(SafeTensors, LoadAllocatesUnderCurrentCategory) {
  TempDir dir;
  const std::string path = dir.file("c.safetensors");
  io::save_safetensors(path, {{"x", patterned({100}, DType::f32, 3)}, {"y", patterned({10}, DType::f64, 4)}});
  CategoryGuard guard(MemoryCategory::parameters);
  const std::size_t before = memory_stats()[MemoryCategory::parameters].live_bytes;
  auto out = io::load_safetensors(path);
  EXPECT_EQ(memory_stats()[MemoryCategory::parameters].live_bytes - before, 400u + 80u);
}

TEST(SafeTensors, BadInputNamesFileAndProblem) {
  TempDir dir;
  const std::string p = dir.file("bad.safetensors");
  auto load = [&] { io::load_safetensors(p); };
  const std::string f32x2 = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";

  expect_error([&] { io::load_safetensors(dir.file("missing.safetensors")); }, {"missing.safetensors", "cannot open"});

  write_bytes(p, "abc");
  expect_error(load, {p, "3 bytes", "too short", "offset 0"});

  std::string big = safetensors_file(f32x2, std::string(8, '\0'));
  big[0] = static_cast<char>(0xff);  // claims a 255-byte header... plus the real length's high bytes
  big[1] = static_cast<char>(0x7f);
  write_bytes(p, big);
  expect_error(load, {p, "header length 32767", "exceeds"});

  write_bytes(p, safetensors_file(R"({"w": {"dtype": )", ""));
  expect_error(load, {p, "does not parse", "offset"});

  write_bytes(p, safetensors_file("[1, 2]", ""));
  expect_error(load, {p, "array", "expected an object"});

  write_bytes(p, safetensors_file(R"({"w":{"dtype":"F128","shape":[2],"data_offsets":[0,8]}})", std::string(8, 0)));
  expect_error(load, {p, "tensor 'w'", "unknown dtype \"F128\""});

  write_bytes(p, safetensors_file(R"({"w":{"shape":[2],"data_offsets":[0,8]}})", std::string(8, 0)));
  expect_error(load, {p, "tensor 'w'", "\"dtype\""});

  write_bytes(p, safetensors_file(f32x2, std::string(6, 0)));
  expect_error(load, {p, "tensor 'w'", "[0, 8]", "past the data section of 6 bytes"});

  write_bytes(p, safetensors_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, 0)));
  expect_error(load, {p, "tensor 'w'", "hold 8 bytes", "[3]", "3 x 4"});

  write_bytes(p, safetensors_file(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", std::string(8, 0)));
  expect_error(load, {p, "tensor 'w'", "non-negative"});

  write_bytes(p, safetensors_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", std::string(8, 0)));
  expect_error(load, {p, "tensor 'w'", "end before they begin"});

  write_bytes(p, safetensors_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", std::string(8, 0)));
  expect_error(load, {p, "tensor 'w'", "data_offsets"});

  write_bytes(p, safetensors_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                  R"("b":{"dtype":"I32","shape":[2],"data_offsets":[4,12]}})",
                                  std::string(12, 0)));
  expect_error(load, {p, "overlap", "'a'", "'b'"});

  write_bytes(p, safetensors_file(R"({"__metadata__":{"step":12}})", ""));
  expect_error([&] { io::load_safetensors_metadata(p); }, {p, "metadata \"step\"", "expected a string"});
}

TEST(SafeTensors, SaveRejectsBadNames) {
  TempDir dir;
  const std::string p = dir.file("s.safetensors");
  Tensor x = patterned({2}, DType::f32, 5);
  expect_error([&] { io::save_safetensors(p, {{"x", x}, {"x", x}}); }, {p, "'x' appears twice"});
  expect_error([&] { io::save_safetensors(p, {{"__metadata__", x}}); }, {p, "invalid tensor name"});
  expect_error([&] { io::save_safetensors(p, {{"u", Tensor()}}); }, {p, "'u' is undefined"});
  expect_error([&] { io::save_safetensors(dir.file("no/such/dir/x.safetensors"), {{"x", x}}); },
               {"no/such/dir/x.safetensors", "cannot create temp file"});
  EXPECT_TRUE(dir.entries().empty());
}

TEST(SafeTensors, FailedSaveLeavesOldFileIntact) {
  TempDir dir;
  const std::string p = dir.file("keep.safetensors");
  Tensor old = patterned({16}, DType::f32, 7);
  io::save_safetensors(p, {{"old", old}});
  const std::string old_bytes = read_bytes(p);
  {
    // The new file needs ~64 KiB: preallocating it fails before any byte is written, naming what it needs.
    FileSizeLimit limit(4096);
    expect_error([&] { io::save_safetensors(p, {{"new", patterned({16384}, DType::f32, 8)}}); },
                 {p, "needs 65", "bytes on disk", "File too large", "bytes free on"});
  }
  EXPECT_EQ(read_bytes(p), old_bytes);
  EXPECT_EQ(tensor_bytes(io::load_safetensors(p).at("old")), tensor_bytes(old));
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"keep.safetensors"});  // temp removed
}

TEST(SafeTensors, SaveIntoReadOnlyDirectoryFailsCleanly) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions (covered by FailedSaveLeavesOldFileIntact)";
  TempDir dir;
  const std::string p = dir.file("ro.safetensors");
  io::save_safetensors(p, {{"old", patterned({4}, DType::f32, 9)}});
  const std::string old_bytes = read_bytes(p);
  fs::permissions(dir.path(), fs::perms::owner_read | fs::perms::owner_exec);
  expect_error([&] { io::save_safetensors(p, {{"new", patterned({4}, DType::f32, 10)}}); }, {p, "cannot create"});
  fs::permissions(dir.path(), fs::perms::owner_all);
  EXPECT_EQ(read_bytes(p), old_bytes);
}

// ---- IDX --------------------------------------------------------------------------------------------

std::string idx_bytes(unsigned char type, const std::vector<std::uint32_t>& dims, const std::string& data) {
  std::string out = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  for (auto d : dims)
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>((d >> s) & 0xFF));
  return out + data;
}

std::string counting_bytes(std::size_t n) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 7 + 3) % 256);
  return s;
}

void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

TEST(Idx, RawImagesRoundTrip) {
  TempDir dir;
  const std::string p = dir.file("train-images-idx3-ubyte");
  const std::string data = counting_bytes(3 * 4 * 5);
  write_bytes(p, idx_bytes(0x08, {3, 4, 5}, data));
  const std::size_t before = memory_stats()[MemoryCategory::data].live_bytes;
  Tensor t = data::read_idx(p);
  EXPECT_EQ(memory_stats()[MemoryCategory::data].live_bytes - before, 60u);
  EXPECT_EQ(t.dtype(), DType::u8);
  EXPECT_EQ(t.shape(), (Shape{3, 4, 5}));
  EXPECT_EQ(tensor_bytes(t), data);
}

TEST(Idx, GzipLabelsAndImagesRoundTrip) {
  TempDir dir;
  const std::string labels = counting_bytes(10);
  write_gz(dir.file("l.gz"), idx_bytes(0x08, {10}, labels));
  Tensor l = data::read_idx(dir.file("l.gz"));
  EXPECT_EQ(l.shape(), (Shape{10}));
  EXPECT_EQ(tensor_bytes(l), labels);
  const std::string images = counting_bytes(50 * 28 * 28);
  write_gz(dir.file("i.gz"), idx_bytes(0x08, {50, 28, 28}, images));
  EXPECT_LT(fs::file_size(dir.file("i.gz")), images.size());  // really compressed
  Tensor i = data::read_idx(dir.file("i.gz"));
  EXPECT_EQ(i.shape(), (Shape{50, 28, 28}));
  EXPECT_EQ(tensor_bytes(i), images);
}

TEST(Idx, BadInputNamesFileAndOffset) {
  TempDir dir;
  const std::string p = dir.file("bad-idx");
  auto read = [&] { data::read_idx(p); };
  const std::string good = idx_bytes(0x08, {2, 3, 3}, counting_bytes(18));

  expect_error([&] { data::read_idx(dir.file("nope")); }, {"nope", "cannot open"});

  write_bytes(p, good.substr(0, good.size() - 5));
  expect_error(read, {p, "truncated", "18 data bytes from offset 16", "ends at offset 29"});

  write_bytes(p, good.substr(0, 10));
  expect_error(read, {p, "truncated", "dimension 1 of 3", "offset 8"});

  write_bytes(p, good.substr(0, 2));
  expect_error(read, {p, "truncated", "magic"});

  std::string magic = good;
  magic[0] = 0x12;
  magic[1] = 0x34;
  write_bytes(p, magic);
  expect_error(read, {p, "bad magic 0x12340803", "offset 0"});

  write_bytes(p, idx_bytes(0x0D, {2}, std::string(8, 0)));
  expect_error(read, {p, "type code 0x0D", "offset 2"});

  write_bytes(p, good + "xy");
  expect_error(read, {p, "unexpected bytes", "offset 34"});

  // A gzip file cut short: the data ends early in the decompressed stream.
  write_gz(dir.file("t.gz"), idx_bytes(0x08, {100, 28, 28}, counting_bytes(100 * 28 * 28)));
  std::string gz = read_bytes(dir.file("t.gz"));
  write_bytes(dir.file("t.gz"), gz.substr(0, gz.size() / 2));
  expect_error([&] { data::read_idx(dir.file("t.gz")); }, {"t.gz", "offset"});
}

// ---- token shards -------------------------------------------------------------------------------------

// A shard from the spec: magic 20240520 = 0x0134D888, little-endian.
std::string shard_bytes(std::int32_t magic, std::int32_t version, std::int32_t count,
                        const std::vector<std::uint16_t>& tokens) {
  std::string out(1024, '\0');
  auto put = [&](std::size_t at, std::uint32_t v) {
    for (int i = 0; i < 4; ++i) out[at + static_cast<std::size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xFF);
  };
  put(0, static_cast<std::uint32_t>(magic));
  put(4, static_cast<std::uint32_t>(version));
  put(8, static_cast<std::uint32_t>(count));
  for (auto t : tokens) {
    out.push_back(static_cast<char>(t & 0xFF));
    out.push_back(static_cast<char>(t >> 8));
  }
  return out;
}

std::vector<std::uint16_t> some_tokens(std::size_t n) {
  std::vector<std::uint16_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint16_t>((i * 40503u + 11u) % 50257u);
  return v;
}

TEST(TokenShard, WriteThenMapRoundTrip) {
  TempDir dir;
  const std::string p = dir.file("shard_000.bin");
  const auto tokens = some_tokens(1000);
  data::write_token_shard(p, tokens);
  // The writer's bytes match the spec built by hand.
  EXPECT_EQ(read_bytes(p), shard_bytes(20240520, 1, 1000, tokens));
  const std::string raw = read_bytes(p);
  EXPECT_EQ(static_cast<unsigned char>(raw[0]), 0x88);
  EXPECT_EQ(static_cast<unsigned char>(raw[3]), 0x01);

  data::TokenShard s(p);
  ASSERT_EQ(s.size(), 1000u);
  for (std::size_t i = 0; i < tokens.size(); ++i) ASSERT_EQ(s.tokens()[i], tokens[i]) << i;
  EXPECT_NO_THROW(s.check_vocab(50257));
  EXPECT_EQ(dir.entries().size(), 1u);
}

TEST(TokenShard, MapsHandBuiltShardAndMoves) {
  TempDir dir;
  const std::string p = dir.file("hand.bin");
  write_bytes(p, shard_bytes(20240520, 1, 4, {0, 1, 65535, 256}));
  data::TokenShard s(p);
  EXPECT_EQ(s.size(), 4u);
  EXPECT_EQ(s[2], 65535);
  EXPECT_EQ(s[3], 256);
  const std::uint16_t* ptr = s.tokens();
  data::TokenShard moved(std::move(s));
  EXPECT_EQ(moved.tokens(), ptr);
  EXPECT_EQ(moved.size(), 4u);
  EXPECT_EQ(s.size(), 0u);  // NOLINT(bugprone-use-after-move): a moved-from shard is empty

  write_bytes(dir.file("empty.bin"), shard_bytes(20240520, 1, 0, {}));
  data::TokenShard e(dir.file("empty.bin"));
  EXPECT_EQ(e.size(), 0u);
}

TEST(TokenShard, BadInputNamesFileOffsetAndValues) {
  TempDir dir;
  const std::string p = dir.file("bad.bin");
  auto open = [&] { data::TokenShard s(p); };

  expect_error([&] { data::TokenShard s(dir.file("none.bin")); }, {"none.bin", "cannot open"});

  write_bytes(p, std::string(100, '\0'));
  expect_error(open, {p, "truncated", "100 bytes", "1024-byte header"});

  std::string full = shard_bytes(20240520, 1, 5, {1, 2, 3, 4, 5});
  write_bytes(p, full.substr(0, full.size() - 2));
  expect_error(open, {p, "truncated", "token count 5 at offset 8", "1034 bytes", "1032 bytes"});

  write_bytes(p, full + "zz");
  expect_error(open, {p, "trailing", "1036 bytes"});

  write_bytes(p, shard_bytes(12345, 1, 5, {1, 2, 3, 4, 5}));
  expect_error(open, {p, "bad magic 12345 at offset 0", "20240520"});

  write_bytes(p, shard_bytes(20240520, 2, 5, {1, 2, 3, 4, 5}));
  expect_error(open, {p, "version 2 at offset 4"});

  write_bytes(p, shard_bytes(20240520, 1, -3, {}));
  expect_error(open, {p, "negative token count -3"});
}

TEST(TokenShard, CheckVocabReportsFirstOutOfRangeToken) {
  TempDir dir;
  const std::string p = dir.file("v.bin");
  data::write_token_shard(p, {5, 50256, 50257, 3, 60000});
  data::TokenShard s(p);
  expect_error([&] { s.check_vocab(50257); }, {p, "token 50257 at index 2", "offset 1028", "vocab size 50257"});
  expect_error([&] { s.check_vocab(50000); }, {"token 50256 at index 1", "offset 1026"});
  EXPECT_NO_THROW(s.check_vocab(60001));
}

TEST(TokenShard, FailedWriteLeavesOldShardIntact) {
  TempDir dir;
  const std::string p = dir.file("keep.bin");
  data::write_token_shard(p, some_tokens(10));
  const std::string old_bytes = read_bytes(p);
  {
    FileSizeLimit limit(2048);  // not preallocated: the write fails part way through
    expect_error([&] { data::write_token_shard(p, some_tokens(100000)); },
                 {p, "write failed", "needs at least", "bytes free on"});
  }
  EXPECT_EQ(read_bytes(p), old_bytes);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"keep.bin"});
  EXPECT_EQ(data::TokenShard(p).size(), 10u);
}

}  // namespace
